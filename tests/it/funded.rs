//! A FUNDING movement written in the same PostgreSQL transaction as the events that announce
//! and record it (ADR 0024), against the real database and spot-core: FUNDING→SPOT's creation,
//! claim, charge, withdraw and outcome in one transaction; SPOT→FUNDING's outcome, deposit and
//! commit in one; a refusal recorded with the refused movement's journal row; and a transaction
//! cut midway (`pg_terminate_backend`) leaving neither the movement nor its events, after which
//! the transfer completes exactly once. "One transaction" is checked by the rows' `xmin`. Each
//! ends with the exact conservation check. The separate steps (CRA-002/003 for a FUNDING
//! source) stay covered by `crash.rs`, whose coordinator's log has no FUNDING of its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use application::{Coordinator, CoordinatorError, DailyLimits, NewTransfer};
use domain::AccountType::{self, Funding, Spot};
use domain::{Amount, AssetSymbol, TransferState, UserId};
use sqlx::PgPool;

use crate::helpers::{dec, Stack};
use crate::procs::wait_terminal;

fn limits() -> DailyLimits {
    DailyLimits {
        count_max: Some(100),
        amount_max: BTreeMap::new(),
    }
}

fn request(user: u64, from: AccountType, to: AccountType, amount: &str, cid: &str) -> NewTransfer {
    NewTransfer {
        user_id: UserId::new(user).unwrap(),
        from,
        to,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse(amount).unwrap(),
        cid: Some(cid.to_owned()),
    }
}

fn funded(s: &Stack) -> Coordinator {
    s.another_coordinator_funded().with_daily_limits(limits())
}

/// The transaction ids that wrote a transfer's events from `from_sequence` on.
async fn event_xids(pool: &PgPool, req_id: &str, from_sequence: i64) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT DISTINCT xmin::text FROM events
          WHERE aggregate_id = $1 AND sequence >= $2",
    )
    .bind(req_id)
    .bind(from_sequence)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The transaction id that wrote a journal row, and its outcome.
