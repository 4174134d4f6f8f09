//! Projections are exactly-once and equal a replay from scratch: after a mixed load (commits
//! both ways, source refusals, target refusals with compensation) driven by concurrent
//! coordinators while several projectors race each other, `replay` rebuilds every read model
//! from the log and finds it equal to the live one; the `ledger replay` command says so too.
//! Point-in-time answers fold the log up to a position or a time.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use ::projections::replay::{self, AsOf};
use ::projections::Projector;
use domain::AccountType::{Funding, Spot};
use domain::{AssetSymbol, TransferState, UserId};

use crate::helpers::{bin, dec, Stack};

/// Runs a mixed load: per user a deposit, then concurrent transfers both ways, some refused by
/// the source (insufficient balance) and some refused by the target (a DISABLED SPOT account, so
/// the transfer compensates and rolls back).
async fn mixed_load(s: &Stack) {
    for user in 1..=6u64 {
        s.deposit(user, "USDT", "100").await;
        s.deposit(user, "BTC", "2").await;
    }
    // User 6's SPOT BTC account refuses deposits: FUNDING→SPOT BTC transfers roll back.
    s.spot_adapter
        .set_status(
            UserId::new(6).unwrap(),
            &AssetSymbol::parse("BTC").unwrap(),
            adapters::AccountStatus::Disabled,
        )
        .await
        .unwrap();
    // Two waves: SPOT→FUNDING transfers need the first wave's money in SPOT.
    for wave in [&[0u64, 1, 3, 4][..], &[2, 5][..]] {
        let mut tasks = Vec::new();
        for user in 1..=6u64 {
            for &i in wave {
                let coordinator = if i % 2 == 0 {
                    s.coordinator.clone()
                } else {
                    s.another_coordinator()
                };
                tasks.push(tokio::spawn(async move {
                    let (from, to, asset, amount) = match i {
                        0 | 1 => (Funding, Spot, "USDT", "30"),
                        2 => (Spot, Funding, "USDT", "10"),
                        3 => (Funding, Spot, "BTC", "0.5"),
                        4 => (Funding, Spot, "USDT", "1000"), // refused by the source
                        _ => (Spot, Funding, "BTC", "5"),     // refused by the source
                    };
                    coordinator
                        .submit(application::NewTransfer {
                            user_id: UserId::new(user).unwrap(),
                            from,
                            to,
                            asset: domain::AssetSymbol::parse(asset).unwrap(),
                            amount: domain::Amount::parse(amount).unwrap(),
                            cid: None,
                        })
                        .await
                        .unwrap()
                }));
            }
        }
        for t in tasks {
            let data = t.await.unwrap();
            assert!(data.state.is_terminal(), "{data:?}");
        }
    }
}

#[tokio::test]
async fn replay_equals_live_after_mixed_load_with_failures_and_compensations() {
    let s = Stack::start().await;
    // Several projectors (as several `ledger serve` would run) race while the load runs; the
    // advisory lock and the stored position must make each event count once.
    let racers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(Projector::new(s.db.pool.clone()).run()))
        .collect();
    mixed_load(&s).await;
    s.wait_for_projections().await;
    for r in &racers {
        r.abort();
    }

    let report = replay::replay(&s.db.pool, false, |_, _| {}).await.unwrap();
    assert!(report.equal(), "{report:#?}");
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(report.events_replayed, events);
    assert_eq!(report.events_compared, events);
    // The feed's positions, handed out at append, are exactly 1..=events: dense, each once.
    let (count, first, last): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT feed_position), min(feed_position), max(feed_position) FROM events",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (count, first, last),
        (events, 1, events),
        "feed positions are dense"
    );
    let head = projections::feed::head(&s.db.pool).await.unwrap();
    assert_eq!(
        head, events,
        "the feed head is the last position handed out"
    );

    // Counts by state equal the log's own answer.
    let counts: HashMap<String, i64> = s
        .view
        .state_counts()
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, _, n)| *n != 0)
        .map(|(_, state, n)| (state, n))
        .collect();
    assert_eq!(counts.get("COMMITTED"), Some(&(6 * 4 - 1)));
    assert_eq!(counts.get("FAILED"), Some(&12));
    assert_eq!(counts.get("ROLLED_BACK"), Some(&1));
    assert_eq!(counts.values().sum::<i64>(), 36);

    // The balances projection agrees with both account systems for every user and asset.
    for row in s.view.balances(None).await.unwrap() {
        let user = u64::try_from(row.user_id).unwrap();
        let deposits = s.external_total(user, &row.asset).await;
        assert_eq!(
            deposits + row.funding_net,
            s.funding_balance(user, &row.asset).await
        );
        assert_eq!(row.spot_net, s.spot_balance(user, &row.asset).await);
        assert_eq!(row.in_flight, dec("0"));
    }
    for user in 1..=6u64 {
        s.assert_conserved(user, "USDT").await;
        s.assert_conserved(user, "BTC").await;
    }

    // The command line says the same, and fails on nothing.
    let out = Command::new(bin("ledger"))
        .arg("replay")
        .env("DATABASE_URL", &s.db.url)
        .output()
        .expect("run ledger replay");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("result: EQUAL"), "{stdout}");
}

