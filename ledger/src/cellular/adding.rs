//! `ledger cells add` in the serving process (ADR 0023 §1): a cell joins a running deployment.
//! [`Adder`] answers the front's `POST /api/v1/admin/cells` (`front::adding`): the next cell id,
//! its database (under `ledger up --cells N` one beside the others', created if missing; else
//! the one the request names), its spot-core (a child of `ledger up`, or the one named),
//! reached as start-up reaches a cell (`watch::reach_with`: identity, assets, core, background
//! tasks); then the map's next version naming it in every cell (`MoveCells::add`, under the
//! switches' lock); then its slot behind the front and a watcher of its own. It owns no
//! partition: moves give it some. One addition at a time; a failed one leaves nothing routed to
//! the cell and can be asked again.
//!
//! [`with_added_cells`]: at start-up, the cells that additions stored in the map file's cells
//! (`cell_cells`, migration 0032) join the file's map, so a restart from the old file (or
//! `ledger up --cells N` again) serves them too.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use adapters::pg::cell_add::AddedCell;
use anyhow::Context;
use async_trait::async_trait;
use cells::{CellId, CellMap, CellSpec, SpotAddress};
use front::adder::{AddRefusal, CellAdder, NewCell};
use front::slot::CellSlot;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::connect::{cell_database_url, pool_sizes, ConnectError, UP_CELLS_MAX};
use super::moving::MoveCells;
use super::watch::{self as watching, Shared};
use crate::config;
use crate::settings::options::SpotStorage;
use crate::settings::Settings;
use crate::spot_child::{child_exit, stored_or_generated_spot_token, SpotChild};

/// Where `ledger up` keeps what it starts: a new cell's spot-core child and its token go here.
#[derive(Debug, Clone)]
pub struct UpPlace {
    pub data_dir: PathBuf,
    pub assets: Option<PathBuf>,
    pub storage: SpotStorage,
}

/// The tasks an addition starts (the cell's watcher, its spot-core child's keeper), awaited
/// when the process stops.
pub type AddedTasks = Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>;

/// Adds cells to the running process.
pub struct Adder {
    pub shared: Arc<Shared>,
    pub up: Option<UpPlace>,
    pub moves: MoveCells,
    /// The cells served now (the file's and those added); held for the whole of an addition.
    pub map: tokio::sync::Mutex<CellMap>,
    pub stopping: watch::Receiver<bool>,
    pub exits: mpsc::UnboundedSender<String>,
    pub tasks: AddedTasks,
    pub failpoints: application::FailPoints,
}

#[async_trait]
impl CellAdder for Adder {
    async fn add(&self, asked: NewCell) -> Result<Value, AddRefusal> {
        let mut map = self.map.try_lock().map_err(|_| {
            AddRefusal::Conflict("another cell is being added; ask again when it is done".into())
        })?;
        let (spec, added) = self.spec(&map, &asked)?;
        let extended = map
            .with_added(std::slice::from_ref(&spec))
            .map_err(|e| AddRefusal::Invalid(e.to_string()))?;
        let child = self.start_spot(&spec).await?;
        let size = pool_sizes(&extended)[&spec.id];
        let started = child
            .as_ref()
            .map(|(c, token)| (c.addr.clone(), Some(token.clone())));
        let reach = self.shared.reach.with_cell(spec.id, size, started);
        let (served, parts) = watching::reach_with(&self.shared, &reach, &spec)
            .await
            .map_err(|e| match e {
                ConnectError::Refused(e) => AddRefusal::Conflict(format!("{e:#}")),
                ConnectError::Unreachable(e) => AddRefusal::Unavailable(format!("{e:#}")),
            })?;
        self.failpoints.hit(application::FailPoint::CellAddReached);
        let version = match self.moves.add(&added, &parts, self.failpoints).await {
            Ok(version) => version,
            Err(e) => {
                parts.stop().await;
                return Err(AddRefusal::Unavailable(format!(
                    "cell {}: the map naming it was not stored in every cell (ask again): {e}",
                    spec.id
                )));
            }
        };
        let in_flight = self
            .shared
            .reach
            .settings
            .http
            .cell_in_flight_max(extended.cells().len());
        let slot = Arc::new(CellSlot::new(spec.id, in_flight));
        slot.install(served);
        self.shared.slots.add(slot);
        let spot = child.as_ref().map_or_else(
            || describe_spot(&spec.spot),
            |(c, _)| format!("{} (a child)", c.addr),
        );
        self.keep(spec.clone(), parts, child.map(|(c, _)| c));
        *map = extended;
        tracing::warn!(cell = %spec.id, map_version = version, "cell added: it serves from now on and owns no partition until one is moved to it");
        Ok(json!({
            "cell": spec.id.get(),
            "map_version": version,
            "database": config::redact_url(&spec.database_url),
            "spot": spot,
            "state": "up",
            "partitions": 0,
        }))
    }
}

