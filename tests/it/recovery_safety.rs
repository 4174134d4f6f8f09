//! Recovery and manual resolution under the faults that could move money wrongly: NOT_APPLIED
//! cancels the pending call in the account system before it is recorded (a late copy is refused), a
//! req_id recorded for another movement refuses every resolution, the worker finds open transfers
//! with the projector frozen, a refused refund is surfaced at once, leases are renewed during slow
//! drives, a failing follow-up drive does not turn a recorded resolution into an error, daily
//! limits can be given back.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use application::{Coordinator, ManualResolutionError, NewTransfer};
use async_trait::async_trait;
use domain::AccountType::{Funding, Spot};
use domain::{
    AccountPort, AccountType, AdapterOutcome, Amount, AssetSymbol, Movement, Operation, Recorded,
    Resolution, TransferData, TransferState, UserId,
};
use recovery::{RecoveryConfig, RecoveryWorker};
use reqwest::Method;
use serde_json::json;

use crate::helpers::{dec, ApiStack, Stack, TestDb};

fn fast() -> RecoveryConfig {
    RecoveryConfig {
        stale_after: Duration::ZERO,
        interval: Duration::from_millis(20),
        backoff_ms_base: 1,
        backoff_ms_max: 5,
        ..RecoveryConfig::default()
    }
}

/// A port over a real one whose chosen calls never reach it (the call is "queued or in flight":
/// the caller hears a timeout), or take a while before they do.
struct Held {
    inner: Arc<dyn AccountPort>,
    kind: AccountType,
    /// Calls of this operation answer Timeout without reaching the account system.
    hold: Option<Operation>,
    /// Every lookup and call waits this long first.
    delay: Duration,
    /// Called after a real refund, once (see the follow-up drive test).
    after_refund: OnceLock<Coordinator>,
    after_refund_done: AtomicBool,
}

impl Held {
    fn new(inner: Arc<dyn AccountPort>, kind: AccountType, hold: Option<Operation>) -> Self {
        Self {
            inner,
            kind,
            hold,
            delay: Duration::ZERO,
            after_refund: OnceLock::new(),
            after_refund_done: AtomicBool::new(false),
        }
    }

    async fn call(&self, op: Operation, m: &Movement) -> AdapterOutcome {
        tokio::time::sleep(self.delay).await;
        if self.hold == Some(op) {
            return AdapterOutcome::Timeout;
        }
        match op {
            Operation::Withdraw => self.inner.withdraw(m).await,
            Operation::Deposit => self.inner.deposit(m).await,
            Operation::Refund => self.inner.refund(m).await,
        }
    }
}

#[async_trait]
impl AccountPort for Held {
    fn account_type(&self) -> AccountType {
        self.kind
    }
    async fn withdraw(&self, m: &Movement) -> AdapterOutcome {
        self.call(Operation::Withdraw, m).await
    }
    async fn deposit(&self, m: &Movement) -> AdapterOutcome {
        self.call(Operation::Deposit, m).await
    }
    async fn refund(&self, m: &Movement) -> AdapterOutcome {
        let outcome = self.call(Operation::Refund, m).await;
        if let Some(other) = self.after_refund.get() {
            if !self.after_refund_done.swap(true, Ordering::SeqCst) {
                // Another writer finishes the transfer first: the caller's next commit conflicts.
                other
                    .drive(&m.req_id)
                    .await
                    .expect("the other writer drives");
            }
        }
        outcome
    }
    async fn lookup(&self, m: &Movement, op: Operation) -> Recorded {
        tokio::time::sleep(self.delay).await;
        self.inner.lookup(m, op).await
    }
    async fn cancel(&self, m: &Movement, op: Operation) -> Recorded {
        self.inner.cancel(m, op).await
    }
}

fn new_transfer(user: u64, from: AccountType, to: AccountType, amount: &str) -> NewTransfer {
    NewTransfer {
        user_id: UserId::new(user).unwrap(),
        from,
        to,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse(amount).unwrap(),
        cid: None,
    }
}