#[tokio::test]
async fn replay_notices_a_tampered_projection() {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "10").await;
    s.transfer(1, Funding, Spot, "USDT", "3").await;
    s.wait_for_projections().await;
    sqlx::query("UPDATE transfer_balances SET spot_net = spot_net + 1")
        .execute(&s.db.pool)
        .await
        .unwrap();
    let report = replay::replay(&s.db.pool, false, |_, _| {}).await.unwrap();
    assert!(!report.equal());
    let balances = report
        .tables
        .iter()
        .find(|t| t.table == "transfer_balances")
        .unwrap();
    assert_eq!((balances.only_live, balances.only_replay), (1, 1));
}

/// `--keep`: the rebuilt tables stay, logged, with every index the live tables have (the
/// rebuild itself writes unlogged scratch without secondary indexes).
#[tokio::test]
async fn a_kept_replay_is_logged_and_has_every_live_index() {
    let s = Stack::start().await;
    s.deposit(2, "USDT", "10").await;
    s.transfer(2, Funding, Spot, "USDT", "3").await;
    s.transfer(2, Spot, Funding, "USDT", "1").await;
    s.wait_for_projections().await;
    let report = replay::replay(&s.db.pool, true, |_, _| {}).await.unwrap();
    assert!(report.equal(), "{report:#?}");
    let tables = [
        "transfers_view",
        "transfer_balances",
        "transfer_state_counts",
    ];
    let indexes = |schema: String| {
        let pool = s.db.pool.clone();
        async move {
            let mut names: Vec<String> = sqlx::query_scalar(
                "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 AND tablename = ANY($2)",
            )
            .bind(schema)
            .bind(tables)
            .fetch_all(&pool)
            .await
            .unwrap();
            names.sort();
            names
        }
    };
    let live = indexes("public".to_owned()).await;
    assert!(live.contains(&"transfers_view_user_page".to_owned()));
    assert_eq!(indexes(report.schema.clone()).await, live);
    let unlogged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relpersistence <> 'p'",
    )
    .bind(&report.schema)
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(unlogged, 0, "a kept replay is logged");
}

#[tokio::test]
async fn point_in_time_transfer_and_balances_by_position_and_time() {
    let s = Stack::start().await;
    s.deposit(7, "USDT", "50").await;
    let first = s.transfer(7, Funding, Spot, "USDT", "20").await;
    let between = chrono::Utc::now();
    // Let the clock move so "between" is strictly before the second transfer's events.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = s.transfer(7, Spot, Funding, "USDT", "5").await;
    s.wait_for_projections().await;
    let pool = &s.db.pool;

    // Position 1 is the deposit's event, so position 4 is the first transfer's SourceWithdrawn:
    // money in flight.
    let (data, events) = replay::transfer_as_of(pool, &first.req_id.to_string(), AsOf::Position(4))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(data.state, TransferState::SourceDone);
    assert_eq!(events.len(), 3);
    // As of the deposit's own event: the deposit alone.
    let at1 = replay::balances_as_of(pool, 7, AsOf::Position(1))
        .await
        .unwrap();
    assert_eq!(
        (at1[0].funding, at1[0].spot, at1[0].in_flight),
        (dec("50"), dec("0"), dec("0"))
    );
    let at4 = replay::balances_as_of(pool, 7, AsOf::Position(4))
        .await
        .unwrap();
    assert_eq!(at4.len(), 1);
    assert_eq!(
        (at4[0].funding, at4[0].spot, at4[0].in_flight),
        (dec("30"), dec("0"), dec("20"))
    );

    // As of a time between the transfers: the first is committed, the second does not exist.
    let at = replay::balances_as_of(pool, 7, AsOf::Time(between))
        .await
        .unwrap();
    assert_eq!(
        (at[0].funding, at[0].spot, at[0].in_flight),
        (dec("30"), dec("20"), dec("0"))
    );
    assert!(
        replay::transfer_as_of(pool, &second.req_id.to_string(), AsOf::Time(between))
            .await
            .unwrap()
            .is_none()
    );
    let now = replay::balances_as_of(pool, 7, AsOf::Now).await.unwrap();
    assert_eq!((now[0].funding, now[0].spot), (dec("35"), dec("15")));

    let out = Command::new(bin("ledger"))
        .args(["replay", "--user", "7", "--at-position", "4"])
        .env("DATABASE_URL", &s.db.url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("in-flight"), "{stdout}");
    assert!(stdout.contains("20"), "{stdout}");
}
