//! Reaching each cell and watching it for as long as the process serves (ADR 0017 §4, §11).
//!
//! One watcher per cell. Until the cell has been reached it retries, every
//! [`RETRY_INTERVAL`], what start-up does for a cell (its database prepared and its identity
//! checked, its spot-core greeted), then catches the cell's assets up with the home cell's,
//! wires the cell's core and router, starts its background tasks and lets the front send it
//! requests. From then on it probes the cell's database every [`PROBE_INTERVAL`] over a
//! connection of its own (never one a request could be holding): a probe that fails marks the
//! cell down, so the front answers its users 503 at once instead of letting them wait on a dead
//! pool; a probe that answers again brings it back, after the assets have caught up. Every
//! [`ASSET_SYNC_EVERY`] probes the watcher also lays the home cell's assets over the cell's (a
//! process that stopped between the home cell's write and the fan-out leaves no cell behind for
//! longer). Every `LEDGER_MAP_RELOAD_PROBES` probes (default every one; 0: never) the probe
//! reads the cell's stored map version instead of `SELECT 1`, and a version higher than the
//! front's makes the front reload the map (`front::map`, ADR 0023 §1) and the cell's spot-core
//! client name it in its next `hello`s. The watcher owns the
//! cell's background tasks: it stops them when the process stops and reports one that ends.

use std::sync::Arc;
use std::time::Duration;

use adapters::pg::cell_map::PgCellMap;
use anyhow::Context;
use application::cell_map::CellMapStore;
use cells::{CellId, CellSpec};
use tokio::sync::{mpsc, watch};

use super::connect::{ConnectError, Reach};
use crate::config::JwtSecret;
use crate::router::build_app;
use crate::serve::configured;
use crate::startup::Tasks;
use front::map::LiveMap;
use front::slot::{CellSlot, Served, Slots};

/// Time between two attempts to reach a cell not reached yet.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(2);

/// Time between two probes of a reached cell's database.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The longest a probe may take before the cell counts as down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Probes between two asset catch-ups of a cell that is up.
const ASSET_SYNC_EVERY: u32 = 5;

/// What every watcher shares.
pub struct Shared {
    pub reach: Reach,
    pub assets: domain::AssetRegistry,
    pub secret: JwtSecret,
    pub slots: Slots,
    /// The cell map the front routes by, reloaded when a probe finds a newer one.
    pub map: Arc<LiveMap>,
    /// `--nats`: each cell's feed is relayed to a stream of its own (`<stream>_<cell>`).
    pub relay: Option<relay::RelayConfig>,
}

impl Shared {
    /// The home cell (the lowest id): where assets are authoritative.
    pub fn home(&self) -> CellId {
        self.slots.home()
    }
}

/// A reached cell's running parts, owned by its watcher.
pub struct Reached {
    tasks: Tasks,
    /// One connection of its own to the cell's database, for the probe.
    probe: sqlx::PgPool,
    /// The cell's stored map read over the probe's connection.
    probe_map: PgCellMap,
    /// The cell's spot-core client, whose `hello` names the cell's stored map version.
    spot: adapters::SpotAdapter,
    /// The pool its requests use (sifted before the cell serves again).
    pool: sqlx::PgPool,
}

impl Reached {
    /// Stops the cell's background tasks (an addition that did not complete).
    pub async fn stop(self) {
        self.tasks.stop().await;
    }

    /// What a partition move reaches the cell by: its requests' pool and its spot-core.
    pub fn move_parts(&self) -> (sqlx::PgPool, adapters::SpotAdapter) {
        (self.pool.clone(), self.spot.clone())
    }
}

/// Reaches `spec`'s cell: connected and checked, its assets caught up with the home cell's,
/// its core wired and its background tasks started. The front may send it requests once
/// [`CellSlot::install`] has the answer.
pub async fn reach(shared: &Shared, spec: &CellSpec) -> Result<(Served, Reached), ConnectError> {
    reach_with(shared, &shared.reach, spec).await
}

