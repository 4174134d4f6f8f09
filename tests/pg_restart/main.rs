//! PostgreSQL stopped with `-m immediate` (no checkpoint, like a power cut) under load, then
//! started again: no committed step is lost, transfers caught mid-way are finished by the
//! recovery worker, nothing is applied twice and fund conservation holds. Its own test binary
//! (cargo runs test binaries one after another), serialized by a file lock against concurrent
//! runs on this machine, and PostgreSQL is always started again, even on panic.

#[path = "../it/helpers.rs"]
#[allow(dead_code)]
mod helpers;
#[path = "../it/procs.rs"]
#[allow(dead_code)]
mod procs;

use std::process::Command;
use std::time::{Duration, Instant};

use application::NewTransfer;
use domain::AccountType::{Funding, Spot};
use domain::{Amount, UserId};

use helpers::Stack;
use procs::{all_req_ids, spot_ops, wait_terminal, LedgerProcess, RECOVER_NOW};

fn cluster_version() -> String {
    let dir = std::fs::read_dir("/etc/postgresql").expect("/etc/postgresql");
    let mut versions: Vec<String> = dir
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    versions.sort();
    versions.pop().expect("a PostgreSQL cluster")
}

fn pg_ctl(action: &str) -> bool {
    let mut cmd = Command::new("pg_ctlcluster");
    cmd.args([
        "--skip-systemctl-redirect",
        &cluster_version(),
        "main",
        action,
    ]);
    if action == "stop" {
        cmd.args(["-m", "immediate"]);
    }
    cmd.status().map(|s| s.success()).unwrap_or(false)
}

/// Starts PostgreSQL again when dropped, whatever happened, and waits until it accepts.
struct Restart;

impl Drop for Restart {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            pg_ctl("start");
            let ready = Command::new("pg_isready")
                .args(["-h", "127.0.0.1", "-p", "5432"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready || Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Serializes this test against other runs of it on the machine.
fn lock() -> std::fs::File {
    let f = std::fs::File::create("/tmp/ledger-pg-restart.lock").expect("lock file");
    f.lock().expect("flock");
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fnd_006_inv_004_postgres_immediate_stop_under_load_loses_nothing() {
    let _lock = lock();
    let s = Stack::start().await;
    for user in 1..=4 {
        s.deposit(user, "USDT", "1000").await;
    }
    let ledger = LedgerProcess::start(&s.db.url, &s.spot.addr, &RECOVER_NOW);

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
        let _restart = Restart;
        assert!(pg_ctl("stop"), "immediate stop");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    while load.join_next().await.is_some() {}

    // Every transfer that was created (its TransferCreated committed) finishes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ids = loop {
        match tokio::time::timeout(Duration::from_secs(5), all_req_ids(&s)).await {
            Ok(ids) => break ids,
            Err(_) => assert!(Instant::now() < deadline, "database never came back"),
        }
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
