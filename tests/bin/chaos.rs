//! `cargo run --release -p tests --bin chaos -- [TRANSFERS] [CRASHES] [--pg-restarts N]
//! [--pg-failovers N] [--net-faults N] [--net-paths spot|postgres] [--bulk N] [--cells N] [--moves N] [--no-horizon] [--no-snapshots | --snapshot-every-records N --segment-bytes B]`: the chaos run against the machine's PostgreSQL
//! (`TEST_DATABASE_SERVER`, default postgres://postgres@127.0.0.1:5432) with the `ledger` and
//! `spot-core` binaries built beside this one. `--pg-restarts N` restarts that server's cluster
//! N times with `-m immediate` during the run (it needs the rights of `pg_ctlcluster`, and takes
//! the machine's PostgreSQL-restart lock). `--pg-failovers N` runs the database on a private
//! primary and synchronous standby instead (`tests::pg_pair`, made as the `postgres` user) and
//! fails over N times (primary killed with `-m immediate`, standby promoted, a new standby
//! made); `--pg-restarts` then restart that pair's primary. `--net-faults N` runs the processes
//! in network namespaces of their own and injects N nftables faults between the ledgers and
//! spot-core or PostgreSQL (root only; `tests::netns`); `--net-paths spot|postgres` draws them
//! on that path only. `--bulk N` sends the transfers in
//! batches of N to `POST /api/v1/internal_transfers` (each item with its own cid, retried until
//! it is answered with its req_id). `--cells N` runs N cells (ADR 0017): a database and a
//! spot-core (`--cell-id`) per cell, the ledgers under a cell map, the crashes drawn over the
//! ledgers and every cell's spot-core, and the end check per cell and in total; with
//! `--pg-restarts` each cell's database is on a private cluster restarted in turn; with
//! `--net-faults` too (each cell's database then reached through a forwarder of its own), the
//! faults going round the cells, each on one cell's spot-core or database path and naming its
//! cell; with `--pg-failovers` the last cell's database is the private synchronous pair, failed
//! over while the other cells commit. `--moves N` (default 6; cells only, not under `--ha`)
//! moves partitions of the run's first users back and forth between the cells through the
//! ledgers' admin route while the load and the faults run, every third move cancelled a moment
//! after it starts; the run waits for every move to end and checks each cell by the map the
//! cells hold then. `--ha` runs each cell under HA (`tests::chaos::ha`:
//! etcd x3, a Patroni pair, three spot-core replicas on 127.0.0.<10c+1..10c+3>, on /dev/shm
//! with PostgreSQL's fsync off; root, for nftables) and adds, `--ha-faults N` times each
//! (default 1), a PostgreSQL machine lost, the spot-core leader killed with its disk wiped and
//! the spot-core leader cut off from the other replicas; spot-core kills hit a random replica
//! and `--pg-restarts` kill the Patroni leader's postmaster. spot-core snapshots every 300 records in 64 KiB
//! segments unless told otherwise. Exits non-zero unless every figure that must be zero
//! is and the end check found nothing else wrong.

use anyhow::{bail, Context};
use tests::chaos::Snapshots;
use tests::netns::{Fault, PathTo};

