//! A creation written with its client key's claim and its daily charge in one PostgreSQL
//! transaction (ADR 0022), against the real database: a charge a limit refuses leaves no claim;
//! a creation stalled in its write holds its claim only inside that transaction, so a retry on
//! another process waits for it and answers with its transfer; a write whose connection is cut
//! mid-transaction leaves none of the three, and its retry creates exactly once. Each ends with
//! the exact conservation check.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use application::{CoordinatorError, DailyLimits, NewTransfer};
use domain::AccountType::{Funding, Spot};
use domain::{Amount, AssetSymbol, ErrorCode, TransferState, UserId};
use sqlx::PgPool;

use crate::helpers::{dec, Stack};
use crate::procs::wait_terminal;

fn count_max(n: u64) -> DailyLimits {
    DailyLimits {
        count_max: Some(n),
        amount_max: BTreeMap::new(),
    }
}

fn request(user: u64, cid: &str) -> NewTransfer {
    NewTransfer {
        user_id: UserId::new(user).unwrap(),
        from: Funding,
        to: Spot,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("5").unwrap(),
        cid: Some(cid.to_owned()),
    }
}

async fn claims(pool: &PgPool, user: i64, cid: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM transfer_cids WHERE user_id = $1 AND cid = $2")
        .bind(user)
        .bind(cid)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn charged(pool: &PgPool, user: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(count), 0)::bigint FROM daily_transfer_counts WHERE user_id = $1",
    )
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

/// The backend of the appender's transaction waiting for the events table's lock.
async fn waiting_writer(pool: &PgPool) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%feed_take()%' LIMIT 1",
        )
        .fetch_optional(pool)
        .await
        .unwrap();
        if let Some(pid) = pid {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "the creation never reached its INSERT"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_charge_a_limit_refuses_leaves_no_claim_and_no_count() {
    let s = Stack::start().await;
    s.deposit(51, "USDT", "100").await;
    let c = s.another_coordinator().with_daily_limits(count_max(1));
    let first = c
        .submit(request(51, "one"))
        .await
        .expect("the first is created");
    assert_eq!(
        c.submit(request(51, "two")).await,
        Err(CoordinatorError::Refused(ErrorCode::DailyLimitExceeded))
    );
    assert_eq!(claims(&s.db.pool, 51, "one").await, 1);
    assert_eq!(
        claims(&s.db.pool, 51, "two").await,
        0,
        "no claim left behind"
    );
    assert_eq!(charged(&s.db.pool, 51).await, 1);
    assert_eq!(created(&s.db.pool, "two").await, 0);
    // A repeat of the first is answered with it, whatever the limit says now.
    let again = c
        .submit(request(51, "one"))
        .await
        .expect("the repeat answers");
    assert_eq!(again.req_id, first.req_id);
    assert_eq!(charged(&s.db.pool, 51).await, 1);
    wait_terminal(&s, &first.req_id, Duration::from_secs(10)).await;
    s.assert_invariant_exact().await;
}

/// IDP across processes: the claim is durable only with its transfer, so a retry meeting a
/// creation still in its write waits on the key and then answers with that creation.
#[tokio::test]
async fn idp_a_creation_stalled_in_its_write_is_answered_to_its_retry_not_doubled() {
    let s = Stack::start().await;
    s.deposit(52, "USDT", "100").await;
    let limits = count_max(10);
    let a = s.another_coordinator().with_daily_limits(limits.clone());
    let b = s.another_coordinator().with_daily_limits(limits);
    let mut stall = s.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE events IN EXCLUSIVE MODE")
        .execute(&mut *stall)
        .await
        .unwrap();
    let first = tokio::spawn(async move { a.submit(request(52, "held")).await });
    waiting_writer(&s.db.pool).await;
    // Inside the stalled transaction only: nothing of it is visible yet.
    assert_eq!(claims(&s.db.pool, 52, "held").await, 0);
    assert_eq!(charged(&s.db.pool, 52).await, 0);
    let retry = tokio::spawn(async move { b.submit(request(52, "held")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!retry.is_finished(), "the retry waits on the key");
    stall.commit().await.unwrap();
    let first = first.await.unwrap().expect("the stalled request answers");
    let retry = retry.await.unwrap().expect("the retry answers");
    assert_eq!(first.req_id, retry.req_id, "one cid, one transfer");
    assert_eq!(created(&s.db.pool, "held").await, 1);
    assert_eq!(charged(&s.db.pool, 52).await, 1, "charged once");
    let done = wait_terminal(&s, &first.req_id, Duration::from_secs(10)).await;
    assert_eq!(done.state, TransferState::Committed);
    assert_eq!(s.spot_balance(52, "USDT").await, dec("5"));
    assert_eq!(s.funding_balance(52, "USDT").await, dec("95"));
    s.assert_invariant_exact().await;
}

/// The write's connection cut inside its transaction (the backend terminated while it waits
/// for the events table): the claim, the charge and the events go together, so none of them
/// stays; the answer is an unknown outcome, and the retry creates exactly once.
#[tokio::test]
async fn a_write_cut_mid_transaction_leaves_no_claim_no_charge_no_transfer() {
    let s = Stack::start().await;
    s.deposit(53, "USDT", "100").await;
    let c = s.another_coordinator().with_daily_limits(count_max(10));
    let mut stall = s.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE events IN EXCLUSIVE MODE")
        .execute(&mut *stall)
        .await
        .unwrap();
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.submit(request(53, "cut")).await }
    });
    let pid = waiting_writer(&s.db.pool).await;
    let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert!(cut);
    let answer = first.await.unwrap();
    assert!(
        matches!(answer, Err(CoordinatorError::OutcomeUnknown(_))),
        "an unknown outcome, got {answer:?}"
    );
    stall.commit().await.unwrap();
    assert_eq!(claims(&s.db.pool, 53, "cut").await, 0);
    assert_eq!(charged(&s.db.pool, 53).await, 0);
    assert_eq!(created(&s.db.pool, "cut").await, 0);
    let retried = c
        .submit(request(53, "cut"))
        .await
        .expect("the retry creates");
    let done = wait_terminal(&s, &retried.req_id, Duration::from_secs(10)).await;
    assert_eq!(done.state, TransferState::Committed);
    assert_eq!(created(&s.db.pool, "cut").await, 1);
    assert_eq!(charged(&s.db.pool, 53).await, 1);
    assert_eq!(s.funding_balance(53, "USDT").await, dec("95"));
    s.assert_invariant_exact().await;
}