async fn journal(pool: &PgPool, req_id: &str, operation: &str) -> Option<(String, String)> {
    sqlx::query_as(
        "SELECT xmin::text, outcome FROM funding_journal WHERE req_id = $1 AND operation = $2",
    )
    .bind(req_id)
    .bind(operation)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn journal_rows(pool: &PgPool, user: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM funding_journal WHERE user_id = $1")
        .bind(user)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn created(pool: &PgPool, cid: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE event_type = 'TransferCreated'
           AND payload->'TransferCreated'->>'cid' = $1",
    )
    .bind(cid)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A backend waiting on a lock while running a statement that contains `fragment`.
async fn waiting(pool: &PgPool, fragment: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' LIMIT 1",
        )
        .bind(fragment)
        .fetch_optional(pool)
        .await
        .unwrap();
        if let Some(pid) = pid {
            return pid;
        }
        assert!(Instant::now() < deadline, "no writer waits in {fragment}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn terminate(pool: &PgPool, pid: i32) {
    let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(cut);
}

#[tokio::test]
async fn funding_to_spot_withdraw_commits_with_its_creation_and_outcome() {
    let s = Stack::start().await;
    s.deposit(61, "USDT", "100").await;
    let t = funded(&s)
        .submit(request(61, Funding, Spot, "5", "f2s"))
        .await
        .expect("created");
    let done = wait_terminal(&s, &t.req_id, Duration::from_secs(10)).await;
    assert_eq!(done.state, TransferState::Committed);
    let id = t.req_id.to_string();
    // Creation, withdraw's announcement, its outcome and the deposit's announcement: one
    // transaction, the withdraw's journal row's.
    let written = event_xids(&s.db.pool, &id, 1).await;
    let first_four: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT xmin::text FROM events WHERE aggregate_id = $1 AND sequence <= 4",
    )
    .bind(&id)
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(first_four.len(), 1, "one transaction: {first_four:?}");
    let (xid, outcome) = journal(&s.db.pool, &id, "WITHDRAW")
        .await
        .expect("journaled");
    assert_eq!(
        (xid.as_str(), outcome.as_str()),
        (first_four[0].as_str(), "APPLIED")
    );
    assert_eq!(written.len(), 2, "the creation's write, then the commit's");
    assert_eq!(
        s.event_types(&id).await,
        [
            "TransferCreated",
            "SourceWithdrawStarted",
            "SourceWithdrawn",
            "TargetDepositStarted",
            "TransferCommitted"
        ]
    );
    assert_eq!(s.funding_balance(61, "USDT").await, dec("95"));
    assert_eq!(s.spot_balance(61, "USDT").await, dec("5"));
    s.assert_invariant_exact().await;
}

#[tokio::test]
async fn spot_to_funding_deposit_commits_with_the_withdraws_outcome() {
    let s = Stack::start().await;
    s.deposit(62, "USDT", "100").await;
    let c = funded(&s);
    let there = c
        .submit(request(62, Funding, Spot, "50", "there"))
        .await
        .unwrap();
    wait_terminal(&s, &there.req_id, Duration::from_secs(10)).await;
    let back = c
        .submit(request(62, Spot, Funding, "20", "back"))
        .await
        .unwrap();
    let done = wait_terminal(&s, &back.req_id, Duration::from_secs(10)).await;
    assert_eq!(done.state, TransferState::Committed);
    let id = back.req_id.to_string();
    // SourceWithdrawn, TargetDepositStarted and TransferCommitted with FUNDING's deposit.
    let after_spot = event_xids(&s.db.pool, &id, 3).await;
    assert_eq!(after_spot.len(), 1, "one transaction: {after_spot:?}");
    let (xid, outcome) = journal(&s.db.pool, &id, "DEPOSIT")
        .await
        .expect("journaled");
    assert_eq!(
        (xid.as_str(), outcome.as_str()),
        (after_spot[0].as_str(), "APPLIED")
    );
    assert_eq!(s.event_types(&id).await.len(), 5);
    assert_eq!(s.funding_balance(62, "USDT").await, dec("70"));
    assert_eq!(s.spot_balance(62, "USDT").await, dec("30"));
    s.assert_invariant_exact().await;
}

/// FUNDING's own check stays: a withdraw above the balance is refused, and the refusal is
/// recorded (TransferFailed) in the transaction of its journal row; nothing moves.
#[tokio::test]
async fn insufficient_funding_fails_in_the_same_write_and_moves_nothing() {
    let s = Stack::start().await;
    s.deposit(63, "USDT", "3").await;
    let t = funded(&s)
        .submit(request(63, Funding, Spot, "5", "short"))
        .await
        .expect("answered with its transfer");
    assert_eq!(t.state, TransferState::Failed);
    assert_eq!(
        t.failure.as_ref().map(|(code, _)| code.as_str()),
        Some("INSUFFICIENT_BALANCE")
    );
    let id = t.req_id.to_string();
    assert_eq!(
        s.event_types(&id).await,
        ["TransferCreated", "SourceWithdrawStarted", "TransferFailed"]
    );
    let written = event_xids(&s.db.pool, &id, 1).await;
    assert_eq!(written.len(), 1);
    let (xid, outcome) = journal(&s.db.pool, &id, "WITHDRAW")
        .await
        .expect("journaled");
    assert_eq!(
        (xid.as_str(), outcome.as_str()),
        (written[0].as_str(), "REFUSED")
    );
    assert_eq!(s.funding_balance(63, "USDT").await, dec("3"));
    assert_eq!(s.spot_balance(63, "USDT").await, dec("0"));
    s.assert_invariant_exact().await;
}

/// A deposit FUNDING refuses (its account disabled after the money went to SPOT) is recorded
/// with its refusal as CompensationStarted; the refund to SPOT follows and rolls it back.
#[tokio::test]
async fn a_deposit_funding_refuses_compensates_the_spot_source_exactly() {
    let s = Stack::start().await;
    s.deposit(64, "USDT", "100").await;
    let c = funded(&s);
    let there = c
        .submit(request(64, Funding, Spot, "50", "there"))
        .await
        .unwrap();
    wait_terminal(&s, &there.req_id, Duration::from_secs(10)).await;
    s.funding
        .set_status(
            UserId::new(64).unwrap(),
            &AssetSymbol::parse("USDT").unwrap(),
            adapters::funding::AccountStatus::Disabled,
        )
        .await
        .unwrap();
    let back = c
        .submit(request(64, Spot, Funding, "20", "back"))
        .await
        .expect("answered with its transfer");
    let done = wait_terminal(&s, &back.req_id, Duration::from_secs(10)).await;
    assert_eq!(done.state, TransferState::RolledBack);
    let id = back.req_id.to_string();
    let (_, outcome) = journal(&s.db.pool, &id, "DEPOSIT")
        .await
        .expect("journaled");
    assert_eq!(outcome, "REFUSED");
    assert_eq!(s.funding_balance(64, "USDT").await, dec("50"));
    assert_eq!(s.spot_balance(64, "USDT").await, dec("50"));
    s.assert_invariant_exact().await;
}

/// CRA-002 on the fast path (ADR 0024): the state between the announcement and the call is
/// never durable. The transaction cut after FUNDING's withdraw, while it waits for the events
/// table: the claim, the charge, the movement and the events go together, so none of them
/// stays; the answer is an unknown outcome, and the retry moves the money exactly once.
#[tokio::test]
async fn a_funded_write_cut_mid_transaction_leaves_neither_movement_nor_events() {
    let s = Stack::start().await;
    s.deposit(65, "USDT", "100").await;
    let c = funded(&s);
    let before = journal_rows(&s.db.pool, 65).await;
    let mut stall = s.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE events IN EXCLUSIVE MODE")
        .execute(&mut *stall)
        .await
        .unwrap();
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.submit(request(65, Funding, Spot, "5", "cut")).await }
    });
    let pid = waiting(&s.db.pool, "feed_take()").await;
    // The movement is made inside the waiting transaction only.
    assert_eq!(journal_rows(&s.db.pool, 65).await, before);
    terminate(&s.db.pool, pid).await;
    let answer = first.await.unwrap();
    assert!(
        matches!(answer, Err(CoordinatorError::OutcomeUnknown(_))),
        "an unknown outcome, got {answer:?}"
    );
    stall.commit().await.unwrap();
    assert_eq!(journal_rows(&s.db.pool, 65).await, before, "no movement");
    assert_eq!(created(&s.db.pool, "cut").await, 0, "no events");
    assert_eq!(s.funding_balance(65, "USDT").await, dec("100"));
    let retried = c
        .submit(request(65, Funding, Spot, "5", "cut"))
        .await
        .expect("the retry creates");
    let done = wait_terminal(&s, &retried.req_id, Duration::from_secs(10)).await;
    assert_eq!(done.state, TransferState::Committed);
    assert_eq!(created(&s.db.pool, "cut").await, 1);
    assert_eq!(journal_rows(&s.db.pool, 65).await, before + 1);
    assert_eq!(s.funding_balance(65, "USDT").await, dec("95"));
    assert_eq!(s.spot_balance(65, "USDT").await, dec("5"));
    s.assert_invariant_exact().await;
}

