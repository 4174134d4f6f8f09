//! IDP-001..003: each adapter called twice with one req_id applies once and answers the same.

use domain::{AccountPort, AdapterOutcome, Amount, AssetSymbol, Movement, ReqId, UserId};

use crate::helpers::{dec, Stack};

fn movement(user: u64, asset: &str, amount: &str) -> Movement {
    Movement {
        req_id: ReqId::generate(),
        user_id: UserId::new(user).unwrap(),
        asset: AssetSymbol::parse(asset).unwrap(),
        amount: Amount::parse(amount).unwrap(),
    }
}

#[tokio::test]
async fn idp_001_withdraw_twice_debits_once() {
    let s = Stack::start().await;
    s.deposit(11, "USDT", "10").await;
    let m = movement(11, "USDT", "3");
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding_balance(11, "USDT").await, dec("7"));

    let d = movement(11, "USDT", "5");
    assert_eq!(s.spot_adapter.deposit(&d).await, AdapterOutcome::Success);
    let w = movement(11, "USDT", "2");
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(11, "USDT").await, dec("3"));

    // A refusal is remembered too: the same req_id stays refused even once money arrives.
    let big = movement(11, "USDT", "100");
    let first = s.funding.withdraw(&big).await;
    assert!(
        matches!(&first, AdapterOutcome::ExplicitFail { code, .. } if code == "INSUFFICIENT_BALANCE")
    );
    s.deposit(11, "USDT", "1000").await;
    assert_eq!(s.funding.withdraw(&big).await, first);
}

#[tokio::test]
async fn idp_002_fnd_003_deposit_twice_credits_once() {
    let s = Stack::start().await;
    s.deposit(12, "BTC", "1").await;
    let m = movement(12, "BTC", "0.5");
    assert_eq!(s.funding.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding_balance(12, "BTC").await, dec("1.5"));

    let m = movement(12, "BTC", "0.25");
    assert_eq!(s.spot_adapter.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(12, "BTC").await, dec("0.25"));
}

