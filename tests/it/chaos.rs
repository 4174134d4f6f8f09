//! FND-001..006 and INV-004 under chaos, a smaller version of `cargo run -p tests --bin chaos`:
//! transfers in both directions through two real `ledger serve` processes while they and
//! spot-core are killed with SIGKILL at random moments, with spot-core taking snapshots, rotating
//! and archiving small segments and the ledgers advancing the idempotency horizon (issue 15);
//! then nothing is stuck, nothing is applied twice, every record agrees with its transfer's final
//! state, no money is created or lost, spot-core's journal reads back from seq 1 and the ledger's
//! own exact check, incremental and full, is ok. The run with PostgreSQL restarts is in the
//! `pg_restart` test binary (never under this catalogue).

use tests::chaos::{run, Config, Snapshots};

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
    c.settle_max = std::time::Duration::from_secs(120);
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