/// [`reach`] through `with` (a cell added while the process serves: `adding.rs`).
pub async fn reach_with(
    shared: &Shared,
    with: &Reach,
    spec: &CellSpec,
) -> Result<(Served, Reached), ConnectError> {
    let link = with.connect(spec).await?;
    let spot = link.spot.clone();
    let settings = &shared.reach.settings;
    let (mut assembled, mut serving) = configured(
        settings,
        link.pool.clone(),
        link.spot,
        shared.assets.clone(),
        &shared.secret,
        shared.relay.as_ref().map(|r| r.for_cell(spec.id.get())),
        &spec.database_url,
    )
    .map_err(ConnectError::Refused)?;
    // One tree, origin and key per cell (ADR 0016): the cell's follower, its routes and
    // receipts name the cell.
    serving.background.log = crate::log_cli::of_cell(serving.background.log, spec.id.get())
        .map_err(ConnectError::Refused)?;
    // Its checkpoints on the cell's own subject of the checkpoint stream (ADR 0016 "Cells"),
    // where `ledger verify --cell N --from-stream` reads them back.
    serving.background.checkpoints = crate::log_cli::checkpoint_target(
        serving.background.relay.as_ref(),
        serving.background.log.as_ref(),
        Some(spec.id.get()),
    )
    .map_err(ConnectError::Refused)?;
    assembled.state.reads = assembled.state.reads.with_log_cell(spec.id.get());
    // The map's members of this cell under HA, for the cells view and the failovers' names.
    assembled.state.cluster.set_members(spec.members.clone());
    let assets = assembled.pieces.ledger.assets().clone();
    catch_up(shared, spec.id, &assets)
        .await
        .map_err(ConnectError::Unreachable)?;
    let probe = schema::connect_with(&spec.database_url, 1, settings.database.liveness)
        .await
        .map_err(ConnectError::Unreachable)?;
    let tasks = Tasks::start(&assembled.pieces, &serving.background)
        .await
        .with_context(|| format!("cell {}: start its background tasks", spec.id))
        .map_err(ConnectError::Unreachable)?;
    let served = Served {
        reads: assembled.state.reads.clone(),
        app: build_app(assembled.state.clone(), &serving),
        metrics: query_api::metrics::app(assembled.state, serving.target_pending_alert_after()),
        halt: Arc::new(adapters::pg::halt::PgHalt::new(link.pool.clone())),
        claims: Arc::new(adapters::pg::external_claims::PgExternalClaims::new(
            link.pool.clone(),
        )),
        assets,
        map: Arc::new(PgCellMap::new(link.pool.clone())),
    };
    let pool = link.pool;
    let probe_map = PgCellMap::new(probe.clone());
    Ok((
        served,
        Reached {
            tasks,
            probe,
            probe_map,
            spot,
            pool,
        },
    ))
}

/// Lays the home cell's stored assets over `cell`'s, when `cell` is not the home cell and the
/// home cell is up. With the home cell down the cell serves under the assets it has: no asset
/// change can be made meanwhile (the front refuses them), and the next catch-up runs once the
/// home cell is back.
pub async fn catch_up(
    shared: &Shared,
    cell: CellId,
    assets: &application::AssetSettings,
) -> anyhow::Result<()> {
    let home = shared.home();
    if cell == home {
        return Ok(());
    }
    let Some(home_served) = shared.slots.get(&home).and_then(|s| s.serving()) else {
        tracing::warn!(%cell, %home, "the home cell is down: this cell keeps its stored assets until it is back");
        return Ok(());
    };
    let written = assets
        .copy_from(home_served.assets.store().as_ref())
        .await
        .with_context(|| format!("cell {cell}: catch its assets up with cell {home}'s"))?;
    if written > 0 {
        tracing::info!(%cell, written, "asset settings caught up with the home cell");
    }
    Ok(())
}

