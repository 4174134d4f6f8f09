//! External deposits as entries of the tamper-evident log (issue 36, migration 0025,
//! `docs/adr/0016-tamper-evident-log.md`) on a real PostgreSQL: a deposit is one event of the
//! feed with the contract's exact fields, appended in the deposit's own transaction, once per
//! external_id whatever the retries (sequential, concurrent, refused, or rolled back by an
//! overflow); the migration gives deposits made before it their entries at the log's end; and
//! the whole log, deposits included, verifies.

use domain::{Amount, AssetSymbol, UserId};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::feed::append_created;
use crate::helpers::{ApiStack, TestDb};
use crate::tlog::{exec, follow, key_file, ledger, signer};

async fn head(pool: &PgPool) -> i64 {
    projections::feed::head(pool).await.unwrap()
}

/// The deposit entries of the log: (position, external_id, user), in feed order.
async fn deposit_entries(pool: &PgPool) -> Vec<(i64, String, Option<i64>)> {
    sqlx::query_as(
        "SELECT feed_position, aggregate_id, user_id FROM events
         WHERE aggregate_type = 'Deposit' ORDER BY feed_position",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The time of a deposit's row as the feed writes times (UTC, six fractional digits).
async fn row_time(pool: &PgPool, external_id: &str) -> String {
    sqlx::query_scalar(
        "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
         FROM external_deposits WHERE external_id = $1",
    )
    .bind(external_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn post_deposit(api: &ApiStack, body: &Value) -> (u16, Value) {
    let admin = api.token(1, true);
    api.call(
        Method::POST,
        "/api/v1/admin/deposits",
        Some(&admin),
        Some(body.clone()),
    )
    .await
}

#[tokio::test]
async fn tlog_deposit_is_one_feed_event_and_its_retries_append_none() {
    let api = ApiStack::start().await;
    let pool = api.stack.db.pool.clone();
    api.stack.deposit(5, "USDT", "3").await;
    assert_eq!(head(&pool).await, 1, "a deposit is one event");

    let body = json!({"user_id": 7, "asset": "USDT", "amount": "12.50", "external_id": "bank-42"});
    let (status, first) = post_deposit(&api, &body).await;
    assert_eq!(
        (status, first["applied"].clone()),
        (200, json!(true)),
        "{first}"
    );
    assert_eq!(head(&pool).await, 2);
    // The same deposit again: answered, credited once, no entry appended.
    let (status, again) = post_deposit(&api, &body).await;
    assert_eq!(
        (status, again["applied"].clone()),
        (200, json!(false)),
        "{again}"
    );
    let mut other = body.clone();
    other["amount"] = json!("13");
    let (status, refused) = post_deposit(&api, &other).await;
    assert_eq!(
        (status, refused["code"].clone()),
        (409, json!("IDEMPOTENCY_KEY_REUSED"))
    );
    assert_eq!(head(&pool).await, 2);

    // Eight concurrent sends of one new deposit: one applies, one entry.
    let concurrent =
        json!({"user_id": 7, "asset": "BTC", "amount": "0.001", "external_id": "bank-43"});
    let sends: Vec<_> = (0..8)
        .map(|_| {
            let (http, base, body) = (api.http.clone(), api.base.clone(), concurrent.clone());
            let admin = api.token(1, true);
            tokio::spawn(async move {
                let resp = http
                    .post(format!("{base}/api/v1/admin/deposits"))
                    .bearer_auth(admin)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                resp.json::<Value>().await.unwrap()["applied"] == json!(true)
            })
        })
        .collect();
    let mut applied = 0;
    for s in sends {
        applied += usize::from(s.await.unwrap());
    }
    assert_eq!(applied, 1);
    let entries = deposit_entries(&pool).await;
    let ids: Vec<(i64, &str, Option<i64>)> = entries
        .iter()
        .map(|(p, id, u)| (*p, id.as_str(), *u))
        .collect();
    assert_eq!(
        &ids[1..],
        [(2, "bank-42", Some(7)), (3, "bank-43", Some(7))]
    );
    assert_eq!(head(&pool).await, 3);

    // In the feed with exactly the contract's fields (docs/contract.md §8), the payload stored
    // as this text.
    let at = row_time(&pool, "bank-42").await;
    let admin = api.token(1, true);
    let (status, page) = api
        .call(
            Method::GET,
            "/api/v1/events?after=1&limit=1",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let payload = format!(
        r#"{{"ExternalDeposited":{{"external_id":"bank-42","asset":"USDT","amount":"12.5","at":"{at}"}}}}"#
    );
    assert_eq!(
        page["events"],
        json!([{
            "position": 2,
            "event_id": "Deposit:bank-42:1",
            "aggregate_type": "Deposit",
            "aggregate_id": "bank-42",
            "sequence": 1,
            "event_type": "ExternalDeposited",
            "event_version": "1",
            "payload": serde_json::from_str::<Value>(&payload).unwrap(),
            "user_id": 7,
            "occurred_at": at,
        }])
    );
    let stored: String =
        sqlx::query_scalar("SELECT payload::text FROM events WHERE feed_position = 2")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, payload);

    // An entry of the log owned by its user, which verifies with every deposit held to it.
    let size = follow(&pool).await;
    assert_eq!(size, 3);
    for (token, status) in [(api.token(7, false), 200), (api.token(8, false), 403)] {
        let (got, _) = api
            .call(Method::GET, "/api/v1/log/entries/2", Some(&token), None)
            .await;
        assert_eq!(got, status);
    }
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let (ok, out) = ledger(&["verify"], &api.stack.db.url, &key);
    assert!(ok, "{out}");
    assert!(out.contains("deposits held to their entries: 3;"), "{out}");

    // A deposit the balance's ceiling refuses is rolled back with its entry.
    exec(
        &pool,
        "UPDATE funding_accounts SET balance = 99999999999999999999
         WHERE user_id = 7 AND asset = 'USDT'",
    )
    .await;
    let big = json!({"user_id": 7, "asset": "USDT", "amount": "1", "external_id": "bank-44"});
    let (status, refused) = post_deposit(&api, &big).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(head(&pool).await, 3);
}

#[tokio::test]
async fn tlog_deposit_entries_of_earlier_deposits_are_appended_at_the_log_end_by_the_migration() {
    let db = TestDb::migrated_before(25).await;
    let pool = db.pool.clone();

    // The log and deposits as they stood: rows and balances, no entries, between events.
    append_created(&pool, 1).await;
    for (id, user, asset, amount, at) in [
        ("b-2", 2, "BTC", "7.500", "2026-01-02 03:04:05.123456+00"),
        ("a-1", 1, "USDT", "100", "2026-01-01 00:00:00+00"),
        ("C-3", 3, "USDT", "0.25", "2026-01-03 10:00:00.5+00"),
    ] {
        exec(
            &pool,
            &format!(
                "INSERT INTO external_deposits (external_id, user_id, asset, amount, created_at)
                 VALUES ('{id}', {user}, '{asset}', {amount}, '{at}')"
            ),
        )
        .await;
        exec(
            &pool,
            &format!(
                "INSERT INTO funding_accounts (user_id, asset, balance)
                 VALUES ({user}, '{asset}', {amount})"
            ),
        )
        .await;
    }
    append_created(&pool, 2).await;
    assert_eq!(head(&pool).await, 2);

    schema::MIGRATOR.run(&pool).await.unwrap();
    // At the log's end, after every event already there, in byte order of their external_ids.
    assert_eq!(
        deposit_entries(&pool).await,
        [
            (3, "C-3".to_owned(), Some(3)),
            (4, "a-1".to_owned(), Some(1)),
            (5, "b-2".to_owned(), Some(2)),
        ]
    );
    let (payload, occurred, event): (String, String, String) = sqlx::query_as(
        "SELECT payload::text,
                to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                event_type || ' ' || event_version || ' ' || sequence
         FROM events WHERE feed_position = 5",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        payload,
        r#"{"ExternalDeposited":{"external_id":"b-2","asset":"BTC","amount":"7.5","at":"2026-01-02T03:04:05.123456Z"}}"#
    );
    assert_eq!(occurred, "2026-01-02T03:04:05.123456Z");
    assert_eq!(event, "ExternalDeposited 1 1");

    // A deposit after it takes the next position, and the whole log verifies.
    let funding = adapters::FundingLedger::new(pool.clone());
    funding
        .external_deposit(
            "d-4",
            UserId::new(4).unwrap(),
            &AssetSymbol::parse("ETH").unwrap(),
            Amount::parse("2").unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        deposit_entries(&pool).await[3],
        (6, "d-4".to_owned(), Some(4))
    );
    assert_eq!(follow(&pool).await, 6);
    let report = tlog_follower::verify::verify(&pool, &signer().verifier(), &[], |_| {})
        .await
        .unwrap();
    assert_eq!(report.finding, None);
    assert_eq!((report.entries, report.deposits), (6, 4));
}