fn movement(t: &TransferData) -> Movement {
    Movement {
        req_id: t.req_id,
        user_id: t.user_id,
        asset: t.asset.clone(),
        amount: t.amount,
    }
}

/// A log sink for the current thread's tracing events.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Manual NOT_APPLIED and a late call: a withdraw still queued when the operator says NOT_APPLIED
/// must never land after the transfer is FAILED. The resolution first records a CANCELLED refusal
/// in the funding journal, so the late copy is refused and the money stays.
#[tokio::test]
async fn recovery_manual_not_applied_cancels_the_pending_call_so_a_late_copy_is_refused() {
    let s = Stack::start().await;
    s.deposit(11, "USDT", "10").await;
    let coordinator = adapters::pg::coordinator(
        s.db.pool.clone(),
        Arc::new(Held::new(
            Arc::new(s.funding.clone()),
            Funding,
            Some(Operation::Withdraw),
        )),
        Arc::new(s.spot_adapter.clone()),
        s.assets.clone(),
    );
    let t = coordinator
        .submit(new_transfer(11, Funding, Spot, "4"))
        .await
        .unwrap();
    assert_eq!(t.state, TransferState::SourcePending);

    let resolved = coordinator
        .manually_resolve(
            &t.req_id,
            Resolution::NotApplied,
            "admin:1",
            "ops: withdraw not in the journal",
            false,
        )
        .await
        .expect("NOT_APPLIED accepted once the call is cancelled");
    assert_eq!(resolved.data.state, TransferState::Failed);

    // The queued copy of the withdraw arrives now.
    let late = s.funding.withdraw(&movement(&t)).await;
    assert!(
        matches!(&late, AdapterOutcome::ExplicitFail { code, .. } if code == "CANCELLED"),
        "a late withdraw must be refused: {late:?}"
    );
    assert_eq!(s.funding_balance(11, "USDT").await, dec("10"));
    s.assert_conserved(11, "USDT").await;

    // And where the call did land first, NOT_APPLIED is contradicted.
    let t2 = coordinator
        .submit(new_transfer(11, Funding, Spot, "3"))
        .await
        .unwrap();
    assert_eq!(
        s.funding.withdraw(&movement(&t2)).await,
        AdapterOutcome::Success
    );
    let refused = coordinator
        .manually_resolve(&t2.req_id, Resolution::NotApplied, "admin:1", "x", false)
        .await;
    assert!(
        matches!(refused, Err(ManualResolutionError::Contradicted(_))),
        "{refused:?}"
    );
    // The lease taken for the resolution is released.
    let leased: Option<String> =
        sqlx::query_scalar("SELECT lease_owner FROM transfer_retries WHERE req_id = $1")
            .bind(t2.req_id.to_string())
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(leased, None);
}

