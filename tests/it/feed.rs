//! The consumer feed: dense positions, event ids, admin only, and the proof that a consumer
//! polling from position P never misses an event that commits later with a lower raw position,
//! under many concurrent writers (some holding their transactions open, some batching several
//! transfers' events in one transaction as the batched repository will).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use domain::{AccountType, Amount, AssetSymbol, ReqId, TransferEvent, UserId};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::ApiStack;

/// Appends one new transfer's `TransferCreated` the way postgres-es does (its seven columns
/// only), inside `tx`; returns its event id.
async fn append_created(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, user: u64) -> String {
    let req_id = ReqId::generate();
    let event = TransferEvent::TransferCreated {
        req_id,
        user_id: UserId::new(user).unwrap(),
        from: AccountType::Funding,
        to: AccountType::Spot,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("1").unwrap(),
        cid: None,
        at: Utc::now(),
    };
    sqlx::query(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version,
            payload, metadata) VALUES ('Transfer', $1, 1, 'TransferCreated', '1', $2, '{}')",
    )
    .bind(req_id.to_string())
    .bind(serde_json::to_value(&event).unwrap())
    .execute(&mut **tx)
    .await
    .unwrap();
    format!("Transfer:{req_id}:1")
}

async fn all_event_ids(pool: &PgPool) -> HashSet<String> {
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT aggregate_type, aggregate_id, sequence FROM events")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(t, id, seq)| format!("{t}:{id}:{seq}"))
        .collect()
}

async fn page(api: &ApiStack, admin: &str, after: i64, limit: i64) -> Value {
    let (status, body) = api
        .call(
            Method::GET,
            &format!("/api/v1/events?after={after}&limit={limit}"),
            Some(admin),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn feed_never_delivers_a_position_while_a_lower_one_may_still_commit() {
    let api = ApiStack::start().await;
    let pool = &api.stack.db.pool;
    let admin = api.token(1, true);

    // A takes the lower raw position and stays open; B takes a higher one and commits first.
    let mut a = pool.begin().await.unwrap();
    let a_id = append_created(&mut a, 1).await;
    let mut b = pool.begin().await.unwrap();
    let b_id = append_created(&mut b, 2).await;
    b.commit().await.unwrap();
    let raw: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate_id, global_position FROM events")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(raw.len(), 1, "only B is visible to a naive reader: {raw:?}");
    assert_eq!(
        raw[0].1, 2,
        "and it has position 2 while position 1 is still open"
    );

    // The projector cannot hand B out yet: A's transaction is older than the horizon.
    let caught_up = projections::Projector::new(pool.clone())
        .catch_up(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(!caught_up, "the horizon must wait for A");
    assert!(page(&api, &admin, 0, 100).await["events"]
        .as_array()
        .unwrap()
        .is_empty());

    a.commit().await.unwrap();
    api.stack.wait_for_projections().await;
    let body = page(&api, &admin, 0, 100).await;
    let ids: Vec<&str> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [a_id.as_str(), b_id.as_str()]);
    assert_eq!(body["events"][0]["position"], 1);
    assert_eq!(body["events"][1]["position"], 2);
}

#[tokio::test]
async fn feed_has_no_gap_and_no_duplicate_under_many_concurrent_writers() {
    const WRITERS: u64 = 12;
    const TXS_PER_WRITER: u64 = 20;
    let api = ApiStack::start().await;
    let pool = api.stack.db.pool.clone();
    let admin = api.token(1, true);
    api.stack.deposit(500, "USDT", "1000").await;

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..TXS_PER_WRITER {
                let mut tx = pool.begin().await.unwrap();
                // 1 to 3 transfers' events in one transaction, like a batched append.
                for _ in 0..=((w + i) % 3) {
                    ids.push(append_created(&mut tx, 100 + w).await);
                }
                // Hold the transaction open for a while so commits interleave out of position
                // order.
                let hold_ms = (w * 7 + i * 13) % 17;
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                tx.commit().await.unwrap();
            }
            ids
        }));
    }
    // Real transfers through the API at the same time: five events each, own transactions.
    let user = api.token(500, false);
    let mut transfers = Vec::new();
    for _ in 0..8 {
        let http = api.http.clone();
        let url = format!("{}/api/v1/internal_transfer", api.base);
        let user = user.clone();
        transfers.push(tokio::spawn(async move {
            let resp = http
                .post(url)
                .bearer_auth(user)
                .json(&json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }));
    }

    // The consumer polls with small pages from the start while the writers run.
    let mut seen: Vec<String> = Vec::new();
    let mut seen_set = HashSet::new();
    let mut after = 0i64;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut writers_done = false;
    let mut written: HashSet<String> = HashSet::new();
    loop {
        let body = page(&api, &admin, after, 37).await;
        let events = body["events"].as_array().unwrap();
        for e in events {
            let position = e["position"].as_i64().unwrap();
            assert_eq!(position, after + 1, "a gap or a repeat in the feed: {e}");
            after = position;
            let id = e["event_id"].as_str().unwrap().to_owned();
            assert!(seen_set.insert(id.clone()), "event {id} delivered twice");
            seen.push(id);
        }
        if !writers_done
            && writers.iter().all(|w| w.is_finished())
            && transfers.iter().all(|t| t.is_finished())
        {
            writers_done = true;
            for w in writers.drain(..) {
                written.extend(w.await.unwrap());
            }
            for t in transfers.drain(..) {
                t.await.unwrap();
            }
            written.extend(all_event_ids(&pool).await);
        }
        if writers_done && seen_set.len() >= written.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "feed did not deliver every event in time"
        );
        if events.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(
        seen_set, written,
        "the feed delivered exactly the events written"
    );
    let raw_count = WRITERS * TXS_PER_WRITER;
    assert!(
        seen.len() as u64 >= raw_count + 8 * 5,
        "{} events",
        seen.len()
    );
}

