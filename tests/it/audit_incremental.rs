//! The incremental conservation check. It agrees with the full
//! check from zero after a mixed load with refused withdraws, compensations (refused deposits
//! refunded), a transfer caught mid-step, SIGKILLed spot-core and ledger processes (whose
//! periodic checks advance the same checkpoint); a real violation injected into the funding
//! journal and into spot-core is caught by both; a run reads only what came after its
//! checkpoint; a periodic check that cannot run is a CRITICAL alert and `/metrics` figures; and
//! `ledger audit [--full]` exits 0, 1 or 2.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adapters::pg::{check_full, check_incremental};
use application::audit::InvariantReport;
use application::{Coordinator, NewTransfer};
use domain::AccountType::{Funding, Spot};
use domain::{
    AccountPort, AccountType, AdapterOutcome, Amount, AssetSymbol, Movement, ReqId, TransferState,
    UserId,
};

use crate::helpers::{bin, dec, SpotProcess, Stack, WithdrawThenLoseAnswer};
use crate::procs::{wait_terminal, LedgerProcess, RECOVER_NOW};

async fn incremental(s: &Stack) -> InvariantReport {
    check_incremental(&s.funding, &s.spot_adapter)
        .await
        .expect("the incremental check runs")
}

async fn full(s: &Stack) -> InvariantReport {
    check_full(&s.funding, &s.spot_adapter)
        .await
        .expect("the full check runs")
}

/// Same per-asset figures, same disagreements, same transfer count.
fn assert_agree(inc: &InvariantReport, full: &InvariantReport) {
    assert_eq!(inc.assets, full.assets, "per-asset figures");
    assert_eq!(inc.disagreements, full.disagreements, "disagreements");
    assert_eq!(inc.transfers_checked, full.transfers_checked, "transfers");
    assert_eq!(inc.ok, full.ok);
}

/// An incremental run now, and a full one, on a quiet system: they agree; returns both.
async fn both(s: &Stack) -> (InvariantReport, InvariantReport) {
    let inc = incremental(s).await;
    let full = full(s).await;
    assert_agree(&inc, &full);
    (inc, full)
}

