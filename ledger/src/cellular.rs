//! Starting a process that serves several cells (ADR 0017): `ledger serve --cell-map FILE` and
//! `ledger up --cells N` (or `up --cell-map FILE` with `spot = "start"` cells). This is start-up
//! and wiring only; what routes each request to its cell and merges what spans cells is the
//! `front` crate.
//!
//! - `connect.rs`: reaching a cell (its pool and spot-core, its identity checked); a cell
//!   refused for what it is stops start-up, one that does not answer is served later.
//! - `moving.rs`: the partition moves' runner over every reached cell, the front's move routes
//!   and the worker that drives every move not ended.
//! - `watch.rs`: per cell, the whole of today's core and router over its own pool and
//!   spot-core with its own background tasks (the projector, the recovery worker, the
//!   conservation check and its halt, the asset reloader, the vacuum, the idempotency horizon,
//!   the tamper-evident log's follower signing as the cell), installed in the cell's
//!   `front::slot`; then a watcher that keeps retrying a cell not reached, probes a reached one
//!   and marks it down or up, and keeps its assets equal to the home cell's.
//! - here: the map `up --cells N` runs, the cells reached at start-up, the front
//!   (`front::Front`, with the merged feed `front::feed` and the external_id claims
//!   `front::claims`) served until a signal, and the banners. `--nats` relays each cell's feed
//!   to a stream of its own (`<stream>_<cell>`, its checkpoint and leader lock in that cell's
//!   database).

pub mod adding;
pub mod connect;
pub mod moving;
pub mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use cells::{CellId, CellMap, MapFormat, Partition, Placement, SpotAddress};

use domain::UserId;
use tokio::net::TcpListener;

use crate::config::{self, JwtSecret};
use crate::serve::{bind_metrics, ServeArgs, UpArgs};
use crate::settings::{MetricsListen, Settings};
use crate::spot_child::{child_exit, stored_or_generated_spot_token, SpotChild};
use crate::startup::shutdown_signal;
use connect::{ConnectError, Reach};
use front::map::LiveMap;
use front::slot::{CellSlot, Slots};
use front::{claims, feed, Front};
use watch::{Reached, Shared};

pub use connect::{cell_database_url, UP_CELLS_MAX};

/// `ledger serve` under a cell map.
pub(crate) async fn serve(
    args: ServeArgs,
    settings: &Settings,
    map: &CellMap,
) -> anyhow::Result<()> {
    let secret = settings.secrets.jwt.clone().with_context(|| {
        format!(
            "`ledger serve` needs {} (shared by every instance)",
            config::JWT_SECRET_ENV
        )
    })?;
    let assets = config::load_assets(args.assets.as_deref())?;
    let (map, additions) = adding::with_added_cells(settings, map.clone()).await?;
    let map = &map;
    let reach = Reach::new(settings, map, args.spot_timeout.0, BTreeMap::new());
    let mut started = start_cells(map, reach, assets, secret, args.relay.config()).await?;
    started.additions = additions;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let metrics = bind_metrics(&settings.http.metrics).await?;
    println!(
        "ledger serving on http://{local} ({} cells: {})",
        map.cells().len(),
        describe_cells(map, &started.shared.slots)
    );
    run(listener, metrics, started, settings, Vec::new(), None).await
}

