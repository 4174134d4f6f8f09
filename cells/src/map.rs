//! The cell map file (ADR 0017 §1): its TOML and JSON forms, parsed into a validated [`CellMap`]
//! in which every partition has exactly one known cell. The text is given by the caller (the
//! binary reads the file); a map that parses is a map that can be served.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::partition::{Partition, PARTITIONS};
use crate::CellId;

/// The forms a cell map is written in, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapFormat {
    Toml,
    Json,
}

impl MapFormat {
    /// `.toml` or `.json`; anything else is refused rather than guessed.
    pub fn of_path(path: &Path) -> Result<Self, MapError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Ok(Self::Toml),
            Some("json") => Ok(Self::Json),
            _ => Err(MapError::UnknownFormat(path.to_path_buf())),
        }
    }
}

/// Where a cell's spot-core is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpotAddress {
    /// `HOST:PORT` of a running spot-core.
    At(String),
    /// `"start"`: `ledger up` starts one as a child process.
    Start,
}

/// What kind of process a cell's member is (ADR 0020).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
pub enum MemberKind {
    /// A PostgreSQL node under Patroni.
    #[serde(rename = "postgres")]
    Postgres,
    /// A spot-core replica.
    #[serde(rename = "spot-core")]
    SpotCore,
}

impl MemberKind {
    /// `postgres` or `spot-core`, as the map, the cells view and `failovers.kind` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::SpotCore => "spot-core",
        }
    }
}

/// One process of a cell under HA, as the map names it (ADR 0017 §1, ADR 0020): for the
/// operators' cells view (`GET /api/v1/admin/cells`), which asks each one its role.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemberSpec {
    pub kind: MemberKind,
    /// Its name (Patroni's node name, spot-core's `--replica` name).
    pub name: String,
    /// PostgreSQL: `host:port` of its server; spot-core: its client `host:port`.
    pub address: String,
    /// PostgreSQL: its Patroni REST URL (`http://host:8008`); spot-core: its replication
    /// address. Optional; without it a PostgreSQL member's role is read from the URL's
    /// `patroni` parameter for the same host, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
}

/// One cell as the map names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellSpec {
    pub id: CellId,
    /// The cell's PostgreSQL, multi-host as `DATABASE_URL`.
    pub database_url: String,
    pub spot: SpotAddress,
    /// The file holding this cell's spot-core token; `None`: the process's `SPOT_CORE_TOKEN`.
    pub spot_token_file: Option<PathBuf>,
    /// Its processes under HA (`members`), for the cells view; empty when the map names none
    /// (the view then reads them from the database URL's hosts and the spot addresses).
    pub members: Vec<MemberSpec>,
}

/// A validated cell map: its cells in ascending id order, and each partition's cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellMap {
    cells: Vec<CellSpec>,
    owners: Vec<CellId>,
}