const USAGE: &str = "usage: chaos [TRANSFERS] [CRASHES] [--pg-restarts N] [--pg-failovers N] \
                     [--net-faults N] [--net-paths spot|postgres] [--bulk N] [--cells N] [--moves N] \
                     [--ha [--ha-faults N]] [--no-horizon] \
                     [--no-snapshots | --snapshot-every-records N --segment-bytes B]";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let bin_dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no bin dir"))?
        .to_path_buf();
    let server_url = std::env::var("TEST_DATABASE_SERVER")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    let mut config = tests::chaos::Config::new(1_000, 20, bin_dir, server_url);
    let mut positional = 0;
    let mut snapshots_given = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--pg-restarts" => {
                let n = args.next().context(USAGE)?;
                config.pg_restarts = n.parse().with_context(|| format!("--pg-restarts {n}"))?;
            }
            "--pg-failovers" => {
                let n = args.next().context(USAGE)?;
                config.pg_failovers = n.parse().with_context(|| format!("--pg-failovers {n}"))?;
            }
            "--net-faults" => {
                let n = args.next().context(USAGE)?;
                config.net_faults = n.parse().with_context(|| format!("--net-faults {n}"))?;
            }
            "--net-paths" => {
                let v = args.next().context(USAGE)?;
                let path = match v.as_str() {
                    "spot" => PathTo::Spot,
                    "postgres" => PathTo::Postgres,
                    _ => bail!("--net-paths {v}: {USAGE}"),
                };
                config.net_kinds = Fault::ALL.into_iter().map(|f| (path, f)).collect();
            }
            "--cells" => {
                let n = args.next().context(USAGE)?;
                config.cells = n.parse().with_context(|| format!("--cells {n}"))?;
            }
            "--moves" => {
                let n = args.next().context(USAGE)?;
                config.moves = n.parse().with_context(|| format!("--moves {n}"))?;
            }
            "--bulk" => {
                let n = args.next().context(USAGE)?;
                config.bulk = n.parse().with_context(|| format!("--bulk {n}"))?;
            }
            "--no-snapshots" => {
                config.snapshots = None;
                snapshots_given = true;
            }
            "--snapshot-every-records" | "--segment-bytes" => {
                snapshots_given = true;
                let v = args.next().context(USAGE)?;
                let n = v.parse().with_context(|| format!("{arg} {v}"))?;
                let s = config.snapshots.get_or_insert(Snapshots::FULL_RUN);
                if arg == "--segment-bytes" {
                    s.segment_bytes = n;
                } else {
                    s.every_records = n;
                }
            }
            "--ha" => {
                config.ha.get_or_insert(1);
            }
            "--ha-faults" => {
                let n = args.next().context(USAGE)?;
                config.ha = Some(n.parse().with_context(|| format!("--ha-faults {n}"))?);
            }
            "--no-horizon" => config.horizon = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            number if positional < 2 => {
                let n = number
                    .parse()
                    .with_context(|| format!("{number}: {USAGE}"))?;
                if positional == 0 {
                    config.transfers = n;
                } else {
                    config.crashes_min = n;
                }
                positional += 1;
            }
            other => bail!("unexpected argument {other}: {USAGE}"),
        }
    }
    if let (Some(s), false, n @ 2..) = (config.snapshots.as_mut(), snapshots_given, config.cells) {
        // Each cell's spot-core sees about 1/N of the records: snapshots and segments scaled
        // down as much, so each compacts and archives as one spot-core does in a run of one cell.
        s.every_records = (s.every_records / n as u64).max(1);
        s.segment_bytes = (s.segment_bytes / n as u64).max(4_096);
    }
    if config.cells > 1 {
        println!(
            "chaos: {} cells (a database and a spot-core each, the ledgers under a cell map; \
             crashes drawn over the ledgers and every cell's spot-core{}); {} partition moves",
            config.cells,
            if config.net_faults > 0 {
                "; network faults round the cells, each on one cell's spot-core or database path"
            } else {
                ""
            },
            if config.ha.is_some() { 0 } else { config.moves }
        );
    }
    if let Some(n) = config.ha {
        println!(
            "chaos: under HA (each cell: etcd x3, a Patroni pair, three spot-core replicas; \
             tmpfs, PostgreSQL fsync off); {n} of each: PostgreSQL machine lost, spot-core \
             leader wiped, spot-core leader cut off; spot-core kills hit a random replica, \
             PostgreSQL restarts kill the Patroni leader's postmaster; a supervisor's pass \
             every second"
        );
    }
    if config.bulk > 1 {
        println!("chaos: transfers sent in batches of {}", config.bulk);
    }
    println!(
        "chaos: {} transfers, at least {} crashes (ledger serve ×2 and spot-core, SIGKILL), \
         {} PostgreSQL restarts, {} failovers, {} network faults; snapshots {}, horizon {}",
        config.transfers,
        config.crashes_min,
        config.pg_restarts,
        config.pg_failovers,
        config.net_faults,
        match config.snapshots {
            Some(s) => format!(
                "every {} records, {} B segments",
                s.every_records, s.segment_bytes
            ),
            None => "off".to_owned(),
        },
        if config.horizon { "on" } else { "off" },
    );
    let report = tests::chaos::run(config).await?;
    println!("{report}");
    if !report.clean() {
        bail!("the chaos run found problems");
    }
    Ok(())
}