/// `ledger up` with cells: `--cells N` on the local PostgreSQL, or `--cell-map FILE`; every
/// cell whose spot is `"start"` gets a spot-core child of its own.
pub(crate) async fn up(args: UpArgs, settings: &Settings, map: CellMap) -> anyhow::Result<()> {
    let assets = config::load_assets(args.assets.as_deref())?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let secret = config::secret_for_data_dir(settings.secrets.jwt.clone(), &args.data_dir)?;
    // One key in the data dir; each cell signs with its own identity derived from it.
    let settings = &crate::log_cli::with_data_dir_key(settings, &args.data_dir)?;
    // The cells added while an earlier run served are started and served as the file's are.
    let (map, additions) = adding::with_added_cells(settings, map).await?;
    let mut children = Vec::new();
    let mut started = BTreeMap::new();
    for spec in map.cells().iter().filter(|c| c.spot == SpotAddress::Start) {
        let token_file = args.data_dir.join(format!("spot-cell{}.token", spec.id));
        let token = stored_or_generated_spot_token(&token_file)?;
        let child = SpotChild::start(
            &args.data_dir.join(format!("spot-cell{}", spec.id)),
            args.assets.as_deref(),
            &token_file,
            &args.spot_storage,
            Some(spec.id.get()),
        )
        .await
        .with_context(|| format!("cell {}: start its spot-core", spec.id))?;
        started.insert(spec.id, (child.addr.clone(), Some(token)));
        children.push(child);
    }
    let reach = Reach::new(settings, &map, args.spot_timeout.0, started);
    let banner_secret = secret.clone();
    let mut started = start_cells(&map, reach, assets, secret, args.relay.config()).await?;
    started.additions = additions;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let metrics = bind_metrics(&settings.http.metrics).await?;
    print_up_banner(
        &format!("http://{local}"),
        &map,
        &started.shared.slots,
        &banner_secret,
    );
    let up = adding::UpPlace {
        data_dir: args.data_dir.clone(),
        assets: args.assets.clone(),
        storage: args.spot_storage.clone(),
    };
    run(listener, metrics, started, settings, children, Some(up)).await
}

/// The cell map `ledger up` runs, if any: `--cells N`'s ([`local_map`]) or the settings' own.
pub(crate) fn up_map(cells: Option<u16>, settings: &Settings) -> anyhow::Result<Option<CellMap>> {
    match (cells, &settings.cells) {
        (Some(_), Some(_)) => bail!("give either --cells or a cell map, not both"),
        (Some(n), None) => local_map(&settings.database.url, n).map(Some),
        (None, map) => Ok(map.clone()),
    }
}

/// The map `ledger up --cells N` runs: N cells on the server of `DATABASE_URL`, databases named
/// `<default name>_cell<i>`, each with a spot-core child, the partitions split evenly in order.
pub fn local_map(database_url: &str, count: u16) -> anyhow::Result<CellMap> {
    if !(1..=UP_CELLS_MAX).contains(&count) {
        bail!("--cells must be from 1 to {UP_CELLS_MAX}, not {count}");
    }
    let n = usize::from(count);
    let mut cells = Vec::with_capacity(n);
    for i in 0..n {
        let (from, to) = (i * 256 / n, (i + 1) * 256 / n - 1);
        cells.push(serde_json::json!({
            "id": i + 1,
            "database_url": cell_database_url(database_url, i + 1)?,
            "spot": "start",
            "partitions": [format!("{from}-{to}")],
        }));
    }
    let text = serde_json::json!({ "partitions": 256, "cells": cells }).to_string();
    CellMap::parse(&text, MapFormat::Json).context("the generated cell map")
}

/// Each cell's id and whether it serves now, for the banner.
fn describe_cells(map: &CellMap, slots: &Slots) -> String {
    let each: Vec<String> = map
        .cells()
        .iter()
        .map(|c| {
            let state = if slots.get(&c.id).is_some_and(|s| s.is_up()) {
                "up"
            } else {
                "down, retried in the background"
            };
            let spot = match &c.spot {
                SpotAddress::At(addr) => addr.clone(),
                SpotAddress::Start => "a child".to_owned(),
            };
            format!("cell {} spot-core {spot} ({state})", c.id)
        })
        .collect();
    each.join(", ")
}

/// Every cell's place behind the front, the cells reached at start-up and the front itself.
struct Started {
    shared: Arc<Shared>,
    reached: BTreeMap<CellId, Reached>,
    map: CellMap,
    /// The additions found at start-up, finished in every cell that lacks one.
    additions: adding::Additions,
}