impl Adder {
    /// The new cell as asked: the next id, its database and spot-core.
    fn spec(&self, map: &CellMap, asked: &NewCell) -> Result<(CellSpec, AddedCell), AddRefusal> {
        let last = map.cells().iter().map(|c| c.id.get()).max().unwrap_or(0);
        let id = last
            .checked_add(1)
            .and_then(|n| CellId::new(n.into()))
            .ok_or_else(|| AddRefusal::Invalid("no cell id is left".into()))?;
        if self.up.is_some() && id.get() > UP_CELLS_MAX {
            return Err(AddRefusal::Invalid(format!(
                "`ledger up` runs at most {} cells on one machine",
                UP_CELLS_MAX
            )));
        }
        let url = match (&asked.database_url, &self.up) {
            (Some(url), _) => Some(url.trim().to_owned()),
            (None, Some(_)) => None,
            (None, None) => {
                return Err(AddRefusal::Invalid(
                    "name the new cell's database_url (only `ledger up --cells N` makes one)"
                        .into(),
                ))
            }
        };
        let spot = match (asked.spot.as_deref().map(str::trim), &self.up) {
            (Some("start") | None, Some(_)) => SpotAddress::Start,
            (Some("start"), None) => {
                return Err(AddRefusal::Invalid(
                    "spot = \"start\" is for `ledger up` only: name HOST:PORT".into(),
                ))
            }
            (Some(addr), _) if !addr.is_empty() => SpotAddress::At(addr.to_owned()),
            _ => {
                return Err(AddRefusal::Invalid(
                    "name the new cell's spot-core as HOST:PORT".into(),
                ))
            }
        };
        let database_url = match &url {
            Some(url) => url.clone(),
            None => {
                let base = &self.shared.reach.settings.database.url;
                cell_database_url(base, usize::from(id.get()))
                    .map_err(|e| AddRefusal::Invalid(e.to_string()))?
            }
        };
        let added = AddedCell {
            id,
            database_url: url,
            spot: match &spot {
                SpotAddress::Start => "start".to_owned(),
                SpotAddress::At(addr) => addr.clone(),
            },
            spot_token_file: asked.spot_token_file.clone(),
        };
        let spec = CellSpec {
            id,
            database_url,
            spot,
            spot_token_file: asked.spot_token_file.clone().map(PathBuf::from),
            members: Vec::new(),
        };
        Ok((spec, added))
    }

    /// The new cell's spot-core child and its token, when `ledger up` starts it.
    async fn start_spot(&self, spec: &CellSpec) -> Result<Option<(SpotChild, String)>, AddRefusal> {
        let (SpotAddress::Start, Some(up)) = (&spec.spot, &self.up) else {
            return Ok(None);
        };
        let token_file = up.data_dir.join(format!("spot-cell{}.token", spec.id));
        let token = stored_or_generated_spot_token(&token_file)
            .map_err(|e| AddRefusal::Unavailable(format!("{e:#}")))?;
        let child = SpotChild::start(
            &up.data_dir.join(format!("spot-cell{}", spec.id)),
            up.assets.as_deref(),
            &token_file,
            &up.storage,
            Some(spec.id.get()),
        )
        .await
        .map_err(|e| {
            AddRefusal::Unavailable(format!("cell {}: start its spot-core: {e:#}", spec.id))
        })?;
        Ok(Some((child, token)))
    }

