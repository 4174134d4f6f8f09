//! CRA-001..006 with real processes: `ledger serve` runs as a child that aborts exactly at a
//! crash point (`LEDGER_FAILPOINT`), is started again without it, and its recovery worker brings
//! the transfer to the right terminal state with balances, journals and conservation right.
//! Each crash also checks which events were durable and which calls were made when it struck.
//! INIT and SOURCE_DONE are durable alone only in old logs (their announcements now share the
//! commit before them); the `old_log` tests recover those.
//! Also spot-core's WAL: a record cut mid-way and a tail with flipped bits are dropped on
//! restart while every acknowledged operation is kept.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use cqrs_es::persist::PersistedEventStore;
use cqrs_es::EventStore;
use domain::{AssetSymbol, TransferState, UserId};
use postgres_es::PostgresEventRepository;
use serde_json::json;

use crate::helpers::{dec, token, Stack};
use crate::procs::{all_req_ids, spot_ops, state_of, wait_terminal, LedgerProcess, RECOVER_NOW};
use domain::ReqId;

/// Deliberately never retried by the worker of the crashing process: only the restarted one
/// recovers.
const NO_RECOVERY: [(&str, &str); 1] = [("LEDGER_RECOVERY_STALE_MS", "3600000")];

struct Crash {
    failpoint: &'static str,
    /// The state the transfer is left in by the crash.
    left_in: TransferState,
    /// The events durable at the crash, in order.
    log_left: &'static [&'static str],
    /// The FUNDING journal's operations at the crash: which outside calls were made.
    funding_calls_left: &'static [&'static str],
    /// Disable the user's SPOT account first, so the deposit is refused (compensation path).
    spot_refuses: bool,
}

/// What each commit of a transfer makes durable since the withdraw's and the deposit's
/// announcements share a commit with the event before them: three commits, then the outcome.
const ANNOUNCED_WITHDRAW: &[&str] = &["TransferCreated", "SourceWithdrawStarted"];
const ANNOUNCED_DEPOSIT: &[&str] = &[
    "TransferCreated",
    "SourceWithdrawStarted",
    "SourceWithdrawn",
    "TargetDepositStarted",
];
const COMPENSATING: &[&str] = &[
    "TransferCreated",
    "SourceWithdrawStarted",
    "SourceWithdrawn",
    "TargetDepositStarted",
    "CompensationStarted",
];

/// Runs one FUNDING→SPOT transfer of 40 USDT (user 1 holds 100) through a process that aborts at
/// the fail point, restarts, and checks the outcome. Returns the stack for extra checks.
async fn crash_and_recover(c: Crash) -> (Stack, domain::TransferData) {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    if c.spot_refuses {
        s.spot_adapter
            .set_status(
                UserId::new(1).unwrap(),
                &AssetSymbol::parse("USDT").unwrap(),
                adapters::AccountStatus::Disabled,
            )
            .await
            .unwrap();
    }
    let mut env = vec![
        ("LEDGER_FAILPOINT", c.failpoint),
        ("LEDGER_ALLOW_FAILPOINTS", "1"),
    ];
    env.extend(NO_RECOVERY);
    let mut crashing = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let token = token(1, false);
    crashing
        .post_until_the_fail_point(
            "/api/v1/internal_transfer",
            &token,
            json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "40"}),
            c.failpoint,
        )
        .await;

    let ids = all_req_ids(&s).await;
    assert_eq!(ids.len(), 1, "exactly one transfer was created");
    let req_id = ids[0];
    assert_eq!(
        state_of(&s, &req_id).await,
        c.left_in,
        "state left by the crash"
    );
    assert_eq!(
        s.event_types(&req_id.to_string()).await,
        c.log_left,
        "events durable at the crash"
    );
    let journal = s.funding.journal_for(&req_id.to_string()).await.unwrap();
    let calls: Vec<_> = journal.iter().map(|j| j.operation.as_str()).collect();
    assert_eq!(calls, c.funding_calls_left, "calls made before the crash");

    recover(s, req_id).await
}

