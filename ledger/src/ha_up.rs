//! `ledger up --ha` (docs/adr/0020-high-availability.md): the cell's processes under HA on this
//! machine, started by the `ha` crate as children (an etcd cluster of three, PostgreSQL under
//! Patroni, three spot-core replicas), watched by its supervisor (what exits is started again,
//! `<data-dir>/members.json` rewritten every second), and the ledger serving against them: its
//! pool follows Patroni's leader, its spot-core client the replica that leads the highest epoch.
//! Everything stops with `up`.

use std::sync::Arc;
use std::time::Duration;

use adapters::SpotAdapter;
use anyhow::Context;

use crate::config;
use crate::serve::{serve_up, up_prelude, UpArgs, UpStack};
use crate::settings::Settings;
use crate::spot_child::{stored_or_generated_spot_token, SPOT_TOKEN_FILE};

/// The database every cell under HA serves from, on its Patroni cluster.
pub const HA_DATABASE: &str = "ledger";

/// The options a cell's processes start with, from `up`'s arguments.
pub(crate) fn cell_options(
    args: &UpArgs,
    cell: u16,
    token: &str,
) -> anyhow::Result<ha::cell::CellOptions> {
    let exe = std::env::current_exe().context("locate the ledger executable")?;
    let spot_bin = exe.with_file_name("spot-core");
    anyhow::ensure!(
        spot_bin.is_file(),
        "`ledger up --ha` runs the spot-core binary beside ledger ({}); build it with \
         `cargo build --release --bins`",
        spot_bin.display()
    );
    let mut spot_args: Vec<String> = args
        .spot_storage
        .args()
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(assets) = &args.assets {
        spot_args.push("--assets".into());
        spot_args.push(assets.display().to_string());
    }
    Ok(ha::cell::CellOptions {
        cell,
        spot_bin,
        spot_env: vec![(spot_core::TOKEN_ENV.to_owned(), token.to_owned())],
        spot_args,
        patroni: ha::patroni::Options::default(),
    })
}

/// Where a cell's processes keep their data under `up`'s data dir.
pub(crate) fn cell_dir(args: &UpArgs, cell: u16) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::path::absolute(args.data_dir.join("ha").join(format!("cell{cell}")))?;
    // Patroni runs as `postgres` when `up` runs as root: the directories above the cell's must
    // let it pass (as for the private cluster, README).
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub(crate) async fn up(args: UpArgs, settings: &Settings) -> anyhow::Result<()> {
    let (assets, secret, settings) = up_prelude(&args, settings)?;
    let settings = &settings;
    let token = stored_or_generated_spot_token(&args.data_dir.join(SPOT_TOKEN_FILE))?;
    println!("starting cell 1 under HA: etcd x3, PostgreSQL x2 under Patroni, spot-core x3 ...");
    let mut cell = ha::cell::HaCell::start(&cell_dir(&args, 1)?, &cell_options(&args, 1, &token)?)
        .await
        .context("starting the cell's processes")?;
    let url = cell.database_url(HA_DATABASE);
    let spot_addrs = cell.spot_addrs();
    let members = member_specs(&mut cell).await;
    let cells = Arc::new(tokio::sync::Mutex::new(vec![cell]));
    let members_file = args.data_dir.join("members.json");
    let supervisor = tokio::spawn(ha::cell::supervise(
        cells.clone(),
        members_file.clone(),
        Duration::from_secs(1),
    ));

    let database = &settings.database;
    let pool = schema::prepare_with(&url, config::POOL_CONNECTIONS_MAX, database.liveness).await?;
    schema::cell_identity::check_no_map(&pool).await?;
    let spot = SpotAdapter::with_liveness(
        spot_addrs.clone(),
        args.spot_timeout.0,
        Some(token),
        settings.spot_liveness,
    );
    wait_spot(&spot, &spot_addrs).await?;
    let stack = UpStack {
        assets,
        secret,
        pool,
        spot,
        url,
        spot_line: format!("{spot_addrs} (three replicas, the leader by etcd's lease)"),
        child: None,
        members,
        after_banner: Some(format!(
            "members:      {} (rewritten every second)",
            members_file.display()
        )),
    };
    let served = serve_up(&args, settings, stack).await;
    supervisor.abort();
    drop(cells);
    served
}

/// `ledger up --cells N --ha`: every cell its own etcd, Patroni pair and three spot-core
/// replicas (under `<data-dir>/ha/cell<i>`), the map naming each cell's nodes (with their
/// Patroni URLs), replicas and members, then served as `up --cells` serves a map. The replicas
/// run without a token (loopback only), as the cells' spot-core children do without one.
pub(crate) async fn up_cells(args: UpArgs, settings: &Settings, count: u16) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=crate::cellular::UP_CELLS_MAX).contains(&count),
        "--cells must be from 1 to {}, not {count}",
        crate::cellular::UP_CELLS_MAX
    );
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let n = usize::from(count);
    let mut cells = Vec::with_capacity(n);
    let mut specs = Vec::with_capacity(n);
    for i in 1..=count {
        println!(
            "starting cell {i} under HA: etcd x3, PostgreSQL x2 under Patroni, spot-core x3 ..."
        );
        let mut options = cell_options(&args, i, "")?;
        options.spot_env.clear();
        let mut cell = ha::cell::HaCell::start(&cell_dir(&args, i)?, &options)
            .await
            .with_context(|| format!("starting cell {i}'s processes"))?;
        let members = member_specs(&mut cell).await;
        let spot = SpotAdapter::with_liveness(
            cell.spot_addrs(),
            args.spot_timeout.0,
            None,
            settings.spot_liveness,
        );
        wait_spot(&spot, &cell.spot_addrs()).await?;
        let k = usize::from(i) - 1;
        let (from, to) = (k * 256 / n, (k + 1) * 256 / n - 1);
        specs.push(serde_json::json!({
            "id": i,
            "database_url": cell.database_url(&format!("{HA_DATABASE}_cell{i}")),
            "spot": cell.spot_addrs(),
            "partitions": [format!("{from}-{to}")],
            "members": members,
        }));
        cells.push(cell);
    }
    let text = serde_json::json!({ "partitions": 256, "cells": specs }).to_string();
    let map = cells::CellMap::parse(&text, cells::MapFormat::Json).context("the HA cells' map")?;
    let cells = Arc::new(tokio::sync::Mutex::new(cells));
    let supervisor = tokio::spawn(ha::cell::supervise(
        cells.clone(),
        args.data_dir.join("members.json"),
        Duration::from_secs(1),
    ));
    let served = crate::cellular::up(args, settings, map).await;
    supervisor.abort();
    drop(cells);
    served
}

/// The cell's PostgreSQL nodes and spot-core replicas as the cells view takes them.
pub(crate) async fn member_specs(cell: &mut ha::cell::HaCell) -> Vec<cells::MemberSpec> {
    cell.members()
        .await
        .into_iter()
        .filter(|m| m.kind != "etcd")
        .map(|m| cells::MemberSpec {
            kind: if m.kind == "postgres" {
                cells::MemberKind::Postgres
            } else {
                cells::MemberKind::SpotCore
            },
            name: m.name,
            address: m.address,
            control: m.control,
        })
        .collect()
}

/// Waits until a replica leads and answers (a fresh cell elects within a lease's time).
pub(crate) async fn wait_spot(spot: &SpotAdapter, addrs: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match spot.ping().await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() > deadline => {
                anyhow::bail!("no spot-core replica of {addrs} leads: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
