//! Reaching every cell of a cell map at start-up (ADR 0017 §3, §7): each cell's database
//! (created if missing, migrated, its pool sized so every cell on one server fits its
//! connection budget) with its stored identity established or checked, and its spot-core client
//! naming the cell at `hello`, with the cell's own token when the map gives one.

use std::collections::BTreeMap;
use std::time::Duration;

use adapters::SpotAdapter;
use anyhow::{anyhow, Context};
use cells::{CellId, CellMap, CellSpec, Placement, SpotAddress};
use sqlx::PgPool;

use crate::config::{self, POOL_CONNECTIONS_MAX};
use crate::settings::Settings;

/// Connections PostgreSQL allows (`max_connections` here) less those kept for superusers,
/// migrations and operators: what the ledger processes on one server may hold together.
const SERVER_CONNECTIONS_FOR_LEDGERS: u32 = 90;

/// Ledger processes one server's budget leaves room for.
const PROCESSES_PER_SERVER: u32 = 2;

/// The most cells `ledger up --cells` starts on one machine.
pub const UP_CELLS_MAX: u16 = 16;

/// `postgres://…/ledger?x` → `postgres://…/ledger_cell2?x`.
pub fn cell_database_url(url: &str, cell: usize) -> anyhow::Result<String> {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (server, name) = base
        .rsplit_once('/')
        .filter(|(server, name)| {
            server.contains("://") && !name.is_empty() && !server.ends_with('/')
        })
        .ok_or_else(|| {
            anyhow!(
                "DATABASE_URL names no database: {}",
                config::redact_url(url)
            )
        })?;
    let mut out = format!("{server}/{name}_cell{cell}");
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    Ok(out)
}

/// One reachable cell: its id, its pool and its spot-core.
#[derive(Clone)]
pub struct CellLink {
    pub id: CellId,
    pub pool: PgPool,
    pub spot: SpotAdapter,
    /// The spot-core address, for the banner.
    pub spot_addr: String,
}

/// The pool size of each cell (ADR 0017 §7): `min(16, 90 / (2 × cells on that server))`, a
/// server being the host list of the cell's `database_url`.
pub fn pool_sizes(map: &CellMap) -> BTreeMap<CellId, u32> {
    let server_of = |spec: &CellSpec| server_part(&spec.database_url).to_owned();
    let mut per_server: BTreeMap<String, u32> = BTreeMap::new();
    for spec in map.cells() {
        *per_server.entry(server_of(spec)).or_default() += 1;
    }
    map.cells()
        .iter()
        .map(|spec| {
            let sharing = per_server[&server_of(spec)];
            let share = SERVER_CONNECTIONS_FOR_LEDGERS / (PROCESSES_PER_SERVER * sharing);
            (spec.id, share.clamp(1, POOL_CONNECTIONS_MAX))
        })
        .collect()
}

/// The hosts and ports of a PostgreSQL URL: what lies between the credentials and the database.
fn server_part(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

/// Why a cell could not be connected: unreachable (retried in the background while the other
/// cells serve) or refused (a misconfiguration: another cell's database or engine, a wrong
/// token, a map that differs; start-up stops on it).
#[derive(Debug)]
pub enum ConnectError {
    Unreachable(anyhow::Error),
    Refused(anyhow::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(e) | Self::Refused(e) => write!(f, "{e:#}"),
        }
    }
}

/// What reaching one cell needs: the settings, the map's placement and pool sizes, and the
/// spot-core children `ledger up` started.
#[derive(Clone)]
pub struct Reach {
    pub settings: Settings,
    pub placement: Placement,
    pub sizes: BTreeMap<CellId, u32>,
    pub spot_timeout: Duration,
    pub started: BTreeMap<CellId, (String, Option<String>)>,
}

impl Reach {
    pub fn new(
        settings: &Settings,
        map: &CellMap,
        spot_timeout: Duration,
        started: BTreeMap<CellId, (String, Option<String>)>,
    ) -> Self {
        Self {
            settings: settings.clone(),
            placement: Placement::of_map(map),
            sizes: pool_sizes(map),
            spot_timeout,
            started,
        }
    }

    /// This reach with cell `id` too (a cell added while the process serves): its pool of
    /// `size` connections, and the spot-core child started for it, if any.
    pub fn with_cell(
        &self,
        id: CellId,
        size: u32,
        started: Option<(String, Option<String>)>,
    ) -> Self {
        let mut reach = self.clone();
        reach.sizes.insert(id, size);
        if let Some(started) = started {
            reach.started.insert(id, started);
        }
        reach
    }