/// Why a cell map is refused; each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("a cell map must be a .toml or a .json file: {0}")]
    UnknownFormat(PathBuf),
    #[error("the cell map is not valid TOML for its schema: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("the cell map is not valid JSON for its schema: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the cell map says partitions = {0}; this ledger hashes users onto {PARTITIONS}")]
    PartitionCount(u64),
    #[error("the cell map names no cell")]
    NoCells,
    #[error("cell id {0} is out of range (1 to 65535)")]
    CellIdOutOfRange(u64),
    #[error("cell {0} is named twice")]
    DuplicateCell(CellId),
    #[error("cell {0} has no database_url")]
    NoDatabaseUrl(CellId),
    #[error("cell {0} has no spot address")]
    NoSpot(CellId),
    #[error("cells {0} and {1} name the same database_url")]
    SharedDatabase(CellId, CellId),
    #[error("cells {0} and {1} name the same spot-core")]
    SharedSpot(CellId, CellId),
    #[error("cell {cell}: {text:?} is not a partition or a range A-B of partitions 0 to 255")]
    BadPartitions { cell: CellId, text: String },
    #[error("partition {partition} is assigned to both cell {first} and cell {second}")]
    PartitionTwice {
        partition: Partition,
        first: CellId,
        second: CellId,
    },
    #[error("partition {0} is assigned to no cell")]
    PartitionUnassigned(Partition),
    #[error("cell {cell}: member {name:?}: {why}")]
    BadMember {
        cell: CellId,
        name: String,
        why: &'static str,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMap {
    partitions: u64,
    cells: Vec<RawCell>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCell {
    id: u64,
    database_url: String,
    spot: String,
    #[serde(default)]
    spot_token_file: Option<PathBuf>,
    partitions: Vec<String>,
    #[serde(default)]
    members: Vec<MemberSpec>,
}

impl CellMap {
    /// Parses and validates a map written in `format`.
    pub fn parse(text: &str, format: MapFormat) -> Result<Self, MapError> {
        let raw: RawMap = match format {
            MapFormat::Toml => toml::from_str(text)?,
            MapFormat::Json => serde_json::from_str(text)?,
        };
        Self::validated(raw)
    }

    /// Its cells, ascending by id.
    pub fn cells(&self) -> &[CellSpec] {
        &self.cells
    }

    /// The cell named `id`, if the map has it.
    pub fn cell(&self, id: CellId) -> Option<&CellSpec> {
        self.cells.iter().find(|c| c.id == id)
    }

    /// The cell that owns `partition`.
    pub fn owner(&self, partition: Partition) -> CellId {
        self.owners[usize::from(partition.get())]
    }

    /// This map's cells with the owners `stored` names instead (the cells' stored map, newer
    /// than the file once a partition moved: ADR 0023 §1); `None` when `stored` does not name
    /// every partition once, each to a cell of this map.
    pub fn with_owners(&self, stored: &[(Partition, CellId)]) -> Option<Self> {
        let mut owners = vec![None; usize::from(PARTITIONS)];
        for (p, cell) in stored {
            let slot = owners.get_mut(usize::from(p.get()))?;
            if slot.is_some() || self.cell(*cell).is_none() {
                return None;
            }
            *slot = Some(*cell);
        }
        Some(Self {
            cells: self.cells.clone(),
            owners: owners.into_iter().collect::<Option<Vec<_>>>()?,
        })
    }

    /// This map with `added` beside its cells (cells added while a deployment served, as
    /// the cells store them: ADR 0023 §1). Each is checked as a file's cell is, against the
    /// cells before it; an id the map already has is left as the map says. The owners stay
    /// the file's: an added cell gets partitions only by moves, which the stored map names.
    pub fn with_added(&self, added: &[CellSpec]) -> Result<Self, MapError> {
        let mut cells = self.cells.clone();
        for spec in added {
            if self.cell(spec.id).is_some() {
                continue;
            }
            let raw = RawCell {
                id: u64::from(spec.id.get()),
                database_url: spec.database_url.clone(),
                spot: match &spec.spot {
                    SpotAddress::Start => "start".to_owned(),
                    SpotAddress::At(addr) => addr.clone(),
                },
                spot_token_file: spec.spot_token_file.clone(),
                partitions: Vec::new(),
                members: spec.members.clone(),
            };
            cells.push(checked_cell(&raw, &cells)?);
        }
        cells.sort_by_key(|c| c.id);
        Ok(Self {
            cells,
            owners: self.owners.clone(),
        })
    }

    /// Every partition with its cell, in partition order.
    pub fn assignments(&self) -> impl Iterator<Item = (Partition, CellId)> + '_ {
        Partition::all().map(|p| (p, self.owner(p)))
    }

    fn validated(raw: RawMap) -> Result<Self, MapError> {
        if raw.partitions != u64::from(PARTITIONS) {
            return Err(MapError::PartitionCount(raw.partitions));
        }
        if raw.cells.is_empty() {
            return Err(MapError::NoCells);
        }
        let mut owners: BTreeMap<Partition, CellId> = BTreeMap::new();
        let mut cells: Vec<CellSpec> = Vec::with_capacity(raw.cells.len());
        for rc in raw.cells {
            let spec = checked_cell(&rc, &cells)?;
            for text in &rc.partitions {
                for partition in parse_partitions(spec.id, text)? {
                    if let Some(first) = owners.insert(partition, spec.id) {
                        return Err(MapError::PartitionTwice {
                            partition,
                            first,
                            second: spec.id,
                        });
                    }
                }
            }
            cells.push(spec);
        }
        if let Some(missing) = Partition::all().find(|p| !owners.contains_key(p)) {
            return Err(MapError::PartitionUnassigned(missing));
        }
        cells.sort_by_key(|c| c.id);
        Ok(Self {
            cells,
            owners: owners.into_values().collect(),
        })
    }
}