#[tokio::test]
async fn feed_is_for_admins_and_validates_its_parameters() {
    let api = ApiStack::start().await;
    let user = api.token(3, false);
    let admin = api.token(1, true);
    let (status, body) = api.call(Method::GET, "/api/v1/events", None, None).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("UNAUTHORIZED")));
    let (status, body) = api
        .call(Method::GET, "/api/v1/events", Some(&user), None)
        .await;
    assert_eq!((status, body["code"].as_str()), (403, Some("FORBIDDEN")));
    for bad in ["after=-1", "limit=0", "limit=1001", "after=x"] {
        let (status, body) = api
            .call(
                Method::GET,
                &format!("/api/v1/events?{bad}"),
                Some(&admin),
                None,
            )
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("BAD_REQUEST")),
            "{bad}"
        );
    }
    api.stack.deposit(3, "USDT", "10").await;
    let t = api
        .stack
        .transfer(3, AccountType::Funding, AccountType::Spot, "USDT", "4")
        .await;
    api.stack.wait_for_projections().await;
    let body = page(&api, &admin, 0, 2).await;
    assert_eq!(body["events"].as_array().unwrap().len(), 2);
    assert_eq!(body["next_after"], 2);
    assert_eq!(body["head"], 5);
    let first = &body["events"][0];
    assert_eq!(first["event_id"], format!("Transfer:{}:1", t.req_id));
    assert_eq!(first["event_type"], "TransferCreated");
    assert_eq!(first["user_id"], 3);
    let rest = page(&api, &admin, 2, 100).await;
    let types: Vec<&str> = rest["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "SourceWithdrawn",
            "TargetDepositStarted",
            "TransferCommitted"
        ]
    );
}

#[tokio::test]
async fn event_stream_sends_each_event_with_its_position_as_id() {
    let api = ApiStack::start().await;
    let admin = api.token(1, true);
    api.stack.deposit(4, "USDT", "10").await;
    api.stack
        .transfer(4, AccountType::Funding, AccountType::Spot, "USDT", "1")
        .await;
    let mut resp = api
        .http
        .get(format!("{}/api/v1/events/stream?after=1", api.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text.contains("id: 5") {
        let chunk = tokio::time::timeout_at(deadline.into(), resp.chunk())
            .await
            .expect("stream delivers events in time")
            .unwrap()
            .expect("stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        !text.contains("id: 1\n"),
        "starts after the given position: {text}"
    );
    for (id, kind) in [(2, "SourceWithdrawStarted"), (5, "TransferCommitted")] {
        assert!(text.contains(&format!("id: {id}")), "{text}");
        assert!(text.contains(&format!("event: {kind}")), "{text}");
    }
}