    /// One cell of the map, connected and checked: a database that is another cell's, or whose
    /// stored map differs, is refused naming the cell (and the partition); so is a spot-core
    /// that says it is another cell. A database that does not answer is unreachable. A
    /// spot-core that does not answer yet is only a warning: transfers wait and the recovery
    /// worker retries, as with one cell.
    pub async fn connect(&self, spec: &CellSpec) -> Result<CellLink, ConnectError> {
        let database = config::redact_url(&spec.database_url);
        let pool = schema::prepare_with(
            &spec.database_url,
            self.sizes[&spec.id],
            self.settings.database.liveness,
        )
        .await
        .with_context(|| format!("cell {}: database {database}", spec.id))
        .map_err(ConnectError::Unreachable)?;
        match schema::cell_identity::establish(&pool, &database, spec.id, &self.placement).await {
            Ok(()) => {}
            Err(e @ schema::cell_identity::IdentityError::Database(_)) => {
                pool.close().await;
                return Err(ConnectError::Unreachable(
                    anyhow::Error::new(e).context(format!("cell {}: database {database}", spec.id)),
                ));
            }
            Err(e) => {
                pool.close().await;
                return Err(ConnectError::Refused(
                    anyhow::Error::new(e).context(format!("cell {} refused", spec.id)),
                ));
            }
        }
        // The map version this cell last accepted (ADR 0023 §1): every hello to its spot-core
        // names it, and an engine that has seen a newer one refuses this process (STALE_MAP).
        let map_version = match schema::cell_identity::map_version(&pool).await {
            Ok(version) => version,
            Err(e) => {
                pool.close().await;
                return Err(ConnectError::Unreachable(
                    anyhow::Error::new(e).context(format!("cell {}: database {database}", spec.id)),
                ));
            }
        };
        let (spot_addr, token) = match (&spec.spot, self.started.get(&spec.id)) {
            (_, Some((addr, token))) => (addr.clone(), token.clone()),
            (SpotAddress::At(addr), None) => (
                addr.clone(),
                cell_token(&self.settings, spec).map_err(ConnectError::Refused)?,
            ),
            (SpotAddress::Start, None) => {
                return Err(ConnectError::Refused(anyhow!(
                    "cell {}: spot = \"start\" is for `ledger up` only",
                    spec.id
                )))
            }
        };
        let spot = SpotAdapter::for_cell(
            spot_addr.clone(),
            self.spot_timeout,
            token,
            self.settings.spot_liveness,
            spec.id.get(),
        );
        if let Some(client) = spot.tcp_client() {
            client.set_map_version(map_version);
        }
        check_spot(&spot, spec.id, &spot_addr)
            .await
            .map_err(ConnectError::Refused)?;
        Ok(CellLink {
            id: spec.id,
            pool,
            spot,
            spot_addr,
        })
    }
}

/// The cell's own spot-core token (`spot_token_file`), else the process's `SPOT_CORE_TOKEN`.
fn cell_token(settings: &Settings, spec: &CellSpec) -> anyhow::Result<Option<String>> {
    match &spec.spot_token_file {
        None => Ok(settings.secrets.spot_core_token.clone()),
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!(
                    "cell {}: reading spot_token_file {}",
                    spec.id,
                    path.display()
                )
            })?;
            spot_core::checked_token(&text, &path.display().to_string()).map(Some)
        }
    }
}

/// A spot-core that refuses this cell's `hello` (another cell's engine, a wrong token, or a
/// newer cell map than this cell's database holds: STALE_MAP) stops start-up; one that does not
/// answer is a warning.
async fn check_spot(spot: &SpotAdapter, cell: CellId, addr: &str) -> anyhow::Result<()> {
    match spot.ping().await {
        Ok(()) => Ok(()),
        // The client's own wording for an engine that answered the hello with a refusal: the
        // answer came, so this is a misconfiguration, not an engine still starting.
        Err(e) if e.to_string().contains(spot_core::client::HELLO_REFUSED) => Err(anyhow!(
            "cell {cell}: the spot-core at {addr} refused this cell: {e}"
        )),
        Err(e) => {
            tracing::warn!(%cell, spot = %addr, error = %e, "spot-core does not answer yet");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cells::MapFormat;

    fn map(urls: &[&str]) -> CellMap {
        let n = urls.len();
        let cells: Vec<String> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let (from, to) = (i * 256 / n, (i + 1) * 256 / n - 1);
                format!(
                    r#"{{"id": {}, "database_url": "{url}", "spot": "s{i}", "partitions": ["{from}-{to}"]}}"#,
                    i + 1
                )
            })
            .collect();
        let text = format!(r#"{{"partitions": 256, "cells": [{}]}}"#, cells.join(","));
        CellMap::parse(&text, MapFormat::Json).unwrap()
    }

    #[test]
    fn cells_on_one_server_share_its_budget_and_alone_keep_todays_pool() {
        let one = map(&["postgres://u:p@h:5432/a"]);
        assert_eq!(pool_sizes(&one).into_values().collect::<Vec<_>>(), [16]);
        let three = map(&[
            "postgres://u:p@h:5432/a",
            "postgres://u:p@h:5432/b",
            "postgres://u@h:5432/c",
        ]);
        assert_eq!(
            pool_sizes(&three).into_values().collect::<Vec<_>>(),
            [15, 15, 15]
        );
        let apart = map(&["postgres://h1/a", "postgres://h2/a", "postgres://h3/a"]);
        assert_eq!(
            pool_sizes(&apart).into_values().collect::<Vec<_>>(),
            [16, 16, 16]
        );
    }

    #[test]
    fn the_server_is_the_host_list() {
        assert_eq!(
            server_part("postgres://u:p@h1:5432,h2:5432/db?x=1"),
            "h1:5432,h2:5432"
        );
        assert_eq!(server_part("postgres://h/db"), "h");
    }
}