/// Manual NOT_APPLIED without a cancel: where the account system cannot durably cancel (spot-core
/// down), NOT_APPLIED is refused with 503 ACCOUNT_SYSTEM_UNAVAILABLE; `force: true` records it,
/// marked in the reason. A worker holding the lease makes the resolution wait its turn (409
/// TRANSFER_BUSY).
#[tokio::test]
async fn recovery_manual_not_applied_refused_when_cancel_unavailable_unless_forced() {
    let mut api = ApiStack::start().await;
    api.stack.deposit(12, "USDT", "10").await;
    let funded = api.stack.transfer(12, Funding, Spot, "USDT", "10").await;
    assert_eq!(funded.state, TransferState::Committed);
    api.stack.spot.kill();
    let t = api.stack.transfer(12, Spot, Funding, "USDT", "4").await;
    assert_eq!(t.state, TransferState::SourcePending);
    let admin = api.token(1, true);
    let path = format!("/api/v1/admin/transfers/{}/resolve", t.req_id);

    sqlx::query(
        "INSERT INTO transfer_retries (req_id, state, lease_owner, lease_until)
         VALUES ($1, 'SOURCE_PENDING', 'some-worker', now() + interval '1 minute')",
    )
    .bind(t.req_id.to_string())
    .execute(&api.stack.db.pool)
    .await
    .unwrap();
    let (status, body) = api
        .call(
            Method::POST,
            &path,
            Some(&admin),
            Some(json!({"resolution": "NOT_APPLIED", "reason": "no withdraw seen"})),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("TRANSFER_BUSY")),
        "{body}"
    );
    sqlx::query("UPDATE transfer_retries SET lease_owner = NULL, lease_until = NULL")
        .execute(&api.stack.db.pool)
        .await
        .unwrap();

    let (status, body) = api
        .call(
            Method::POST,
            &path,
            Some(&admin),
            Some(json!({"resolution": "NOT_APPLIED", "reason": "no withdraw seen"})),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("ACCOUNT_SYSTEM_UNAVAILABLE")),
        "{body}"
    );
    assert_eq!(
        api.stack
            .coordinator
            .load(&t.req_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        TransferState::SourcePending,
        "nothing recorded"
    );
    let (status, body) = api
        .call(
            Method::POST,
            &path,
            Some(&admin),
            Some(json!({"resolution": "NOT_APPLIED", "reason": "spot-core disk lost", "force": "yes"})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = api
        .call(
            Method::POST,
            &path,
            Some(&admin),
            Some(json!({"resolution": "NOT_APPLIED", "reason": "spot-core disk lost", "force": true})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "FAILED", "{body}");
    let stored: serde_json::Value = sqlx::query_scalar(
        "SELECT payload FROM events WHERE aggregate_id = $1 AND event_type = 'TransferManuallyResolved'",
    )
    .bind(t.req_id.to_string())
    .fetch_one(&api.stack.db.pool)
    .await
    .unwrap();
    let reason = stored["TransferManuallyResolved"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.starts_with("spot-core disk lost"), "{reason}");
    assert!(reason.contains("[FORCED"), "{reason}");
}

/// A req_id recorded for another movement: a req_id the account system recorded for another amount
/// refuses both resolutions; it is a mismatch, not "cannot tell", so the operator's word does not
/// stand.
#[tokio::test]
async fn recovery_manual_resolution_refused_when_req_id_recorded_for_another_movement() {
    let s = Stack::start().await;
    s.deposit(13, "USDT", "10").await;
    let funded = s.transfer(13, Funding, Spot, "USDT", "10").await;
    assert_eq!(funded.state, TransferState::Committed);
    let coordinator = adapters::pg::coordinator(
        s.db.pool.clone(),
        Arc::new(Held::new(
            Arc::new(s.funding.clone()),
            Funding,
            Some(Operation::Deposit),
        )),
        Arc::new(s.spot_adapter.clone()),
        s.assets.clone(),
    );
    let t = coordinator
        .submit(new_transfer(13, Spot, Funding, "5"))
        .await
        .unwrap();
    assert_eq!(t.state, TransferState::TargetPending);
    // The same req_id used for a different deposit (a bug or an attack).
    let other = Movement {
        amount: Amount::parse("1").unwrap(),
        ..movement(&t)
    };
    assert_eq!(s.funding.deposit(&other).await, AdapterOutcome::Success);
    assert!(matches!(
        s.funding.lookup(&movement(&t), Operation::Deposit).await,
        Recorded::Mismatch(_)
    ));
    for resolution in [Resolution::Applied, Resolution::NotApplied] {
        let answer = coordinator
            .manually_resolve(&t.req_id, resolution, "admin:1", "x", false)
            .await;
        assert!(
            matches!(answer, Err(ManualResolutionError::Mismatch(_))),
            "{resolution:?}: {answer:?}"
        );
        let forced = coordinator
            .manually_resolve(&t.req_id, resolution, "admin:1", "x", true)
            .await;
        assert!(
            matches!(forced, Err(ManualResolutionError::Mismatch(_))),
            "force never overrides a mismatch: {forced:?}"
        );
    }
    assert_eq!(
        coordinator.load(&t.req_id).await.unwrap().unwrap().state,
        TransferState::TargetPending
    );
    // The worker leaves it open too, categorised MISMATCH.
    let worker = RecoveryWorker::with_config(coordinator.clone(), s.db.pool.clone(), fast());
    worker.pass().await.unwrap();
    let rows = recovery::stuck_transfers(&s.db.pool, Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].last_error_category.as_deref(), Some("MISMATCH"));
}

/// The projector frozen: an idle transaction elsewhere on the server holds the projector's horizon,
/// so the read models never see a new transfer; the worker still finds it (from the event log) and
/// finishes it, and a stalled projector is raised as CRITICAL.
#[tokio::test]
async fn recovery_worker_finds_open_transfers_while_the_projector_is_frozen() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut s = Stack::start().await;
    s.deposit(14, "USDT", "10").await;
    s.wait_for_projections().await;
    // Idle in transaction, with a transaction id: every later event is above the horizon.
    let mut held = s.db.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *held)
        .await
        .unwrap();

    s.spot.kill();
    let t = s.transfer(14, Funding, Spot, "USDT", "4").await;
    assert_eq!(t.state, TransferState::TargetPending);
    s.spot.restart();

    let worker = RecoveryWorker::with_config(
        s.coordinator.clone(),
        s.db.pool.clone(),
        RecoveryConfig {
            projector_stalled_alert_after: Duration::ZERO,
            ..fast()
        },
    )
    .watching(Arc::new(ledger::startup::ProjectorHealth::new(
        s.db.pool.clone(),
    )));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        worker.pass().await.unwrap();
        let now = s.coordinator.load(&t.req_id).await.unwrap().unwrap();
        if now.state == TransferState::Committed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never recovered: {:?}",
            now.state
        );
    }
    let in_view: Option<String> =
        sqlx::query_scalar("SELECT state FROM transfers_view WHERE req_id = $1")
            .bind(t.req_id.to_string())
            .fetch_optional(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(in_view, None, "the projector really was frozen");
    for _ in 0..recovery::worker::PROJECTOR_FAILED_PASSES_CRITICAL {
        worker.pass().await.unwrap();
    }
    let log = captured.text();
    assert_eq!(
        log.matches("CRITICAL PROJECTOR_STALLED").count(),
        1,
        "raised once per stall: {log}"
    );

    held.rollback().await.unwrap();
    s.assert_conserved(14, "USDT").await;
    let open: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM open_transfers")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(open, 0, "a terminal transfer leaves open_transfers");
}