/// Reaches every cell it can (ADR 0017 §11): the home cell first (where assets are
/// authoritative, so the others catch up with it as they are reached), then every other cell
/// at once. A cell refused for what it is (another cell's database or engine, a map that
/// differs) stops start-up; one that does not answer is left down, and its watcher reaches it
/// later.
async fn start_cells(
    map: &CellMap,
    reach: Reach,
    assets: domain::AssetRegistry,
    secret: JwtSecret,
    relay: Option<relay::RelayConfig>,
) -> anyhow::Result<Started> {
    let in_flight_max = reach.settings.http.cell_in_flight_max(map.cells().len());
    let slots = Slots::new(
        map.cells()
            .iter()
            .map(|c| Arc::new(CellSlot::new(c.id, in_flight_max))),
    );
    let shared = Arc::new(Shared {
        reach,
        assets,
        secret,
        slots,
        // The file's map is version 1 (ADR 0023 §1); a newer stored one is loaded by the first
        // probe that reads it, or by the first write a cell's fence refuses.
        map: Arc::new(LiveMap::new(Placement::of_map(map), 1)),
        relay,
    });
    let home = shared.home();
    let (first, rest): (Vec<_>, Vec<_>) = map.cells().iter().partition(|c| c.id == home);
    let mut reached = BTreeMap::new();
    for batch in [first, rest] {
        let attempts = batch.iter().map(|spec| watch::reach(&shared, spec));
        let results = futures_util::future::join_all(attempts).await;
        for (spec, result) in batch.iter().zip(results) {
            match result {
                Ok((served, parts)) => {
                    shared
                        .slots
                        .get(&spec.id)
                        .expect("a slot per cell")
                        .install(served);
                    reached.insert(spec.id, parts);
                }
                Err(ConnectError::Refused(e)) => return Err(e),
                Err(ConnectError::Unreachable(e)) => {
                    tracing::error!(cell = %spec.id, error = %format!("{e:#}"), "cell unreachable at start-up: the other cells serve, this one is retried in the background");
                }
            }
        }
    }
    // A map that moves changed is stored in the cells with a higher version than the file's:
    // route by it from the first request.
    shared.map.reload_from(&shared.slots).await;
    Ok(Started {
        shared,
        reached,
        map: map.clone(),
        additions: Vec::new(),
    })
}