/// Watches one cell until `stop` says the process stops: reaches it if `reached` is `None`,
/// probes it, catches its assets up, and reports on `exits` a background task of it that ends.
pub async fn run(
    shared: Arc<Shared>,
    spec: CellSpec,
    mut reached: Option<Reached>,
    mut stop: watch::Receiver<bool>,
    exits: mpsc::UnboundedSender<String>,
) {
    let Some(slot) = shared.slots.get(&spec.id) else {
        tracing::error!(cell = %spec.id, "no slot for the cell: it is not watched");
        return;
    };
    let mut probes = 0u32;
    let mut told = None;
    loop {
        let wait = if reached.is_some() {
            PROBE_INTERVAL
        } else {
            RETRY_INTERVAL
        };
        tokio::select! {
            _ = stop.changed() => break,
            name = first_exit(&mut reached) => {
                let _ = exits.send(format!("cell {}: {name}", spec.id));
            }
            () = tokio::time::sleep(wait) => {}
        }
        match &reached {
            None => {
                let attempt = tokio::select! {
                    _ = stop.changed() => break,
                    attempt = reach(&shared, &spec) => attempt,
                };
                match attempt {
                    Ok((served, parts)) => {
                        slot.install(served);
                        reached = Some(parts);
                        tracing::warn!(cell = %spec.id, "cell reached: it serves from now on");
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if told.as_ref() != Some(&text) {
                            tracing::warn!(cell = %spec.id, error = %text, "cell still unreachable; retrying");
                            told = Some(text);
                        }
                    }
                }
            }
            Some(parts) => {
                probes = probes.wrapping_add(1);
                watch_reached(&shared, &slot, parts, probes).await;
            }
        }
    }
    if let Some(parts) = reached {
        parts.tasks.stop().await;
    }
}

/// Whether the `probes`-th probe reads the stored map version (every `every`; 0: never).
fn reads_version(probes: u32, every: u32) -> bool {
    every != 0 && probes.is_multiple_of(every)
}

/// The probe: the cell's stored map version when `version` asks for it, else `SELECT 1`.
/// `None`: no answer in time; `Some(None)`: answered, the version not read.
async fn probe(parts: &Reached, version: bool) -> Option<Option<u64>> {
    if version {
        let read = tokio::time::timeout(PROBE_TIMEOUT, parts.probe_map.map_version()).await;
        return read.ok()?.ok().map(Some);
    }
    let answered =
        tokio::time::timeout(PROBE_TIMEOUT, sqlx::query("SELECT 1").execute(&parts.probe))
            .await
            .is_ok_and(|r| r.is_ok());
    answered.then_some(None)
}

/// One probe of a reached cell, and what follows from it.
async fn watch_reached(shared: &Shared, slot: &CellSlot, parts: &Reached, probes: u32) {
    let every = shared.reach.settings.background.map_reload_probes;
    let Some(version) = probe(parts, reads_version(probes, every)).await else {
        if slot.set_down() {
            tracing::error!(cell = %slot.id, "cell's database does not answer: its users are refused (503) until it does");
        }
        return;
    };
    if let Some(version) = version {
        // The engine's hello names the version the cell holds now, as at start-up
        // (`connect.rs`), so an engine a switch has told of it does not refuse this process.
        if let Some(client) = parts.spot.tcp_client() {
            if client.map_version().is_none_or(|held| version > held) {
                client.set_map_version(Some(version));
            }
        }
        if version > shared.map.version() {
            shared.map.reload_from(&shared.slots).await;
        }
    }
    let due = !slot.is_up() || probes.is_multiple_of(ASSET_SYNC_EVERY);
    if !due {
        return;
    }
    let Some(served) = slot.served() else {
        return;
    };
    match catch_up(shared, slot.id, &served.assets).await {
        Ok(()) if !slot.is_up() => {
            sift(&parts.pool).await;
            slot.set_up();
            tracing::warn!(cell = %slot.id, "cell's database answers again: it serves again");
        }
        Ok(()) => {}
        Err(e) => {
            tracing::warn!(cell = %slot.id, error = %format!("{e:#}"), "asset catch-up failed");
        }
    }
}

/// Before a cell that was down serves again: takes every idle connection of its pool at once,
/// so each is checked (`schema`'s acquire check) and the ones the outage broke are closed here
/// rather than handed to a request.
async fn sift(pool: &sqlx::PgPool) {
    let idle = pool.num_idle();
    let mut held = Vec::with_capacity(idle);
    for _ in 0..idle {
        match tokio::time::timeout(PROBE_TIMEOUT, pool.acquire()).await {
            Ok(Ok(conn)) => held.push(conn),
            _ => break,
        }
    }
    drop(held);
}

async fn first_exit(reached: &mut Option<Reached>) -> &'static str {
    match reached {
        Some(parts) => parts.tasks.first_exit().await,
        None => std::future::pending().await,
    }
}