/// A refused refund: a refund the source recorded as REFUSED cannot succeed by retrying: MON-002 is
/// raised at the first such attempt, and the listing shows it as REFUND_REFUSED.
#[tokio::test]
async fn recovery_refused_refund_is_listed_refund_refused_with_mon_002_at_once() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let s = Stack::start().await;
    s.deposit(15, "USDT", "10").await;
    s.spot_adapter
        .set_status(
            UserId::new(15).unwrap(),
            &AssetSymbol::parse("USDT").unwrap(),
            adapters::AccountStatus::Disabled,
        )
        .await
        .unwrap();
    let requesting = adapters::pg::coordinator(
        s.db.pool.clone(),
        Arc::new(Held::new(
            Arc::new(s.funding.clone()),
            Funding,
            Some(Operation::Refund),
        )),
        Arc::new(s.spot_adapter.clone()),
        s.assets.clone(),
    );
    let t = requesting
        .submit(new_transfer(15, Funding, Spot, "4"))
        .await
        .unwrap();
    assert_eq!(t.state, TransferState::Compensating);
    // The source refused the refund for good (recorded refusal under its key).
    sqlx::query(
        "INSERT INTO funding_journal (req_id, operation, user_id, asset, amount, outcome, code)
         VALUES ($1, 'REFUND', 15, 'USDT', 4, 'REFUSED', 'NO_MATCHING_WITHDRAW')",
    )
    .bind(t.req_id.to_string())
    .execute(&s.db.pool)
    .await
    .unwrap();

    let worker = RecoveryWorker::with_config(s.coordinator.clone(), s.db.pool.clone(), fast());
    worker.pass().await.unwrap();
    let log = captured.text();
    let alert = log
        .lines()
        .find(|l| l.contains("CRITICAL MON-002"))
        .unwrap_or_else(|| panic!("MON-002 after one refused refund: {log}"));
    assert!(alert.contains(&t.req_id.to_string()), "{alert}");
    assert!(alert.contains("REFUND_REFUSED"), "{alert}");
    let rows = recovery::stuck_transfers(&s.db.pool, Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, "COMPENSATING");
    assert_eq!(rows[0].status, "REFUND_REFUSED");
    assert_eq!(
        rows[0].last_error_category.as_deref(),
        Some("REFUSED_BY_TARGET")
    );
    // Still refused as a manual ROLLED_BACK: the record says the refund never happened.
    let answer = s
        .coordinator
        .manually_resolve(
            &t.req_id,
            Resolution::Applied,
            "admin:1",
            "refunded by hand",
            false,
        )
        .await;
    assert!(
        matches!(answer, Err(ManualResolutionError::Contradicted(_))),
        "{answer:?}"
    );
}