#[tokio::test]
async fn idp_003_refund_twice_credits_once_and_needs_a_withdraw() {
    let s = Stack::start().await;
    s.deposit(13, "ETH", "4").await;
    let m = movement(13, "ETH", "1");
    // No withdraw under this req_id yet: a refund would mint money, so it is refused.
    assert!(
        matches!(s.funding.refund(&m).await, AdapterOutcome::ExplicitFail { code, .. } if code == "NO_MATCHING_WITHDRAW")
    );
    let m = movement(13, "ETH", "1");
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.refund(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.refund(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding_balance(13, "ETH").await, dec("4"));

    let d = movement(13, "ETH", "2");
    assert_eq!(s.spot_adapter.deposit(&d).await, AdapterOutcome::Success);
    let w = movement(13, "ETH", "1.5");
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.refund(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.refund(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(13, "ETH").await, dec("2"));
}

#[tokio::test]
async fn a_used_req_id_with_other_details_is_never_a_clean_answer() {
    let s = Stack::start().await;
    s.deposit(14, "USDT", "10").await;
    let m = movement(14, "USDT", "1");
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    let mut other = m.clone();
    other.amount = Amount::parse("2").unwrap();
    assert!(s.funding.withdraw(&other).await.is_unknown());
    assert_eq!(s.funding_balance(14, "USDT").await, dec("9"));
}

/// Concurrent movements share one call of `funding_fresh_movements` (group commit): each is
/// still decided on the balance the ones before it left, a repeat of a req_id in the same burst
/// is applied once, and movements of other accounts in the burst are unaffected.
#[tokio::test]
async fn bal_concurrent_funding_movements_share_commits_and_never_overdraw() {
    let s = Stack::start().await;
    s.deposit(15, "USDT", "10").await;
    s.deposit(16, "USDT", "5").await;
    let withdraws: Vec<Movement> = (0..40).map(|_| movement(15, "USDT", "1")).collect();
    let deposits: Vec<Movement> = (0..20).map(|_| movement(16, "USDT", "0.5")).collect();
    // Ten of the withdraws are asked twice, in the same burst.
    let calls = withdraws
        .iter()
        .chain(withdraws.iter().take(10))
        .map(|m| s.funding.withdraw(m))
        .collect::<Vec<_>>();
    let deposit_calls = deposits
        .iter()
        .map(|m| s.funding.deposit(m))
        .collect::<Vec<_>>();
    let (outcomes, deposited) = tokio::join!(
        futures_util::future::join_all(calls),
        futures_util::future::join_all(deposit_calls)
    );
    let applied = outcomes[..40]
        .iter()
        .filter(|o| **o == AdapterOutcome::Success)
        .count();
    assert_eq!(applied, 10, "exactly the balance's worth is withdrawn");
    for o in &outcomes[..40] {
        assert!(
            *o == AdapterOutcome::Success
                || matches!(o, AdapterOutcome::ExplicitFail { code, .. } if code == "INSUFFICIENT_BALANCE"),
            "{o:?}"
        );
    }
    for (i, repeat) in outcomes[40..].iter().enumerate() {
        assert_eq!(repeat, &outcomes[i], "a repeat answers as the first call");
    }
    assert!(deposited.iter().all(|o| *o == AdapterOutcome::Success));
    assert_eq!(s.funding_balance(15, "USDT").await, dec("0"));
    assert_eq!(s.funding_balance(16, "USDT").await, dec("15"));
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT outcome, count(*) FROM funding_journal WHERE user_id = 15 GROUP BY outcome ORDER BY outcome",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(rows, vec![("APPLIED".into(), 10), ("REFUSED".into(), 30)]);
}

/// The batcher's connection is cut between two batches (its PostgreSQL backend terminated). The
/// next batch fails as a whole and nothing of it is applied; each movement is then decided
/// alone, so every caller still gets its own true answer, and the books match the journal.
#[tokio::test]
async fn con_funding_batch_on_a_cut_connection_is_decided_movement_by_movement() {
    let s = Stack::start().await;
    s.deposit(17, "USDT", "100").await;
    let first = movement(17, "USDT", "1");
    assert_eq!(s.funding.withdraw(&first).await, AdapterOutcome::Success);
    let cut: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND query LIKE '%funding_fresh_movements%'",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(
        cut,
        vec![true],
        "the batcher's kept connection was found and cut"
    );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let burst: Vec<Movement> = (0..30).map(|_| movement(17, "USDT", "1")).collect();
    let outcomes =
        futures_util::future::join_all(burst.iter().map(|m| s.funding.withdraw(m))).await;
    assert!(
        outcomes.iter().all(|o| *o == AdapterOutcome::Success),
        "{outcomes:?}"
    );
    assert_eq!(s.funding_balance(17, "USDT").await, dec("69"));
    for m in &burst {
        assert_eq!(
            s.funding.lookup(m, domain::Operation::Withdraw).await,
            domain::Recorded::Applied
        );
    }
    let applied: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM funding_journal WHERE user_id = 17 AND outcome = 'APPLIED'",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(applied, 31);
}

/// Two ledger processes (two funding ledgers, each with its own batcher) move money on the same
/// accounts at once, one walking them in ascending order, the other in descending. Every batch
/// locks its accounts in one sorted order, so no batch ever waits on another in a cycle: no
/// deadlock is reported, and every movement is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn con_two_funding_batchers_on_the_same_accounts_never_deadlock() {
    let s = Stack::start().await;
    let users: Vec<u64> = (20..30).collect();
    for u in &users {
        s.deposit(*u, "USDT", "1000").await;
    }
    let deadlocks = |pool: sqlx::PgPool| async move {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&pool)
            .await
            .ok();
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query_scalar::<_, i64>(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let before = deadlocks(s.db.pool.clone()).await;

    let one = adapters::FundingLedger::new(s.db.pool.clone());
    let other = adapters::FundingLedger::new(s.db.pool.clone());
    let rounds = 20;
    let drive = |ledger: adapters::FundingLedger, order: Vec<u64>| async move {
        let mut outcomes = Vec::new();
        for _ in 0..rounds {
            let moves: Vec<Movement> = order.iter().map(|u| movement(*u, "USDT", "1")).collect();
            outcomes.extend(
                futures_util::future::join_all(moves.iter().map(|m| ledger.withdraw(m))).await,
            );
        }
        outcomes
    };
    let mut descending = users.clone();
    descending.reverse();
    let (a, b) = tokio::join!(
        tokio::spawn(drive(one, users.clone())),
        tokio::spawn(drive(other, descending))
    );
    for o in a.unwrap().iter().chain(b.unwrap().iter()) {
        assert_eq!(o, &AdapterOutcome::Success);
    }
    for u in &users {
        assert_eq!(s.funding_balance(*u, "USDT").await, dec("960"));
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(
        deadlocks(s.db.pool.clone()).await,
        before,
        "no deadlock was reported"
    );
}
