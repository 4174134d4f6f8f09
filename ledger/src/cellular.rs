//! Serving several cells from one process (ADR 0017): `ledger serve --cell-map FILE` and
//! `ledger up --cells N` (or `up --cell-map FILE` with `spot = "start"` cells). Every cell is
//! reached and checked at start-up (`connect.rs`); each gets the whole of today's core and
//! router over its own pool and spot-core, and its own background tasks (the projector, the
//! recovery worker, the conservation check and its halt, the asset reloader, the vacuum, the
//! idempotency horizon, the tamper-evident log's follower signing as the cell); the front router sends each request to its user's cell (`front.rs`).
//! Not built yet: the relay per cell (refused with a map), the fan-out admin views and metrics
//! (the home cell's are served), the per-cell feed cursor, and serving while a cell is
//! unreachable (start-up waits for every cell). Deposits claim their external_id across cells
//! first (`claims.rs`).

pub mod claims;
pub mod connect;
pub mod front;

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context};
use cells::{CellId, CellMap, MapFormat, Partition, Placement, SpotAddress};

use domain::UserId;
use tokio::net::TcpListener;

use crate::config::{self, JwtSecret};
use crate::router::build_app;
use crate::serve::{bind_metrics, configured, ServeArgs, UpArgs};
use crate::settings::Settings;
use crate::spot_child::{child_exit, stored_or_generated_spot_token, SpotChild};
use crate::startup::{shutdown_signal, Serving, Tasks};
use connect::CellLink;
use front::Front;

/// The most cells `ledger up --cells` starts on one machine.
pub const UP_CELLS_MAX: u16 = 16;

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
    refuse_relay(args.relay.config().is_some())?;
    let assets = config::load_assets(args.assets.as_deref())?;
    let links = connect::connect_all(settings, map, args.spot_timeout.0, &BTreeMap::new()).await?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let metrics = bind_metrics(&settings.http.metrics).await?;
    println!(
        "ledger serving on http://{local} ({} cells: {})",
        links.len(),
        describe_links(&links)
    );
    let cells = Cells {
        placement: Placement::of_map(map),
        links,
        assets,
        secret,
    };
    run(listener, metrics, cells, settings, Vec::new()).await
}