/// Runs incremental checks until one reads nothing (every earlier row is then below the stored
/// horizons, even when other tests' transactions held the cluster-wide horizon back).
async fn drain(s: &Stack) {
    for _ in 0..100 {
        let r = incremental(s).await;
        let read = &r.read;
        // Open disagreements are read again by key at every run.
        if read.transfers <= read.open_before
            && read.funding_journal_rows == 0
            && read.external_deposit_rows == 0
            && read.spot_records == 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = incremental(s).await;
    panic!("the incremental check never caught up: {r:#?}");
}

fn usdt() -> AssetSymbol {
    AssetSymbol::parse("USDT").unwrap()
}

fn user(id: u64) -> UserId {
    UserId::new(id).unwrap()
}

async fn submit(c: &Coordinator, u: u64, from: AccountType, to: AccountType, amount: &str) {
    c.submit(NewTransfer {
        user_id: user(u),
        from,
        to,
        asset: usdt(),
        amount: Amount::parse(amount).unwrap(),
        cid: None,
    })
    .await
    .expect("submit");
}

/// A mixed round: commits both ways, a refused withdraw (FAILED), a refused deposit refunded
/// (ROLLED_BACK, user 5's SPOT account is disabled).
async fn mixed_round(c: &Coordinator) {
    for u in 1..=4 {
        submit(c, u, Funding, Spot, "7").await;
        submit(c, u, Spot, Funding, "2.5").await;
        submit(c, u, Funding, Spot, "100000").await; // refused: insufficient balance
    }
    submit(c, 5, Funding, Spot, "3").await; // refused by SPOT, refunded
}

#[tokio::test]
async fn audit_incremental_agrees_with_full_after_mixed_load_failures_compensations_and_restarts() {
    let mut s = Stack::start().await;
    for u in 1..=5 {
        s.deposit(u, "USDT", "1000").await;
        s.deposit(u, "ETH", "2").await;
    }
    s.spot_adapter
        .set_status(user(5), &usdt(), adapters::AccountStatus::Disabled)
        .await
        .unwrap();
    mixed_round(&s.coordinator).await;
    let (inc, _) = both(&s).await;
    assert!(inc.ok, "{inc:#?}");
    assert_eq!(inc.mode, application::audit::Mode::Incremental);
    assert!(inc.stored);
    let (failed, rolled_back): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE event_type = 'TransferFailed'),
                count(*) FILTER (WHERE event_type = 'TransferRolledBack')
         FROM events",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (failed, rolled_back),
        (4, 1),
        "refused withdraws and a compensation"
    );

    // A transfer caught mid-step: its withdraw applied, its outcome unknown. Both checks count
    // it in flight, neither raises an alarm, and the incremental one keeps it open.
    let crashy = adapters::pg::coordinator(
        s.db.pool.clone(),
        Arc::new(WithdrawThenLoseAnswer(s.funding.clone())),
        Arc::new(s.spot_adapter.clone()),
        s.assets.clone(),
    );
    let stuck = crashy
        .submit(NewTransfer {
            user_id: user(1),
            from: Funding,
            to: Spot,
            asset: usdt(),
            amount: Amount::parse("40").unwrap(),
            cid: None,
        })
        .await
        .unwrap();
    assert_eq!(stuck.state, TransferState::SourcePending);
    let (inc, _) = both(&s).await;
    assert!(inc.ok, "{inc:#?}");
    let usdt_row = inc.assets.iter().find(|a| a.asset == "USDT").unwrap();
    assert_eq!(usdt_row.in_flight, dec("40"));
    assert!(inc.read.open_after >= 1, "the stuck transfer stays open");

    // spot-core SIGKILLed and restarted on its WAL; more load.
    s.spot.kill();
    s.spot.restart();
    mixed_round(&s.coordinator).await;
    let (inc, _) = both(&s).await;
    assert!(inc.ok, "{inc:#?}");

    // A ledger process whose periodic check (every second) advances the same checkpoint and
    // whose recovery worker finishes the stuck transfer; SIGKILLed mid-way, started again.
    let mut env: Vec<(&str, &str)> = RECOVER_NOW.to_vec();
    env.push(("LEDGER_INVARIANT_INTERVAL_SECS", "1"));
    let mut ledger = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let other = s.another_coordinator();
    let load = async {
        for _ in 0..3 {
            mixed_round(&other).await;
        }
    };
    let checks = async {
        for _ in 0..5 {
            // Concurrent with the load and the process's own runs: each decides, none alarms.
            let r = incremental(&s).await;
            assert!(r.ok, "{r:#?}");
        }
    };
    tokio::join!(load, checks);
    wait_for_periodic_runs(&s, 2).await;
    ledger.kill();
    s.spot.kill();
    s.spot.restart();
    mixed_round(&s.coordinator).await;
    let ledger = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let done = wait_terminal(&s, &stuck.req_id, Duration::from_secs(30)).await;
    assert_eq!(done.state, TransferState::Committed);
    wait_for_periodic_runs(&s, 2).await;
    drop(ledger);

    let (inc, full) = both(&s).await;
    assert!(inc.ok, "{inc:#?}");
    assert_eq!(full.mode, application::audit::Mode::Full);
    assert!(!full.stored);
    // 6 rounds of 13 transfers and the stuck one, counted by both.
    assert_eq!(inc.transfers_checked, 6 * 13 + 1);
    let usdt_row = inc.assets.iter().find(|a| a.asset == "USDT").unwrap();
    assert_eq!(usdt_row.in_flight, dec("0"));
    assert_eq!(usdt_row.deposits, dec("5000"));
    drain(&s).await;
    let inc = incremental(&s).await;
    assert_eq!(inc.read.open_after, 0, "every transfer settled: {inc:#?}");
}

