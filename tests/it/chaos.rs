//! FND-001..006 and INV-004 under chaos, a smaller version of `cargo run -p tests --bin chaos`:
//! transfers in both directions through two real `ledger serve` processes while they and
//! spot-core are killed with SIGKILL at random moments, with spot-core taking snapshots, rotating
//! and archiving small segments and the ledgers advancing the idempotency horizon;
//! then nothing is stuck, nothing is applied twice, every record agrees with its transfer's final
//! state, no money is created or lost, spot-core's journal reads back from seq 1 and the ledger's
//! own exact check, incremental and full, is ok. The run with PostgreSQL restarts is in the
//! `pg_restart` test binary (never under this catalogue).

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rust_decimal::Decimal;
use spot_core::client::SpotClient;
use spot_core::protocol::{MovementRequest, Request, Response};
use tests::chaos::netfaults::NOTICE_MAX;
use tests::chaos::{run, Config, Snapshots};
use tests::netns::{Fault, PathTo};

use crate::helpers::{bin, server_url};

fn config(transfers: usize, crashes_min: usize) -> Config {
    let ledger = bin("ledger");
    bin("spot-core");
    let mut c = Config::new(
        transfers,
        crashes_min,
        ledger.parent().expect("bin dir").to_path_buf(),
        server_url(),
    );
    c.users = 14;
    c.snapshots = Some(Snapshots::SMALL_RUN);
    c.clients = 8;
    c.settle_max = Duration::from_secs(120);
    c
}

#[tokio::test]
async fn inv_004_fnd_001_to_006_chaos_kills_of_ledgers_and_spot_core_lose_and_create_nothing() {
    let report = run(config(200, 8)).await.expect("chaos run");
    println!("{report}");
    assert_eq!(report.transfers, 200);
    assert!(report.crashes >= 8);
    assert!(report.clean(), "{report}");
}

/// The same chaos with the transfers sent in batches of 10 to `POST /api/v1/internal_transfers`
/// (issue 25): crashes fall inside batches, at every step's boundary, and each item still ends
/// exactly once.
#[tokio::test]
async fn chaos_in_bulk_batches_of_10_loses_and_creates_nothing() {
    let mut c = config(200, 6);
    c.bulk = 10;
    c.clients = 4;
    let report = run(c).await.expect("chaos run");
    println!("{report}");
    assert_eq!(report.transfers, 200);
    assert!(report.crashes >= 6);
    assert!(report.clean(), "{report}");
}

/// spot-core alone killed with SIGKILL under load and restarted, again and again.
#[tokio::test]
async fn fnd_004_spot_core_sigkill_under_load_every_transfer_finishes_exactly_once() {
    let mut c = config(150, 5);
    c.kill_ledgers = false;
    let report = run(c).await.expect("chaos run");
    println!("{report}");
    assert_eq!(report.spot_crashes, report.crashes);
    assert!(report.spot_crashes >= 5);
    assert!(report.clean(), "{report}");
}