/// Starts a process whose worker recovers everything at once, waits for `req_id` to end, and
/// checks conservation and that no operation was made twice in either system.
async fn recover(s: Stack, req_id: ReqId) -> (Stack, domain::TransferData) {
    let _recovering = LedgerProcess::start(&s.db.url, &s.spot, &RECOVER_NOW);
    let t = wait_terminal(&s, &req_id, Duration::from_secs(30)).await;
    s.assert_conserved(1, "USDT").await;
    assert_eq!(s.in_flight(1, "USDT").await, dec("0"));
    // Each (req_id, operation) at most once in each system.
    let journal = s.funding.journal_for(&req_id.to_string()).await.unwrap();
    let mut ops: Vec<_> = journal.iter().map(|j| j.operation).collect();
    ops.dedup();
    assert_eq!(ops.len(), journal.len(), "funding journal repeats an op");
    let spot = spot_ops(&s, &req_id).await;
    let mut spot_kinds: Vec<_> = spot.iter().map(|(op, _)| op.clone()).collect();
    spot_kinds.sort();
    spot_kinds.dedup();
    assert_eq!(spot_kinds.len(), spot.len(), "spot-core repeats an op");
    (s, t)
}

async fn assert_committed(s: &Stack, t: &domain::TransferData) {
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(s.funding_balance(1, "USDT").await, dec("60"));
    assert_eq!(s.spot_balance(1, "USDT").await, dec("40"));
    let journal = s.funding.journal_for(&t.req_id.to_string()).await.unwrap();
    let ops: Vec<_> = journal
        .iter()
        .map(|j| (j.operation.as_str(), j.applied))
        .collect();
    assert_eq!(ops, [("WITHDRAW", true)]);
    assert_eq!(
        spot_ops(s, &t.req_id).await,
        [("DEPOSIT".to_owned(), "APPLIED".to_owned())]
    );
}

/// CRA-001: the crash right after the create's commit, which makes `TransferCreated` and
/// `SourceWithdrawStarted` durable together: SOURCE_PENDING, the withdraw announced and not
/// called. (INIT is no longer durable alone; an old log's INIT is `cra_001_old_log_...`.)
#[tokio::test]
async fn cra_001_crash_after_the_create_commit_recovery_starts_the_withdraw() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "after_created_withdraw_started",
        left_in: TransferState::SourcePending,
        log_left: ANNOUNCED_WITHDRAW,
        funding_calls_left: &[],
        spot_refuses: false,
    })
    .await;
    assert_committed(&s, &t).await;
}

#[tokio::test]
async fn cra_002_crash_in_source_pending_before_the_call_recovery_withdraws_once() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "source_pending_before_call",
        left_in: TransferState::SourcePending,
        log_left: ANNOUNCED_WITHDRAW,
        funding_calls_left: &[],
        spot_refuses: false,
    })
    .await;
    assert_committed(&s, &t).await;
}

#[tokio::test]
async fn cra_003_crash_after_the_withdraw_before_recording_it_is_not_repeated() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "source_after_call",
        left_in: TransferState::SourcePending,
        log_left: ANNOUNCED_WITHDRAW,
        funding_calls_left: &["WITHDRAW"],
        spot_refuses: false,
    })
    .await;
    assert_committed(&s, &t).await;
}

/// CRA-004: the crash right after the commit that makes `SourceWithdrawn` and
/// `TargetDepositStarted` durable together: TARGET_PENDING, the deposit announced and not
/// called. (SOURCE_DONE is no longer durable alone; an old log's is `cra_004_old_log_...`.)
#[tokio::test]
async fn cra_004_crash_after_the_withdrawn_commit_recovery_starts_the_deposit() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "after_withdrawn_deposit_started",
        left_in: TransferState::TargetPending,
        log_left: ANNOUNCED_DEPOSIT,
        funding_calls_left: &["WITHDRAW"],
        spot_refuses: false,
    })
    .await;
    assert_committed(&s, &t).await;
}

#[tokio::test]
async fn cra_005_crash_in_target_pending_before_the_call_recovery_deposits_once() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "target_pending_before_call",
        left_in: TransferState::TargetPending,
        log_left: ANNOUNCED_DEPOSIT,
        funding_calls_left: &["WITHDRAW"],
        spot_refuses: false,
    })
    .await;
    assert_committed(&s, &t).await;
}