/// A failing follow-up drive: the resolution is committed, then the follow-up drive fails (another
/// writer finished the transfer first): the answer is the resolution's, not an error.
#[tokio::test]
async fn recovery_manual_resolve_is_ok_when_the_follow_up_drive_fails() {
    let mut s = Stack::start().await;
    s.deposit(16, "USDT", "10").await;
    s.spot.kill();
    let t = s.transfer(16, Funding, Spot, "USDT", "4").await;
    assert_eq!(t.state, TransferState::TargetPending);
    s.spot.restart();
    let funding = Held::new(Arc::new(s.funding.clone()), Funding, None);
    let _ = funding.after_refund.set(s.another_coordinator());
    let coordinator = adapters::pg::coordinator(
        s.db.pool.clone(),
        Arc::new(funding),
        Arc::new(s.spot.adapter()),
        s.assets.clone(),
    );
    // `force`: spot-core's cancel may not be wired on every build; the deposit never happened.
    let resolved = coordinator
        .manually_resolve(
            &t.req_id,
            Resolution::NotApplied,
            "admin:1",
            "no deposit",
            true,
        )
        .await
        .expect("a committed resolution is answered as such");
    assert_eq!(resolved.data.state, TransferState::RolledBack);
    assert_eq!(s.funding_balance(16, "USDT").await, dec("10"));
    s.assert_conserved(16, "USDT").await;
}