/// `ledger up` with cells: `--cells N` on the local PostgreSQL, or `--cell-map FILE`; every
/// cell whose spot is `"start"` gets a spot-core child of its own.
pub(crate) async fn up(args: UpArgs, settings: &Settings, map: CellMap) -> anyhow::Result<()> {
    refuse_relay(args.relay.config().is_some())?;
    let assets = config::load_assets(args.assets.as_deref())?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let secret = config::secret_for_data_dir(settings.secrets.jwt.clone(), &args.data_dir)?;
    // One key in the data dir; each cell signs with its own identity derived from it.
    let settings = &crate::log_cli::with_data_dir_key(settings, &args.data_dir)?;
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
    let links = connect::connect_all(settings, &map, args.spot_timeout.0, &started).await?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let metrics = bind_metrics(&settings.http.metrics).await?;
    print_up_banner(&format!("http://{local}"), &map, &links, &secret);
    let cells = Cells {
        placement: Placement::of_map(&map),
        links,
        assets,
        secret,
    };
    run(listener, metrics, cells, settings, children).await
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

/// `postgres://…/ledger?x` → `postgres://…/ledger_cell2?x`.
fn cell_database_url(url: &str, cell: usize) -> anyhow::Result<String> {
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

fn refuse_relay(asked: bool) -> anyhow::Result<()> {
    if asked {
        bail!(
            "the relay per cell (one JetStream stream per cell, ADR 0017 §8) is not built yet; \
             run with a cell map and without --nats"
        );
    }
    Ok(())
}

/// Every cell a process serves, and what they share.
struct Cells {
    placement: Placement,
    links: Vec<CellLink>,
    assets: domain::AssetRegistry,
    secret: JwtSecret,
}

fn describe_links(links: &[CellLink]) -> String {
    let each: Vec<String> = links
        .iter()
        .map(|l| format!("cell {} spot-core {}", l.id, l.spot_addr))
        .collect();
    each.join(", ")
}

/// Every cell's core, router and background tasks, and the front router over them.
struct Started {
    front: axum::Router,
    tasks: Vec<Tasks>,
    /// The home cell's state: `/metrics` reports it until metrics carry a `cell` label.
    home_state: edge::state::AppState,
    serving: Serving,
}

/// Wires each cell's core and starts its background tasks (ADR 0017 §11: all of them per cell).
async fn start_cells(cells: Cells, settings: &Settings) -> anyhow::Result<Started> {
    let mut apps = BTreeMap::new();
    let mut tasks = Vec::new();
    let mut first = None;
    let pools = cells.links.iter().map(|l| (l.id, l.pool.clone())).collect();
    let claims = claims::Claims::new(cells.placement.clone(), pools);
    for link in cells.links {
        let (mut assembled, mut serving) = configured(
            settings,
            link.pool,
            link.spot,
            cells.assets.clone(),
            &cells.secret,
            None,
        )?;
        // One tree, origin and key per cell (ADR 0016): the cell's follower, its routes and
        // receipts name the cell.
        serving.background.log = crate::log_cli::of_cell(serving.background.log, link.id.get())?;
        assembled.state.reads = assembled.state.reads.with_log_cell(link.id.get());
        tasks.push(
            Tasks::start(&assembled.pieces, &serving.background)
                .await
                .with_context(|| format!("cell {}: start its background tasks", link.id))?,
        );
        apps.insert(link.id, build_app(assembled.state.clone(), &serving));
        first.get_or_insert((assembled.state, serving));
    }
    let (home_state, serving) = first.context("a cell map names at least one cell")?;
    let front = Front::new(
        cells.placement,
        apps,
        &cells.secret.bytes,
        settings.limits.bulk_max,
        claims,
    );
    Ok(Started {
        front: front.router(),
        tasks,
        home_state,
        serving,
    })
}

/// Serves every cell behind the front router until ctrl-c or SIGTERM (or a background task or
/// a spot-core child ends), then stops in order, as one cell's `run_until_stopped` does.
async fn run(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    cells: Cells,
    settings: &Settings,
    children: Vec<SpotChild>,
) -> anyhow::Result<()> {
    let Started {
        front,
        mut tasks,
        home_state,
        serving,
    } = start_cells(cells, settings).await?;
    let metrics = metrics.map(|l| {
        let app = query_api::metrics::app(home_state, serving.target_pending_alert_after());
        tokio::spawn(edge::http_server::serve(
            l,
            app,
            serving.http,
            std::future::pending(),
        ))
    });
    let mut children: Vec<Option<SpotChild>> = children.into_iter().map(Some).collect();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(edge::http_server::serve(
        listener,
        front,
        serving.http,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let outcome = tokio::select! {
        () = shutdown_signal() => Ok(()),
        ended = &mut server => Err(anyhow!("the API server stopped: {ended:?}")),
        name = first_task_exit(&mut tasks) => Err(anyhow!("background task {name} stopped")),
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
    for t in tasks {
        t.stop().await;
    }
    for child in children.into_iter().flatten() {
        child.stop().await;
    }
    outcome
}

async fn first_task_exit(tasks: &mut [Tasks]) -> &'static str {
    let waits = tasks.iter_mut().map(|t| Box::pin(t.first_exit()));
    futures_util::future::select_all(waits).await.0
}

async fn first_child_exit(children: &mut [Option<SpotChild>]) -> String {
    if children.is_empty() {
        return std::future::pending().await;
    }
    let waits = children.iter_mut().map(|c| Box::pin(child_exit(c)));
    futures_util::future::select_all(waits).await.0
}

/// `ledger up`'s banner with cells: the usual one, then where users land.
fn print_up_banner(base: &str, map: &CellMap, links: &[CellLink], secret: &JwtSecret) {
    crate::serve::print_banner(&crate::serve::Banner {
        base: base.to_owned(),
        metrics: "the home cell's (see above)".to_owned(),
        database: map
            .cells()
            .iter()
            .map(|c| format!("cell {}: {}", c.id, config::redact_url(&c.database_url)))
            .collect::<Vec<_>>()
            .join("; "),
        spot: describe_links(links),
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