/// The chaos run's end check reads spot-core's journal from seq 1: through the archive when
/// spot-core moved compacted segments there, and when it deleted them instead (no archive) the
/// read fails and says JOURNAL_COMPACTED rather than checking a partial history.
#[tokio::test]
async fn chaos_end_check_reads_the_journal_through_the_archive_and_refuses_a_compacted_one() {
    for archive in [true, false] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut cmd = std::process::Command::new(bin("spot-core"));
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(tmp.path().join("spot"))
            .args(["--snapshot-every-records", "10", "--segment-bytes", "1024"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if archive {
            cmd.arg("--archive-dir").arg(tmp.path().join("archive"));
        }
        let mut child = KillOnDrop(cmd.spawn().expect("spawn spot-core"));
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("ready line");
        let addr = line
            .trim()
            .strip_prefix("spot-core listening on ")
            .unwrap_or_else(|| panic!("spot-core did not start: {line:?}"))
            .to_owned();
        let client = SpotClient::new(addr, Duration::from_secs(5));
        let call = |req: Request| {
            let client = client.clone();
            async move { client.call(&req).await.expect("spot-core answers") }
        };
        let deposit = |i: u64| {
            Request::Deposit(MovementRequest::new(
                ulid::Ulid::new().to_string(),
                1 + i % 5,
                "USDT",
                Decimal::from(i + 1),
            ))
        };
        for i in 0..100 {
            assert!(matches!(call(deposit(i)).await, Response::Applied { .. }));
        }
        // The conservation check consumed everything so far; more records bring two snapshots past it, and
        // compaction takes every segment before it.
        assert!(matches!(
            call(Request::Retain { after_seq: 100 }).await,
            Response::Ok { .. }
        ));
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut extra = 100;
        let core = loop {
            assert!(matches!(
                call(deposit(extra)).await,
                Response::Applied { .. }
            ));
            extra += 1;
            let Response::Ok {
                core: Some(core), ..
            } = call(Request::Status {}).await
            else {
                panic!("status");
            };
            let compacted = if archive {
                std::fs::read_dir(tmp.path().join("archive"))
                    .expect("archive dir")
                    .count()
                    > 0
            } else {
                core.first_seq > 1
            };
            if compacted && extra > 130 {
                break core;
            }
            assert!(Instant::now() < deadline, "never compacted: {core:?}");
        };
        let journal = tests::chaos::spot_journal(&client).await;
        if archive {
            let records = journal.expect("the whole journal, through the archive");
            let seqs: Vec<u64> = records.iter().map(|r| r.seq()).collect();
            assert_eq!(seqs, (1..=core.last_seq).collect::<Vec<_>>());
        } else {
            let err = format!("{:#}", journal.expect_err("the journal lost its start"));
            assert!(err.contains("JOURNAL_COMPACTED"), "{err}");
        }
    }
}

/// A child process killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// Issue 34, `chaos --cells 3`: the chaos run over three cells (three databases, three
/// spot-cores each started as its cell, two ledgers serving every cell under a cell map), the
/// ledgers and every cell's spot-core killed with SIGKILL again and again, each cell's
/// PostgreSQL (a private cluster per cell) restarted with `-m immediate` once, and (issue 51)
/// six partition moves of trading users back and forth between the cells through the ledgers'
/// admin route, every third cancelled a moment after it starts; each ends DONE or CANCELLED and
/// every check below counts a cell's money by the partitions it owns at the end. Each cell's end check
/// runs on its own database, its own spot-core and its own users' transfers: nothing stuck,
/// nothing applied twice, every record as its transfer's final state says, no money created or
/// lost, the feed dense, the journal read back from seq 1; and in total, as well as the ledger's
/// own check of every cell and the total.
#[tokio::test]
async fn chaos_cells_3_kills_and_each_cells_pg_restart_money_exact_per_cell_and_in_total() {
    let mut c = config(150, 8);
    c.cells = 3;
    // Each cell's database on a private cluster of its own, each restarted once with
    // `-m immediate` (the shared server is never touched).
    c.pg_restarts = 3;
    c.users = 21;
    // About 50 transfers per cell: snapshots and archiving often enough to run in each.
    c.snapshots = Some(Snapshots {
        every_records: 40,
        segment_bytes: 8_192,
    });
    let report = run(c).await.expect("chaos run");
    println!("{report}");
    assert_eq!(report.transfers, 150);
    assert!(report.crashes >= 8);
    assert!(report.ledger_crashes >= 1, "{report}");
    assert_eq!(report.cells.len(), 3, "{report}");
    let ids: Vec<u16> = report.cells.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    let mut transfers = 0;
    let mut spot_crashes = 0;
    for (cell, r) in &report.cells {
        assert!(r.transfers > 0, "cell {cell} had no transfer: {report}");
        assert!(r.spot_crashes >= 1, "cell {cell}'s spot-core never killed");
        assert_eq!(r.pg_restarts, 1, "cell {cell}'s database");
        assert!(
            r.created.is_zero() && r.lost.is_zero(),
            "cell {cell}: {report}"
        );
        assert_eq!(
            (r.duplicates, r.mismatched, r.stuck),
            (0, 0, 0),
            "cell {cell}"
        );
        assert_eq!(r.answered_lost, 0, "cell {cell}");
        assert!(r.feed_dense && r.feed_events > 0, "cell {cell}: {report}");
        assert!(r.journal_records > 0, "cell {cell}");
        assert!(r.problems.is_empty(), "cell {cell}: {:?}", r.problems);
        assert!(r.clean(), "cell {cell}: {report}");
        transfers += r.transfers;
        spot_crashes += r.spot_crashes;
    }
    assert_eq!(transfers, report.transfers);
    assert_eq!(spot_crashes, report.spot_crashes);
    assert_eq!(report.pg_restarts, 3);
    // Partitions moved back and forth among the faults (issue 51): every move ended, some
    // DONE, the cells' map moved on, and each cell was checked by the partitions it owns now.
    let moves = report.moves.clone().expect("the run's moves");
    assert!(moves.started >= 4, "{report}");
    assert!(moves.done >= 1, "{report}");
    assert!(moves.done + moves.cancelled >= moves.started, "{report}");
    assert!(moves.map_version > 1, "{report}");
    assert!(report.clean(), "{report}");
}

/// Issue 34, `chaos --cells 3 --net-faults 3`: the run above (three cells, the ledgers and every
/// cell's spot-core killed again and again, each cell's PostgreSQL restarted once) with network
/// faults too (nftables rules in network namespaces this test builds: it needs root, and fails
/// saying so without it, as the `netfault` tests do). Each cell's spot-core and database (a
/// forwarder per cell) are paths of their own; the three faults go round the cells, one each:
/// a spot-core killed behind a blackhole, a database's answers dropped, a database's
/// connections reset, in a random order. Each fault met live connections of its cell and the
/// ledgers noticed every one dead within the bound; every end check is exact per cell and in
/// total. What every cell committed while one cell's path was cut is printed with each fault.
/// The run's partition moves (issue 51) go on among these faults as above.
#[tokio::test]
async fn chaos_cells_3_kills_net_faults_and_pg_restarts_each_fault_noticed_money_exact_per_cell_and_in_total(
) {
    let kinds = vec![
        (PathTo::Spot, Fault::DeadPeer),
        (PathTo::Postgres, Fault::DropAnswers),
        (PathTo::Postgres, Fault::Reset),
    ];
    let mut c = config(150, 8);
    c.cells = 3;
    c.pg_restarts = 3;
    c.net_faults = 3;
    c.net_kinds = kinds.clone();
    c.users = 21;
    c.snapshots = Some(Snapshots {
        every_records: 40,
        segment_bytes: 8_192,
    });
    let report = run(c).await.unwrap_or_else(|e| panic!("chaos run: {e:#}"));
    println!("{report}");
    assert_eq!(report.transfers, 150);
    assert!(report.crashes >= 8);
    assert_eq!(report.cells.len(), 3, "{report}");
    assert_eq!(report.net_faults.len(), 3, "{report}");
    let mut drawn: Vec<(PathTo, Fault)> = report
        .net_faults
        .iter()
        .map(|d| (d.path, d.fault))
        .collect();
    drawn.sort();
    let mut expected = kinds;
    expected.sort();
    assert_eq!(drawn, expected, "each kind once: {report}");
    for d in &report.net_faults {
        assert!(
            d.connections > 0,
            "a fault on a path with no connection: {d}"
        );
        let noticed = d.noticed.unwrap_or(Duration::MAX);
        assert!(noticed <= NOTICE_MAX, "{d}\n{report}");
        assert_eq!(d.committed_meanwhile.len(), 3, "{d}");
    }
    let (mut transfers, mut faults) = (0, 0);
    for (cell, r) in &report.cells {
        assert!(r.transfers > 0, "cell {cell} had no transfer: {report}");
        assert_eq!(
            r.net_faults.len(),
            1,
            "cell {cell}'s network faults: {report}"
        );
        assert_eq!(r.net_faults[0].cell, Some(*cell), "{report}");
        assert_eq!(r.pg_restarts, 1, "cell {cell}'s database");
        assert!(r.spot_crashes >= 1, "cell {cell}'s spot-core never killed");
        assert!(
            r.created.is_zero() && r.lost.is_zero(),
            "cell {cell}: {report}"
        );
        assert_eq!(
            (r.duplicates, r.mismatched, r.stuck, r.answered_lost),
            (0, 0, 0, 0),
            "cell {cell}"
        );
        assert!(r.feed_dense && r.feed_events > 0, "cell {cell}: {report}");
        assert!(r.problems.is_empty(), "cell {cell}: {:?}", r.problems);
        assert!(r.clean(), "cell {cell}: {report}");
        transfers += r.transfers;
        faults += r.net_faults.len();
    }
    assert_eq!(transfers, report.transfers);
    assert_eq!(faults, report.net_faults.len());
    assert_eq!(report.pg_restarts, 3);
    // The partition moves of the run above ran among these faults too, and every one ended.
    let moves = report.moves.clone().expect("the run's moves");
    assert!(moves.done >= 1, "{report}");
    assert!(moves.done + moves.cancelled >= moves.started, "{report}");
    assert!(report.clean(), "{report}");
}

/// Issue 47, `chaos --ha`: the chaos run on one cell under HA (`tests::chaos::ha`: etcd x3, a
/// Patroni pair, three spot-core replicas on 127.0.0.11-13, on tmpfs with PostgreSQL's fsync
/// off), the ledgers and random replicas killed again and again, the Patroni leader's
/// postmaster killed once, and one of each fault of a machine: the Patroni leader's machine
/// lost (its agent started again later by the supervisor's pass), the spot-core leader killed
/// with its data dir wiped (it must rebuild), the spot-core leader cut off from the other
/// replicas by nftables for a few seconds (root). A supervisor's pass runs every second. Every
/// fault's cell answers again, every member comes back in step, and every money check of the
/// end check is exact, spot-core read through its leader.
#[tokio::test]
async fn chaos_ha_machine_kills_wiped_disk_and_leader_cut_off_lose_and_create_nothing() {
    let mut c = config(300, 6);
    c.ha = Some(1);
    c.pg_restarts = 1;
    let report = run(c).await.unwrap_or_else(|e| panic!("chaos run: {e:#}"));
    println!("{report}");
    assert_eq!(report.transfers, 300);
    assert_eq!(report.ha_faults.len(), 4, "{report}");
    for fault in &report.ha_faults {
        assert!(fault.back.is_some(), "{fault}\n{report}");
    }
    assert!(report.clean(), "{report}");
}
