//! PostgreSQL stopped with `-m immediate` (no checkpoint, like a power cut) under load, then
//! started again: no committed step is lost, transfers caught mid-way are finished by the
//! recovery worker, nothing is applied twice and conservation holds. And the chaos run with
//! PostgreSQL restarted twice among the SIGKILLs of the ledgers and spot-core. Its own test
//! binary (cargo runs test binaries one after another), each test serialized by the file lock of
//! `tests::pg_ctl` against the other and against other runs on this machine, and PostgreSQL is
//! always started again, even on panic. The cluster restarted is the one serving
//! `TEST_DATABASE_SERVER`.

#[path = "../it/fd_census.rs"]
#[allow(dead_code)]
mod fd_census;
#[path = "../it/helpers.rs"]
#[allow(dead_code)]
mod helpers;
#[path = "../it/procs.rs"]
#[allow(dead_code)]
mod procs;

use std::time::{Duration, Instant};

use application::NewTransfer;
use domain::AccountType::{Funding, Spot};
use domain::{Amount, UserId};

use helpers::{bin, server_url, Stack};
use procs::{spot_ops, try_all_req_ids, wait_terminal, LedgerProcess, RECOVER_NOW};
use tests::chaos::Snapshots;
use tests::pg_ctl::{self, PgCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fnd_006_inv_004_postgres_immediate_stop_under_load_loses_nothing() {
    let _lock = pg_ctl::lock().expect("PostgreSQL restart lock");
    let pg = PgCluster::serving(&server_url()).expect("the cluster behind the test server");
    pg.settle(&server_url()).await.expect("PostgreSQL settled");
    let s = Stack::start().await;
    for user in 1..=4 {
        s.deposit(user, "USDT", "1000").await;
    }
    let ledger = LedgerProcess::start(&s.db.url, &s.spot, &RECOVER_NOW);

    // Load: in-process submits in both directions, running while the server goes down.
    let mut load = tokio::task::JoinSet::new();
    for i in 0..60u64 {
        let c = s.another_coordinator();
        load.spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 15)).await;
            let from_funding = i % 3 != 0;
            let _ = c
                .submit(NewTransfer {
                    user_id: UserId::new(1 + i % 4).unwrap(),
                    from: if from_funding { Funding } else { Spot },
                    to: if from_funding { Spot } else { Funding },
                    asset: domain::AssetSymbol::parse("USDT").unwrap(),
                    amount: Amount::parse("5").unwrap(),
                    cid: None,
                })
                .await;
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    {
        let _start = pg.start_on_drop();
        pg.stop_immediate().expect("immediate stop");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    while load.join_next().await.is_some() {}

    // Every transfer that was created (its TransferCreated committed) finishes.
    let deadline = Instant::now() + pg_ctl::RECOVERY_MAX;
    let ids = loop {
        match tokio::time::timeout(Duration::from_secs(5), try_all_req_ids(&s)).await {
            Ok(Ok(ids)) => break ids,
            Ok(Err(e)) => assert!(Instant::now() < deadline, "database never came back: {e}"),
            Err(_) => assert!(Instant::now() < deadline, "database never came back"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!ids.is_empty());
    for id in &ids {
        wait_terminal(&s, id, Duration::from_secs(60)).await;
        let ops = spot_ops(&s, id).await;
        let mut kinds: Vec<_> = ops.iter().map(|(op, _)| op.clone()).collect();
        kinds.dedup();
        assert_eq!(kinds.len(), ops.len(), "spot-core applied {id} twice");
    }
    for user in 1..=4 {
        s.assert_conserved(user, "USDT").await;
    }
    drop(ledger);
}

/// The chaos run (SIGKILLs of both ledgers and spot-core, snapshots and the horizon on) with
/// PostgreSQL restarted twice with `-m immediate` in the middle of it: the processes ride
/// through, and the run ends with nothing created, lost, applied twice or stuck, the journal
/// readable from seq 1 and the ledger's own checks ok.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fnd_006_inv_004_chaos_with_postgres_restarts_loses_and_creates_nothing() {
    let ledger = bin("ledger");
    bin("spot-core");
    let mut c = tests::chaos::Config::new(
        200,
        6,
        ledger.parent().expect("bin dir").to_path_buf(),
        server_url(),
    );
    c.users = 14;
    c.snapshots = Some(Snapshots::SMALL_RUN);
    c.clients = 8;
    c.pg_restarts = 2;
    c.settle_max = Duration::from_secs(120);
    let report = tests::chaos::run(c).await.expect("chaos run");
    println!("{report}");
    assert_eq!(report.transfers, 200);
    assert_eq!(report.pg_restarts, 2);
    assert!(report.crashes >= 6);
    assert!(report.clean(), "{report}");
}