/// Waits until the periodic check stored `n` more checkpoints than now.
async fn wait_for_periodic_runs(s: &Stack, n: i64) {
    let version = || async {
        sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(version), 0) FROM audit_checkpoint")
            .fetch_one(&s.db.pool)
            .await
            .unwrap()
    };
    let start = version().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while version().await < start + n {
        assert!(Instant::now() < deadline, "the periodic check did not run");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ledger_audit(s: &Stack, full: bool) -> (i32, String, String) {
    let mut cmd = Command::new(bin("ledger"));
    cmd.args(["audit", "--spot-url", &s.spot.addr])
        .env("DATABASE_URL", &s.db.url)
        .envs(s.spot.env());
    if full {
        cmd.arg("--full");
    }
    let out = cmd.output().expect("run ledger audit");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn audit_a_violation_injected_into_the_journals_is_caught_by_incremental_and_full() {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    let out = s.transfer(1, Funding, Spot, "USDT", "30").await;
    let back = s.transfer(1, Spot, Funding, "USDT", "10").await;
    assert_eq!(back.state, TransferState::Committed);
    drain(&s).await;
    let (code, stdout, stderr) = ledger_audit(&s, false);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["mode"], "incremental");
    assert_eq!(report["ok"], true);
    let (code, stdout, _) = ledger_audit(&s, true);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()["mode"],
        "full"
    );

    // 1. A refund injected into the funding journal of a settled, COMMITTED transfer (money
    //    recorded as moved with no balance change).
    sqlx::query(
        "INSERT INTO funding_journal (req_id, operation, user_id, asset, amount, outcome)
         VALUES ($1, 'REFUND', 1, 'USDT', 30, 'APPLIED')",
    )
    .bind(out.req_id.to_string())
    .execute(&s.db.pool)
    .await
    .unwrap();
    // 2. A deposit applied in spot-core under a req_id that names no transfer.
    let ghost = ReqId::generate();
    let applied = s
        .spot_adapter
        .deposit(&Movement {
            req_id: ghost,
            user_id: user(9),
            asset: usdt(),
            amount: Amount::parse("5").unwrap(),
        })
        .await;
    assert_eq!(applied, AdapterOutcome::Success);

    let (inc, full) = both(&s).await;
    assert!(!inc.ok);
    let usdt_row = inc.assets.iter().find(|a| a.asset == "USDT").unwrap();
    assert_eq!(usdt_row.difference, dec("-30"), "{inc:#?}");
    let problems: Vec<(String, String)> = inc
        .disagreements
        .iter()
        .map(|d| (d.req_id.clone(), d.problem.clone()))
        .collect();
    assert!(problems.contains(&(
        out.req_id.to_string(),
        "refund applied but the transfer is COMMITTED".to_owned()
    )));
    assert!(problems.contains(&(
        ghost.to_string(),
        "money moved under a req_id that names no transfer".to_owned()
    )));
    assert_eq!(inc.disagreements.len(), 2, "{inc:#?}");
    assert_eq!(full.disagreements.len(), 2);

    // The incremental check keeps them open: the next run (reading nothing new) reports them
    // again, and the CLI exits 1.
    drain(&s).await;
    let (inc, full) = both(&s).await;
    assert_eq!(inc.disagreements.len(), 2);
    assert!(!full.ok);
    let (code, stdout, _) = ledger_audit(&s, false);
    assert_eq!(code, 1, "{stdout}");
    let (code, _, _) = ledger_audit(&s, true);
    assert_eq!(code, 1);
}

#[tokio::test]
async fn audit_incremental_reads_only_what_came_after_its_checkpoint() {
    let s = Stack::start().await;
    for u in 1..=4 {
        s.deposit(u, "USDT", "1000").await;
    }
    // History: 120 transfers.
    for i in 0..30 {
        for u in 1..=4 {
            let (from, to) = if i % 2 == 0 {
                (Funding, Spot)
            } else {
                (Spot, Funding)
            };
            s.transfer(u, from, to, "USDT", "1").await;
        }
    }
    let first = incremental(&s).await;
    assert!(first.read.transfers >= 120, "{:#?}", first.read);
    drain(&s).await;

    // New work: one external deposit, three transfers (each one FUNDING and one SPOT movement).
    s.deposit(1, "USDT", "5").await;
    for u in 1..=3 {
        s.transfer(u, Funding, Spot, "USDT", "2").await;
    }
    let r = incremental(&s).await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.read.transfers, 3, "{:#?}", r.read);
    assert_eq!(r.read.funding_journal_rows, 3, "{:#?}", r.read);
    assert_eq!(r.read.external_deposit_rows, 1, "{:#?}", r.read);
    assert_eq!(r.read.spot_records, 3, "{:#?}", r.read);
    assert_eq!(r.read.open_before, 0);
    let full = full(&s).await;
    assert_agree(&r, &full);
    assert!(full.read.transfers >= 123);
    assert!(full.read.funding_journal_rows >= 123);
}