/// CRA-005 after the call, and FND-003 (money from nothing: the target credited twice): the
/// deposit reached spot-core and the crash lost its answer; recovery's retry finds it applied,
/// so SPOT is credited once and spot-core records one DEPOSIT.
#[tokio::test]
async fn cra_005_fnd_003_crash_after_the_deposit_before_recording_it_credits_once() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "target_after_call",
        left_in: TransferState::TargetPending,
        log_left: ANNOUNCED_DEPOSIT,
        funding_calls_left: &["WITHDRAW"],
        spot_refuses: false,
    })
    .await;
    assert_committed(&s, &t).await;
}

async fn assert_rolled_back(s: &Stack, t: &domain::TransferData) {
    assert_eq!(t.state, TransferState::RolledBack);
    assert_eq!(s.funding_balance(1, "USDT").await, dec("100"));
    assert_eq!(s.spot_balance(1, "USDT").await, dec("0"));
    let journal = s.funding.journal_for(&t.req_id.to_string()).await.unwrap();
    let ops: Vec<_> = journal
        .iter()
        .map(|j| (j.operation.as_str(), j.applied))
        .collect();
    assert_eq!(ops, [("WITHDRAW", true), ("REFUND", true)]);
}

#[tokio::test]
async fn cra_006_crash_in_compensating_before_the_refund_recovery_refunds_once() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "compensating_before_refund",
        left_in: TransferState::Compensating,
        log_left: COMPENSATING,
        funding_calls_left: &["WITHDRAW"],
        spot_refuses: true,
    })
    .await;
    assert_rolled_back(&s, &t).await;
}

#[tokio::test]
async fn cra_006_crash_after_the_refund_before_recording_it_is_not_repeated() {
    let (s, t) = crash_and_recover(Crash {
        failpoint: "compensating_after_refund",
        left_in: TransferState::Compensating,
        log_left: COMPENSATING,
        funding_calls_left: &["WITHDRAW", "REFUND"],
        spot_refuses: true,
    })
    .await;
    assert_rolled_back(&s, &t).await;
}

/// A transfer left in INIT or SOURCE_DONE by a log written before those states' announcements
/// shared a commit (one event per commit, as `ledger` wrote them then). A process whose worker
/// resumes it aborts at the state's fail point, before the announcement; the next process
/// recovers it.
async fn old_log_crash_and_recover(left_in: TransferState) -> (Stack, domain::TransferData) {
    use domain::{AccountPort, Amount, Movement, Transfer, TransferEvent};
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    let store: PersistedEventStore<PostgresEventRepository, Transfer> =
        PersistedEventStore::new_event_store(PostgresEventRepository::new(s.db.pool.clone()));
    let req_id = ReqId::generate();
    let id = req_id.to_string();
    let user = UserId::new(1).unwrap();
    let usdt = AssetSymbol::parse("USDT").unwrap();
    let amount = Amount::parse("40").unwrap();
    let at = chrono::Utc::now;
    let commit_one = |event: TransferEvent| {
        let store = &store;
        let id = &id;
        async move {
            let ctx = store.load_aggregate(id).await.unwrap();
            store
                .commit(vec![event], ctx, HashMap::new())
                .await
                .unwrap();
        }
    };
    commit_one(TransferEvent::TransferCreated {
        req_id,
        user_id: user,
        from: domain::AccountType::Funding,
        to: domain::AccountType::Spot,
        asset: usdt.clone(),
        amount,
        cid: None,
        at: at(),
    })
    .await;
    let failpoint = if left_in == TransferState::SourceDone {
        commit_one(TransferEvent::SourceWithdrawStarted { at: at() }).await;
        let movement = Movement {
            req_id,
            user_id: user,
            asset: usdt,
            amount,
        };
        assert_eq!(
            s.funding.withdraw(&movement).await,
            domain::AdapterOutcome::Success
        );
        commit_one(TransferEvent::SourceWithdrawn { at: at() }).await;
        "after_source_done"
    } else {
        "after_init"
    };
    assert_eq!(state_of(&s, &req_id).await, left_in);

    // The crashing worker's lease on the transfer must run out soon for the next process.
    let mut env = vec![
        ("LEDGER_FAILPOINT", failpoint),
        ("LEDGER_ALLOW_FAILPOINTS", "1"),
        ("LEDGER_RECOVERY_LEASE_MS", "500"),
    ];
    env.extend(RECOVER_NOW);
    let mut crashing = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let status = crashing.wait_exit(Duration::from_secs(15));
    assert!(!status.success(), "aborted, not exited cleanly: {status}");
    assert!(crashing.log().contains(&format!("fail point {failpoint}")));
    assert_eq!(
        state_of(&s, &req_id).await,
        left_in,
        "nothing committed past the fail point"
    );
    recover(s, req_id).await
}