/// One cell of the file, checked on its own and against the cells before it.
fn checked_cell(rc: &RawCell, before: &[CellSpec]) -> Result<CellSpec, MapError> {
    let id = CellId::new(rc.id).ok_or(MapError::CellIdOutOfRange(rc.id))?;
    let database_url = rc.database_url.trim().to_owned();
    let spot = rc.spot.trim();
    if database_url.is_empty() {
        return Err(MapError::NoDatabaseUrl(id));
    }
    if spot.is_empty() {
        return Err(MapError::NoSpot(id));
    }
    let spot = match spot {
        "start" => SpotAddress::Start,
        addr => SpotAddress::At(addr.to_owned()),
    };
    for other in before {
        if other.id == id {
            return Err(MapError::DuplicateCell(id));
        }
        if other.database_url == database_url {
            return Err(MapError::SharedDatabase(other.id, id));
        }
        if spot != SpotAddress::Start && other.spot == spot {
            return Err(MapError::SharedSpot(other.id, id));
        }
    }
    Ok(CellSpec {
        id,
        database_url,
        spot,
        spot_token_file: rc.spot_token_file.clone(),
        members: checked_members(id, &rc.members)?,
    })
}

/// A cell's members: each named and addressed, no name twice for one kind.
fn checked_members(cell: CellId, members: &[MemberSpec]) -> Result<Vec<MemberSpec>, MapError> {
    let mut out: Vec<MemberSpec> = Vec::with_capacity(members.len());
    for m in members {
        let bad = |why| MapError::BadMember {
            cell,
            name: m.name.clone(),
            why,
        };
        let m = MemberSpec {
            kind: m.kind,
            name: m.name.trim().to_owned(),
            address: m.address.trim().to_owned(),
            control: m
                .control
                .as_deref()
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned),
        };
        if m.name.is_empty() {
            return Err(bad("has no name"));
        }
        if m.address.is_empty() || !m.address.contains(':') {
            return Err(bad("needs an address host:port"));
        }
        if out.iter().any(|o| o.kind == m.kind && o.name == m.name) {
            return Err(bad("is named twice"));
        }
        out.push(m);
    }
    Ok(out)
}

/// `"N"` or an inclusive range `"A-B"`, in bounds and with `A <= B`.
fn parse_partitions(cell: CellId, text: &str) -> Result<Vec<Partition>, MapError> {
    let bad = || MapError::BadPartitions {
        cell,
        text: text.to_owned(),
    };
    let one = |s: &str| {
        s.trim()
            .parse::<u64>()
            .ok()
            .and_then(Partition::new)
            .ok_or_else(bad)
    };
    let (from, to) = match text.split_once('-') {
        Some((a, b)) => (one(a)?, one(b)?),
        None => (one(text)?, one(text)?),
    };
    if from > to {
        return Err(bad());
    }
    Ok((from.get()..=to.get()).map(Partition).collect())
}

#[cfg(test)]
mod tests;