    /// The new cell's watcher, and its spot-core child's keeper (its exit stops the process,
    /// as a file cell's child's does; the process's stop stops it).
    fn keep(&self, spec: CellSpec, parts: watching::Reached, child: Option<SpotChild>) {
        let id = spec.id;
        let watcher = tokio::spawn(watching::run(
            Arc::clone(&self.shared),
            spec,
            Some(parts),
            self.stopping.clone(),
            self.exits.clone(),
        ));
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.push(watcher);
        if let Some(child) = child {
            let (mut stop, exits) = (self.stopping.clone(), self.exits.clone());
            tasks.push(tokio::spawn(async move {
                let mut child = Some(child);
                tokio::select! {
                    _ = stop.changed() => {}
                    status = child_exit(&mut child) => {
                        let _ = exits.send(format!("cell {id}'s spot-core (exited: {status})"));
                        return;
                    }
                }
                if let Some(child) = child {
                    child.stop().await;
                }
            }));
        }
    }
}

fn describe_spot(spot: &SpotAddress) -> String {
    match spot {
        SpotAddress::At(addr) => addr.clone(),
        SpotAddress::Start => "a child".to_owned(),
    }
}

/// The longest start-up waits for one file cell's stored additions.
const ADDED_READ_MAX: Duration = Duration::from_secs(5);

/// The cells additions stored, as found at start-up: each with the map version that named it
/// (`MoveCells::complete` writes them into every cell that lacks one).
pub type Additions = Vec<(AddedCell, u64)>;

/// `map` with the cells that additions stored in its cells (`cell_cells`): read from every file
/// cell that answers (a cell that does not, or has no such table yet, adds nothing), their
/// union joined to the map, and the additions themselves. A cell stored without a database
/// URL is `ledger up`'s, beside the others on `settings`' server.
pub async fn with_added_cells(
    settings: &Settings,
    map: CellMap,
) -> anyhow::Result<(CellMap, Additions)> {
    let reads = map
        .cells()
        .iter()
        .map(|spec| tokio::time::timeout(ADDED_READ_MAX, stored_additions(settings, spec)));
    let mut added: Vec<(CellSpec, (AddedCell, u64))> = Vec::new();
    for read in futures_util::future::join_all(reads).await {
        let Ok(Ok(rows)) = read else { continue };
        for (spec, addition) in rows {
            if !added.iter().any(|(a, _)| a.id == spec.id) {
                added.push((spec, addition));
            }
        }
    }
    if added.is_empty() {
        return Ok((map, Vec::new()));
    }
    added.sort_by_key(|(c, _)| c.id);
    let ids: Vec<u16> = added.iter().map(|(c, _)| c.id.get()).collect();
    tracing::warn!(
        ?ids,
        "cells added while the deployment served join the map file's"
    );
    let (specs, additions): (Vec<CellSpec>, Additions) = added.into_iter().unzip();
    let map = map
        .with_added(&specs)
        .context("the cells stored as added do not fit the cell map")?;
    Ok((map, additions))
}

/// One file cell's stored additions.
async fn stored_additions(
    settings: &Settings,
    spec: &CellSpec,
) -> anyhow::Result<Vec<(CellSpec, (AddedCell, u64))>> {
    let pool = schema::connect_with(&spec.database_url, 1, settings.database.liveness).await?;
    let rows = schema::cell_identity::additions(&pool).await;
    pool.close().await;
    let mut out = Vec::new();
    for row in rows? {
        let database_url = match &row.database_url {
            Some(url) => url.clone(),
            None => cell_database_url(&settings.database.url, usize::from(row.id.get()))?,
        };
        let spec = CellSpec {
            id: row.id,
            database_url,
            spot: if row.spot == "start" {
                SpotAddress::Start
            } else {
                SpotAddress::At(row.spot.clone())
            },
            spot_token_file: row.spot_token_file.clone().map(PathBuf::from),
            members: Vec::new(),
        };
        let added = AddedCell {
            id: row.id,
            database_url: row.database_url,
            spot: row.spot,
            spot_token_file: row.spot_token_file,
        };
        out.push((spec, (added, row.map_version)));
    }
    Ok(out)
}
