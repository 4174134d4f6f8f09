//! PostgreSQL failover to a streaming standby, on a private primary and standby built by the
//! test (`tests::pg_pair`: `initdb`, `pg_basebackup`, each on its own port, as the `postgres`
//! user; the machine's own cluster is never touched), with real `ledger serve` and spot-core
//! processes whose `DATABASE_URL` names both servers.
//!
//! - Synchronous replication: the chaos run with the primary killed (`-m immediate`) and the
//!   standby promoted twice, and restarted once, under load: every transfer answered before a
//!   failover is found afterwards in the same or a later state, nothing is created, lost,
//!   applied twice or stuck, and the ledger's own exact check passes. The same over three cells
//!   (`--cells 3`), the last cell's database the pair: its failover stays its own.
//! - Asynchronous replication (`failover_async.rs`): a window of acknowledged commits is lost on
//!   purpose; the ledger reports exactly the affected req_ids, halts, and the operator's repair
//!   makes conservation exact again.
//!
//! Its own test binary: it builds and kills PostgreSQL clusters, and its tests run one at a
//! time.

#[path = "../it/fd_census.rs"]
#[allow(dead_code)]
mod fd_census;
#[path = "../it/helpers.rs"]
#[allow(dead_code)]
mod helpers;
#[path = "../it/procs.rs"]
#[allow(dead_code)]
mod procs;

mod failover_async;

use std::time::Duration;

use helpers::{bin, server_url};
use tests::chaos::Snapshots;

/// One pair at a time: each test runs two clusters and ledger processes of its own.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fnd_006_inv_004_synchronous_failover_loses_nothing_acknowledged() {
    let _one = SERIAL.lock().await;
    let ledger = bin("ledger");
    bin("spot-core");
    let mut c = tests::chaos::Config::new(
        300,
        4,
        ledger.parent().expect("bin dir").to_path_buf(),
        server_url(),
    );
    c.users = 14;
    c.snapshots = Some(Snapshots::SMALL_RUN);
    c.clients = 8;
    c.pg_failovers = 2;
    c.pg_restarts = 1;
    c.settle_max = Duration::from_secs(180);
    let report = tests::chaos::run(c).await.expect("chaos run on the pair");
    println!("{report}");
    assert_eq!(report.transfers, 300, "{report}");
    assert_eq!(report.failovers.len(), 2, "{report}");
    assert_eq!(report.pg_restarts, 1, "{report}");
    assert_eq!(report.answered_lost, 0, "{report}");
    assert!(report.clean(), "{report}");
}

/// Issue 34, `chaos --cells 3 --pg-failovers 1`: three cells, the last one's database a private
/// synchronous pair failed over once, the other two's on private clusters each restarted once
/// (the restart that comes round to the last cell restarts its pair's primary), the ledgers and
/// every cell's spot-core killed again and again. The failover is the last cell's alone; every
/// end check is exact per cell and in total, nothing answered is lost in any cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_3_the_last_cells_pair_fails_over_while_the_others_restart_money_exact_per_cell() {
    let _one = SERIAL.lock().await;
    let ledger = bin("ledger");
    bin("spot-core");
    let mut c = tests::chaos::Config::new(
        150,
        6,
        ledger.parent().expect("bin dir").to_path_buf(),
        server_url(),
    );
    c.cells = 3;
    c.users = 21;
    c.clients = 8;
    c.snapshots = Some(Snapshots {
        every_records: 40,
        segment_bytes: 8_192,
    });
    c.pg_failovers = 1;
    c.pg_restarts = 3;
    c.settle_max = Duration::from_secs(180);
    let report = tests::chaos::run(c)
        .await
        .expect("chaos run over three cells");
    println!("{report}");
    assert_eq!(report.transfers, 150, "{report}");
    assert_eq!(report.failovers.len(), 1, "{report}");
    assert_eq!(report.pg_restarts, 3, "{report}");
    let failovers: Vec<(u16, usize)> = report
        .cells
        .iter()
        .map(|(cell, r)| (*cell, r.failovers.len()))
        .collect();
    assert_eq!(failovers, vec![(1, 0), (2, 0), (3, 1)], "{report}");
    for (cell, r) in &report.cells {
        assert!(r.transfers > 0, "cell {cell} had no transfer: {report}");
        assert_eq!(r.pg_restarts, 1, "cell {cell}'s database: {report}");
        assert_eq!(r.answered_lost, 0, "cell {cell}: {report}");
        assert!(r.clean(), "cell {cell}: {report}");
    }
    assert!(report.clean(), "{report}");
}