/// The lease during a slow drive: a drive slower than the lease keeps it (renewed), so a second
/// worker cannot take the transfer mid-call.
#[tokio::test]
async fn recovery_worker_renews_its_lease_during_a_slow_drive() {
    let mut s = Stack::start().await;
    s.deposit(17, "USDT", "10").await;
    s.spot.kill();
    let t = s.transfer(17, Funding, Spot, "USDT", "4").await;
    assert_eq!(t.state, TransferState::TargetPending);
    s.spot.restart();
    let mut slow = Held::new(Arc::new(s.spot.adapter()), Spot, None);
    slow.delay = Duration::from_millis(2500);
    let slow_coordinator = adapters::pg::coordinator(
        s.db.pool.clone(),
        Arc::new(s.funding.clone()),
        Arc::new(slow),
        s.assets.clone(),
    );
    let config = RecoveryConfig {
        lease: Duration::from_millis(1000),
        ..fast()
    };
    let a = RecoveryWorker::with_config(slow_coordinator, s.db.pool.clone(), config.clone());
    let b = RecoveryWorker::with_config(s.another_coordinator(), s.db.pool.clone(), config);
    let first = tokio::spawn(async move { a.pass().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = b.pass().await.unwrap();
    assert_eq!(second.driven, 0, "the lease was still held");
    let first = first.await.unwrap();
    assert_eq!((first.driven, first.finished), (1, 1));
    let overlapping: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM recovery_attempts x JOIN recovery_attempts y
           ON x.req_id = y.req_id AND x.id < y.id
          AND tstzrange(x.started_at, COALESCE(x.finished_at, 'infinity'))
           && tstzrange(y.started_at, COALESCE(y.finished_at, 'infinity'))",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(overlapping, 0);
    s.assert_conserved(17, "USDT").await;
}

/// Daily limits given back: a reservation for a transfer that was not created can be given back.
#[tokio::test]
async fn recovery_daily_limit_reservation_is_released() {
    let s = Stack::start().await;
    let user = UserId::new(18).unwrap();
    let usdt = AssetSymbol::parse("USDT").unwrap();
    let limits = application::DailyLimits {
        count_max: Some(2),
        amount_max: [(usdt.clone(), dec("10"))].into_iter().collect(),
    };
    let day = application::daily::day_of(chrono::Utc::now());
    let five = application::Charge {
        user,
        asset: usdt.clone(),
        amount: Amount::parse("5").unwrap(),
    };
    for _ in 0..2 {
        adapters::pg::limits::reserve(&s.db.pool, &limits, &five, day)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(
        adapters::pg::limits::reserve(&s.db.pool, &limits, &five, day)
            .await
            .unwrap()
            .is_err()
    );
    adapters::pg::limits::release(&s.db.pool, &limits, &five, day)
        .await
        .unwrap();
    assert_eq!(
        adapters::pg::limits::usage(&s.db.pool, user, &usdt, day)
            .await
            .unwrap(),
        (1, dec("5"))
    );
    adapters::pg::limits::reserve(&s.db.pool, &limits, &five, day)
        .await
        .unwrap()
        .unwrap();
}

/// `open_transfers` is kept per INSERT statement (migration 0007): within one multi-row insert,
/// each transfer's last event decides, exactly as applying the rows one by one did, and a later
/// statement never moves a row back.
#[tokio::test]
async fn open_transfers_follows_each_transfers_last_event_within_one_statement() {
    let db = TestDb::new().await;
    let insert = |rows: Vec<(&'static str, i64, &'static str)>| {
        let pool = db.pool.clone();
        async move {
            let ids: Vec<&str> = rows.iter().map(|r| r.0).collect();
            let seqs: Vec<i64> = rows.iter().map(|r| r.1).collect();
            let types: Vec<&str> = rows.iter().map(|r| r.2).collect();
            sqlx::query(
                "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type,
                    event_version, payload, metadata)
                 SELECT 'Transfer', id, seq, ty, '1', '{}'::json, '{}'::json
                 FROM UNNEST($1::text[], $2::bigint[], $3::text[]) AS u(id, seq, ty)",
            )
            .bind(ids)
            .bind(seqs)
            .bind(types)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    // One statement: A is created and moves on twice, B is created and fails, C is created.
    insert(vec![
        ("A", 1, "TransferCreated"),
        ("B", 1, "TransferCreated"),
        ("A", 2, "SourceWithdrawStarted"),
        ("C", 1, "TransferCreated"),
        ("B", 2, "TransferFailed"),
        ("A", 3, "SourceWithdrawn"),
    ])
    .await;
    let open = || async {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT req_id, state, last_sequence FROM open_transfers ORDER BY req_id",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        rows
    };
    assert_eq!(
        open().await,
        vec![
            ("A".to_owned(), "SOURCE_DONE".to_owned(), 3),
            ("C".to_owned(), "INIT".to_owned(), 1),
        ]
    );
    // The next statement: A commits, C moves on.
    insert(vec![
        ("A", 4, "TargetDepositStarted"),
        ("C", 2, "SourceWithdrawStarted"),
        ("A", 5, "TransferCommitted"),
    ])
    .await;
    assert_eq!(
        open().await,
        vec![("C".to_owned(), "SOURCE_PENDING".to_owned(), 2)]
    );
}