#[tokio::test]
async fn audit_periodic_check_that_cannot_run_is_an_alert_and_a_metric() {
    let mut s = Stack::start().await;
    s.deposit(1, "USDT", "10").await;
    s.transfer(1, Funding, Spot, "USDT", "4").await;
    let ledger = LedgerProcess::start(
        &s.db.url,
        &s.spot,
        &[("LEDGER_INVARIANT_INTERVAL_SECS", "1")],
    );
    let http = reqwest::Client::new();
    let metrics = || async {
        http.get(&ledger.metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let wait_metric = |line: &'static str| {
        let metrics = &metrics;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let m = metrics().await;
                if m.lines().any(|l| l == line) {
                    return m;
                }
                assert!(Instant::now() < deadline, "never {line}:\n{m}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
        "SELECT last_success_at FROM audit_status",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap()
    .is_none()
    {
        assert!(Instant::now() < deadline, "no periodic run");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = wait_metric("ledger_audit_up 1").await;
    assert!(m.contains("ledger_audit_failures_total 0"), "{m}");
    assert!(
        !m.contains("ledger_audit_last_success_timestamp_seconds 0.0"),
        "{m}"
    );

    // spot-core down: CRITICAL once, up 0, failures counted.
    s.spot.kill();
    ledger
        .wait_log("CRITICAL AUDIT_UNAVAILABLE", Duration::from_secs(30))
        .await;
    let m = wait_metric("ledger_audit_up 0").await;
    assert!(!m.contains("ledger_audit_failures_total 0"), "{m}");
    s.spot.restart();
    wait_metric("ledger_audit_up 1").await;
    ledger
        .wait_log(
            "the periodic fund-conservation check runs again",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        ledger.log().matches("CRITICAL AUDIT_UNAVAILABLE").count(),
        1
    );

    // The checkpoint unreadable: the same alert, and `ledger audit` exits 2.
    sqlx::query("INSERT INTO audit_checkpoint_open (req_id, applied) VALUES ('x', '{\"no\": 1}')")
        .execute(&s.db.pool)
        .await
        .unwrap();
    wait_metric("ledger_audit_up 0").await;
    let error: Option<String> =
        sqlx::query_scalar("SELECT last_error FROM audit_status WHERE id = 1")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert!(error.unwrap_or_default().contains("unreadable"));
    assert_eq!(
        ledger.log().matches("CRITICAL AUDIT_UNAVAILABLE").count(),
        2
    );
    let (code, _, stderr) = ledger_audit(&s, false);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unreadable"), "{stderr}");
    // A full check does not read the checkpoint.
    let (code, _, stderr) = ledger_audit(&s, true);
    assert_eq!(code, 0, "{stderr}");
}

/// The port a killed spot-core freed can be taken by another engine (every test starts its
/// own on port 0, and other suites may run beside this one). The ledger still dials the old
/// address; whatever answers there must not be taken for its engine: the periodic check cannot
/// run (`up` false, failures counted) and never decides over another engine's balances.
#[tokio::test]
async fn audit_periodic_check_never_decides_over_another_engine_on_the_same_port() {
    let mut s = Stack::start().await;
    s.deposit(1, "USDT", "10").await;
    s.transfer(1, Funding, Spot, "USDT", "4").await;
    let ledger = LedgerProcess::start(
        &s.db.url,
        &s.spot,
        &[("LEDGER_INVARIANT_INTERVAL_SECS", "1")],
    );
    let status = || async {
        sqlx::query_as::<_, (bool, i64, Option<chrono::DateTime<chrono::Utc>>)>(
            "SELECT up, failures, last_success_at FROM audit_status WHERE id = 1",
        )
        .fetch_one(&s.db.pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while status().await.2.is_none() {
        assert!(Instant::now() < deadline, "no periodic run");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    s.spot.kill();
    ledger
        .wait_log("CRITICAL AUDIT_UNAVAILABLE", Duration::from_secs(30))
        .await;
    let (_, failed, last_success) = status().await;
    // Another engine, with its own data and its own token, on the freed port.
    let stranger = SpotProcess::start_on(&s.spot.addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = status().await;
        assert_eq!(
            (now.0, now.2),
            (false, last_success),
            "a periodic run decided while its spot-core was down: {now:?}\n{}",
            ledger.log()
        );
        if now.1 >= failed + 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the periodic check stopped: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!ledger.log().contains("FUND_CONSERVATION_VIOLATED"));

    // Its own engine back on its address: the check decides again.
    drop(stranger);
    s.spot.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !status().await.0 {
        assert!(
            Instant::now() < deadline,
            "the periodic check never ran again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two incremental checks at once (as two ledgers' periodic checks overlap) while transfers
/// commit: each run's checkpoint is read in one snapshot, so no run pairs one checkpoint's
/// positions with another's open set, and no run reports a violation that is not there (a torn
/// read reported "COMMITTED, but no deposit was applied" for req_ids a concurrent run had just
/// settled). At the end the incremental and full checks agree.
#[tokio::test]
async fn audit_overlapping_incremental_runs_never_report_a_false_violation() {
    let s = Stack::start().await;
    for u in 61..=64 {
        s.deposit(u, "USDT", "1000000").await;
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let traffic = async {
        let mut n = 0u64;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let u = 61 + n % 4;
            submit(&s.coordinator, u, Funding, Spot, "3").await;
            submit(&s.coordinator, u, Spot, Funding, "1").await;
            n += 1;
        }
    };
    let checker = |runs: usize| {
        let s = &s;
        async move {
            let mut false_alarms = Vec::new();
            for _ in 0..runs {
                let r = incremental(s).await;
                if !r.ok {
                    false_alarms.push(r.disagreements);
                }
            }
            false_alarms
        }
    };
    let checks = async {
        let found = tokio::join!(checker(150), checker(150), checker(150));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        found
    };
    let ((a, b, c), ()) = tokio::join!(checks, traffic);
    for alarms in [a, b, c] {
        assert!(alarms.is_empty(), "false violations: {alarms:#?}");
    }
    drain(&s).await;
    both(&s).await;
    s.assert_invariant_exact().await;
}