#[tokio::test]
async fn cra_001_old_log_left_in_init_recovery_starts_the_withdraw() {
    let (s, t) = old_log_crash_and_recover(TransferState::Init).await;
    assert_committed(&s, &t).await;
    assert_eq!(
        s.event_types(&t.req_id.to_string()).await,
        [
            "TransferCreated",
            "SourceWithdrawStarted",
            "SourceWithdrawn",
            "TargetDepositStarted",
            "TransferCommitted"
        ]
    );
}

#[tokio::test]
async fn cra_004_old_log_left_in_source_done_recovery_starts_the_deposit() {
    let (s, t) = old_log_crash_and_recover(TransferState::SourceDone).await;
    assert_committed(&s, &t).await;
}

/// Acknowledged operations survive any damage to what follows them in the WAL: a record cut
/// mid-way (a torn write) and a whole record with flipped bits (a failed checksum) are both
/// dropped on restart, the file is truncated back to the last good record, and the engine keeps
/// working with numbering continuing.
#[tokio::test]
async fn fnd_005_spot_wal_torn_or_bit_flipped_tail_is_dropped_and_acked_ops_kept() {
    let mut s = Stack::start().await;
    let spot = s.spot_adapter.clone();
    // The first WAL segment (default size: every record of this test is in it).
    let wal = s.spot.data_dir.join(spot_core::storage::segment_name(1));
    let user = UserId::new(9).unwrap();
    let usdt = AssetSymbol::parse("USDT").unwrap();
    let mut acked = Vec::new();
    let mut frame = Vec::new();
    for i in 0..5 {
        let before = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        let m = domain::Movement {
            req_id: domain::ReqId::generate(),
            user_id: user,
            asset: usdt.clone(),
            amount: domain::Amount::parse(&format!("1{i}")).unwrap(),
        };
        use domain::AccountPort;
        assert_eq!(spot.deposit(&m).await, domain::AdapterOutcome::Success);
        acked.push(m.req_id);
        let bytes = std::fs::read(&wal).unwrap();
        frame = bytes[usize::try_from(before).unwrap()..].to_vec();
    }
    let good_len = std::fs::metadata(&wal).unwrap().len();
    let total = dec("60"); // 10 + 11 + 12 + 13 + 14

    for damage in ["cut mid-record", "flipped bits"] {
        s.spot.kill();
        let mut tail = frame.clone();
        match damage {
            "cut mid-record" => tail.truncate(tail.len() / 2),
            _ => {
                let last = tail.len() - 3;
                tail[last] ^= 0b1010_0101;
            }
        }
        let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
        f.write_all(&tail).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert!(std::fs::metadata(&wal).unwrap().len() > good_len);

        s.spot.restart();
        assert_eq!(
            std::fs::metadata(&wal).unwrap().len(),
            good_len,
            "{damage}: the damaged tail is truncated"
        );
        assert_eq!(s.spot_balance(9, "USDT").await, total, "{damage}");
        for req_id in &acked {
            assert_eq!(
                spot_ops(&s, req_id).await,
                [("DEPOSIT".to_owned(), "APPLIED".to_owned())],
                "{damage}: acknowledged {req_id} kept"
            );
        }
    }
    // Still a working engine: a new operation is accepted and lands after the good records.
    s.transfer_back_check().await;
}

impl Stack {
    /// One more SPOT deposit after a recovery, for the WAL test.
    async fn transfer_back_check(&self) {
        use domain::AccountPort;
        let m = domain::Movement {
            req_id: domain::ReqId::generate(),
            user_id: UserId::new(9).unwrap(),
            asset: AssetSymbol::parse("USDT").unwrap(),
            amount: domain::Amount::parse("1").unwrap(),
        };
        assert_eq!(
            self.spot_adapter.deposit(&m).await,
            domain::AdapterOutcome::Success
        );
        assert_eq!(self.spot_balance(9, "USDT").await, dec("61"));
    }
}