/// Serves every cell behind the front router until ctrl-c or SIGTERM (or a background task or
/// a spot-core child ends), then stops in order, as one cell's `run_until_stopped` does. `up`:
/// where `ledger up` starts a cell added meanwhile (`adding.rs`).
async fn run(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    started: Started,
    settings: &Settings,
    children: Vec<SpotChild>,
    up: Option<adding::UpPlace>,
) -> anyhow::Result<()> {
    let (stop_watchers, stopping) = tokio::sync::watch::channel(false);
    let (exits_tx, mut exits) = tokio::sync::mpsc::unbounded_channel::<String>();
    let added = adding::AddedTasks::default();
    let front = serving_front(&started, settings, up, (&stopping, &exits_tx, &added));
    let Started {
        shared,
        reached,
        map,
        ..
    } = started;
    let watchers = spawn_watchers(&shared, &map, reached, &stopping, &exits_tx);
    let http = settings.http.limits;
    let metrics = metrics.map(|l| serve_metrics(l, front.clone(), http));
    let mut children: Vec<Option<SpotChild>> = children.into_iter().map(Some).collect();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(edge::http_server::serve(
        listener,
        front.router(),
        http,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let outcome = tokio::select! {
        () = shutdown_signal() => Ok(()),
        ended = &mut server => Err(anyhow!("the API server stopped: {ended:?}")),
        Some(name) = exits.recv() => Err(anyhow!("background task {name} stopped")),
        status = first_child_exit(&mut children) => {
            Err(anyhow!("a cell's spot-core exited unexpectedly ({status})"))
        }
    };
    let _ = stop_tx.send(());
    if tokio::time::timeout(config::SHUTDOWN_GRACE, &mut server)
        .await
        .is_err()
    {
        server.abort();
    }
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    let _ = stop_watchers.send(true);
    let added: Vec<_> = std::mem::take(&mut *added.lock().unwrap_or_else(|e| e.into_inner()));
    for watcher in watchers.into_iter().chain(added) {
        let _ = watcher.await;
    }
    for child in children.into_iter().flatten() {
        child.stop().await;
    }
    outcome
}

/// The front over every cell of `started`: the merged feed, the external_id claims, the move
/// routes and worker (`moving.rs`) and the addition of a cell (`adding.rs`, its watcher and
/// child told to stop by `stopping`, reporting on `exits`, awaited from `added`).
fn serving_front(
    started: &Started,
    settings: &Settings,
    up: Option<adding::UpPlace>,
    (stopping, exits, added): (
        &tokio::sync::watch::Receiver<bool>,
        &tokio::sync::mpsc::UnboundedSender<String>,
        &adding::AddedTasks,
    ),
) -> Front {
    let shared = &started.shared;
    // The claims stay where the file puts them: a move does not carry an external_id's claim.
    let claims = claims::Claims::new(Placement::of_map(&started.map), shared.slots.clone());
    let front = Front::new(
        Arc::clone(&shared.map),
        shared.slots.clone(),
        &shared.secret.bytes,
        settings.limits.bulk_max,
        claims,
        settings.http.metrics == MetricsListen::Api,
    )
    .with_feed(feed::router(
        feed::CellFeeds::new(shared.slots.clone(), &shared.secret.bytes),
        settings.http.limits,
    ));
    let (desk, move_cells) = moving::start(&started.reached, settings.failpoints);
    move_cells.complete(started.additions.clone());
    let adder = adding::Adder {
        shared: Arc::clone(shared),
        up,
        moves: move_cells,
        map: tokio::sync::Mutex::new(started.map.clone()),
        stopping: stopping.clone(),
        exits: exits.clone(),
        tasks: Arc::clone(added),
        failpoints: settings.failpoints,
    };
    front.with_moves(desk).with_adder(Arc::new(adder))
}

/// A watcher per cell of `map` (`watch.rs`), each given the parts of its cell reached at
/// start-up.
fn spawn_watchers(
    shared: &Arc<Shared>,
    map: &CellMap,
    mut reached: BTreeMap<CellId, Reached>,
    stopping: &tokio::sync::watch::Receiver<bool>,
    exits: &tokio::sync::mpsc::UnboundedSender<String>,
) -> Vec<tokio::task::JoinHandle<()>> {
    map.cells()
        .iter()
        .map(|spec| {
            tokio::spawn(watch::run(
                Arc::clone(shared),
                spec.clone(),
                reached.remove(&spec.id),
                stopping.clone(),
                exits.clone(),
            ))
        })
        .collect()
}

/// `/metrics` of every cell (`views.rs`) on its own listener.
fn serve_metrics(
    listener: TcpListener,
    front: Front,
    http: edge::http_server::HttpLimits,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let app = front.metrics_router();
    tokio::spawn(edge::http_server::serve(
        listener,
        app,
        http,
        std::future::pending(),
    ))
}

async fn first_child_exit(children: &mut [Option<SpotChild>]) -> String {
    if children.is_empty() {
        return std::future::pending().await;
    }
    let waits = children.iter_mut().map(|c| Box::pin(child_exit(c)));
    futures_util::future::select_all(waits).await.0
}

/// `ledger up`'s banner with cells: the usual one, then where users land.
fn print_up_banner(base: &str, map: &CellMap, slots: &Slots, secret: &JwtSecret) {
    crate::serve::print_banner(&crate::serve::Banner {
        base: base.to_owned(),
        metrics: "every cell's, with a `cell` label (see above)".to_owned(),
        database: map
            .cells()
            .iter()
            .map(|c| format!("cell {}: {}", c.id, config::redact_url(&c.database_url)))
            .collect::<Vec<_>>()
            .join("; "),
        spot: describe_cells(map, slots),
        secret,
    });
    println!();
    print!("{}", placement_report(map));
}

/// Which partitions each cell owns and where the first users land.
pub fn placement_report(map: &CellMap) -> String {
    let placement = Placement::of_map(map);
    let mut out = String::from("cells:\n");
    for cell in map.cells() {
        let owned: Vec<u8> = map
            .assignments()
            .filter(|(_, c)| *c == cell.id)
            .map(|(p, _)| p.get())
            .collect();
        out.push_str(&format!("  cell {}: {} partitions\n", cell.id, owned.len()));
    }
    out.push_str("users 1 to 10 land in:\n");
    for raw in 1..=10u64 {
        let user = UserId::new(raw).expect("1 to 10 are user ids");
        let partition: Partition = cells::partition_of(user);
        let cell: CellId = placement.cell_of(user);
        out.push_str(&format!(
            "  user {raw} → cell {cell} (partition {partition})\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use front::slot::{Refusal, Served};

    /// A reached cell's parts as `watch.rs` installs them, never connected: the slot only
    /// hands them out.
    fn served() -> Served {
        // Never connected: the slot only hands it out.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("a lazy pool");
        let registry = Arc::new(std::sync::RwLock::new(domain::AssetRegistry::default()));
        Served {
            reads: crate::wiring::read_side(&pool),
            app: axum::Router::new(),
            metrics: axum::Router::new(),
            assets: application::AssetSettings::new(
                std::sync::Arc::new(adapters::pg::assets::PgAssets::new(pool.clone())),
                registry,
            ),
            halt: Arc::new(adapters::pg::halt::PgHalt::new(pool.clone())),
            claims: Arc::new(adapters::pg::external_claims::PgExternalClaims::new(
                pool.clone(),
            )),
            map: Arc::new(adapters::pg::cell_map::PgCellMap::new(pool)),
        }
    }

    #[tokio::test]
    async fn a_cell_takes_nothing_while_down_and_at_most_its_share_while_up() {
        let slot = CellSlot::new(CellId::new(2).unwrap(), 2);
        assert!(matches!(slot.admit(), Err(Refusal::Down)));
        assert_eq!(slot.describe()["state"], "down");
        slot.install(served());
        let first = slot.admit().ok().expect("up");
        let second = slot.admit().ok().expect("its second slot");
        assert!(matches!(slot.admit(), Err(Refusal::Saturated)));
        drop(first);
        let third = slot.admit().ok().expect("a slot freed");
        drop((second, third));
        assert!(slot.set_down(), "it was up");
        assert!(matches!(slot.admit(), Err(Refusal::Down)));
        assert!(slot.describe()["down_since"].is_string());
        slot.set_up();
        assert!(slot.admit().is_ok());
        let answer = front::slot::refused(slot.id, &Refusal::Down);
        assert_eq!(answer.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.headers()[axum::http::header::RETRY_AFTER], "1");
    }

    #[test]
    fn up_cells_names_a_database_per_cell_and_splits_the_partitions() {
        let map = local_map("postgres://postgres@127.0.0.1:5432/ledger", 3).unwrap();
        let urls: Vec<&str> = map
            .cells()
            .iter()
            .map(|c| c.database_url.as_str())
            .collect();
        assert_eq!(
            urls,
            [
                "postgres://postgres@127.0.0.1:5432/ledger_cell1",
                "postgres://postgres@127.0.0.1:5432/ledger_cell2",
                "postgres://postgres@127.0.0.1:5432/ledger_cell3",
            ]
        );
        assert!(map.cells().iter().all(|c| c.spot == SpotAddress::Start));
        let owner = |p: u64| map.owner(Partition::new(p).unwrap()).get();
        assert_eq!((owner(0), owner(84), owner(85)), (1, 1, 2));
        assert_eq!((owner(169), owner(170), owner(255)), (2, 3, 3));
        assert!(local_map("postgres://h/ledger", 0).is_err());
        assert!(local_map("postgres://h/ledger", UP_CELLS_MAX + 1).is_err());
    }

    #[test]
    fn a_cell_database_keeps_the_query() {
        assert_eq!(
            cell_database_url("postgres://u:p@h/db?sslmode=disable", 2).unwrap(),
            "postgres://u:p@h/db_cell2?sslmode=disable"
        );
        assert!(cell_database_url("postgres://h", 1).is_err());
    }

    #[test]
    fn the_report_says_where_users_land() {
        let map = local_map("postgres://h/ledger", 3).unwrap();
        let report = placement_report(&map);
        // User 1 hashes to partition 225 (ADR 0017's vectors), which the third cell owns.
        assert!(
            report.contains("user 1 → cell 3 (partition 225)"),
            "{report}"
        );
        assert!(report.contains("cell 1: 85 partitions"), "{report}");
    }
}