/// CRA-003 for a SPOT source on the fast path (ADR 0024). SPOT→FUNDING's write cut while
/// FUNDING's deposit waits for its account: spot-core's
/// withdraw is made, its outcome is not recorded and FUNDING has nothing; the transfer stays
/// where its durable events say (SOURCE_PENDING), and the recovery worker's resumption (a
/// lookup first, the separate steps) finishes it exactly once.
#[tokio::test]
async fn a_spot_to_funding_write_cut_is_resumed_exactly_once() {
    let s = Stack::start().await;
    s.deposit(66, "USDT", "100").await;
    let c = funded(&s);
    let there = c
        .submit(request(66, Funding, Spot, "50", "there"))
        .await
        .unwrap();
    wait_terminal(&s, &there.req_id, Duration::from_secs(10)).await;
    let mut stall = s.db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM funding_accounts WHERE user_id = 66 FOR UPDATE")
        .execute(&mut *stall)
        .await
        .unwrap();
    let back = tokio::spawn({
        let c = c.clone();
        async move { c.submit(request(66, Spot, Funding, "20", "back")).await }
    });
    let pid = waiting(&s.db.pool, "funding_fresh_movements").await;
    terminate(&s.db.pool, pid).await;
    let answer = back.await.unwrap().expect("answered with its transfer");
    stall.commit().await.unwrap();
    let id = answer.req_id.to_string();
    assert_eq!(answer.state, TransferState::SourcePending);
    assert_eq!(
        s.event_types(&id).await,
        ["TransferCreated", "SourceWithdrawStarted"]
    );
    assert_eq!(journal(&s.db.pool, &id, "DEPOSIT").await, None);
    assert_eq!(s.spot_balance(66, "USDT").await, dec("30"), "SPOT withdrew");
    assert_eq!(s.funding_balance(66, "USDT").await, dec("50"));
    let resumed = s.coordinator.resume(&answer.req_id).await.unwrap();
    assert_eq!(resumed.data.state, TransferState::Committed);
    assert_eq!(s.funding_balance(66, "USDT").await, dec("70"));
    assert_eq!(s.spot_balance(66, "USDT").await, dec("30"));
    let again = s.coordinator.resume(&answer.req_id).await.unwrap();
    assert_eq!(again.data.state, TransferState::Committed);
    assert_eq!(s.funding_balance(66, "USDT").await, dec("70"), "once");
    s.assert_invariant_exact().await;
}
