//! The consumer feed: dense positions, event ids, admin only, and the proof that a consumer
//! polling from position P never misses an event that commits later: an append takes its
//! positions only once every lower one has committed or been given back, under many concurrent
//! writers (some holding their transactions open, some appending several transfers' events in
//! one transaction as the batched repository does).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use domain::{AccountType, Amount, AssetSymbol, ReqId, TransferEvent, UserId};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::ApiStack;
use crate::procs::LedgerProcess;

/// Appends one new transfer's `TransferCreated` the way postgres-es does (its seven columns
/// only, its feed position from the column's default), on `conn` (a transaction's, or a pool);
/// returns its event id.
pub(crate) async fn append_created<'c>(conn: impl sqlx::PgExecutor<'c>, user: u64) -> String {
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
    .execute(conn)
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

/// Appends one `TransferCreated` in a transaction of its own, on a task, and commits it.
fn append_and_commit(pool: &PgPool, user: u64) -> tokio::task::JoinHandle<String> {
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut tx = pool.begin().await.unwrap();
        let id = append_created(&mut *tx, user).await;
        tx.commit().await.unwrap();
        id
    })
}

async fn feed_ids(api: &ApiStack, admin: &str) -> Vec<(i64, String)> {
    page(api, admin, 0, 100).await["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["position"].as_i64().unwrap(),
                e["event_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn feed_never_delivers_a_position_while_a_lower_one_may_still_commit() {
    let api = ApiStack::start().await;
    let pool = &api.stack.db.pool;
    let admin = api.token(1, true);

    // A takes position 1 and stays open. B's append must wait: it cannot take a position while a
    // lower one may still commit.
    let mut a = pool.begin().await.unwrap();
    append_created(&mut *a, 1).await;
    let b = append_and_commit(pool, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished(), "B appended while A held a lower position");
    assert!(feed_ids(&api, &admin).await.is_empty());

    // A rolls back: its position is given back with it, so B takes 1 and there is no gap.
    a.rollback().await.unwrap();
    let b_id = b.await.unwrap();
    assert_eq!(feed_ids(&api, &admin).await, [(1, b_id.clone())]);

    // C takes 2 and stays open; D waits, and follows C once C commits.
    let mut c = pool.begin().await.unwrap();
    let c_id = append_created(&mut *c, 3).await;
    let d = append_and_commit(pool, 4);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!d.is_finished(), "D appended while C held a lower position");
    assert_eq!(feed_ids(&api, &admin).await, [(1, b_id.clone())]);
    c.commit().await.unwrap();
    let d_id = d.await.unwrap();
    assert_eq!(
        feed_ids(&api, &admin).await,
        [(1, b_id), (2, c_id), (3, d_id)]
    );
}

#[tokio::test]
async fn feed_has_no_gap_and_no_duplicate_under_many_concurrent_writers() {
    const WRITERS: u64 = 12;
    const TXS_PER_WRITER: u64 = 20;
    const TRANSFERS: usize = 24;
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
                    ids.push(append_created(&mut *tx, 100 + w).await);
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
    // Real transfers at the same time, five events each, through this process's API and through
    // two more `ledger serve` processes: three appenders, each batching its own commits, with the
    // raw writers above between them. Their recovery workers must leave the raw writers'
    // `TransferCreated`s alone: driven once they are 5 s old (the default), which a loaded
    // machine reaches before the check, they appended events after the written set was taken.
    let quiet = [("LEDGER_RECOVERY_STALE_MS", "600000")];
    let serving = [
        LedgerProcess::start(&api.stack.db.url, &api.stack.spot, &quiet),
        LedgerProcess::start(&api.stack.db.url, &api.stack.spot, &quiet),
    ];
    let bases: Vec<String> = std::iter::once(api.base.clone())
        .chain(serving.iter().map(|p| p.base.clone()))
        .collect();
    let user = api.token(500, false);
    let mut transfers = Vec::new();
    for i in 0..TRANSFERS {
        let http = api.http.clone();
        let url = format!("{}/api/v1/internal_transfer", bases[i % bases.len()]);
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
        seen.len() as u64 >= raw_count + TRANSFERS as u64 * 5,
        "{} events",
        seen.len()
    );
    // Every event of the user's transfers carries its owner, whichever process appended it, and
    // so does its deposit's one event, so the user's own stream holds all of them.
    let (owned, of_user, deposits): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM feed WHERE user_id = 500),
                (SELECT count(*) FROM events e JOIN events c
                   ON c.aggregate_type = e.aggregate_type AND c.aggregate_id = e.aggregate_id
                  AND c.sequence = 1
                 WHERE c.payload -> 'TransferCreated' ->> 'user_id' = '500'),
                (SELECT count(*) FROM external_deposits WHERE user_id = 500)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(deposits, 1);
    assert_eq!(owned, of_user + deposits);
    assert!(
        of_user >= TRANSFERS as i64 * 3,
        "{of_user} events of user 500"
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
    // The deposit's one event, then the transfer's five.
    let body = page(&api, &admin, 0, 2).await;
    assert_eq!(body["events"].as_array().unwrap().len(), 2);
    assert_eq!(body["next_after"], 2);
    assert_eq!(body["head"], 6);
    let deposit = &body["events"][0];
    assert_eq!(deposit["aggregate_type"], "Deposit");
    assert_eq!(deposit["event_type"], "ExternalDeposited");
    assert_eq!(deposit["user_id"], 3);
    assert_eq!(deposit["payload"]["ExternalDeposited"]["amount"], "10");
    let first = &body["events"][1];
    assert_eq!(first["event_id"], format!("Transfer:{}:1", t.req_id));
    assert_eq!(first["event_type"], "TransferCreated");
    assert_eq!(first["user_id"], 3);
    let rest = page(&api, &admin, 3, 100).await;
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
        .get(format!("{}/api/v1/events/stream?after=2", api.base))
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
    while !text.contains("id: 6") {
        let chunk = tokio::time::timeout_at(deadline.into(), resp.chunk())
            .await
            .expect("stream delivers events in time")
            .unwrap()
            .expect("stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    // Position 1 is the deposit's event, 2 the transfer's creation.
    assert!(
        !text.contains("id: 1\n") && !text.contains("id: 2\n"),
        "starts after the given position: {text}"
    );
    for (id, kind) in [(3, "SourceWithdrawStarted"), (6, "TransferCommitted")] {
        assert!(text.contains(&format!("id: {id}")), "{text}");
        assert!(text.contains(&format!("event: {kind}")), "{text}");
    }
}

/// `follow=false`: the events up to the head the request found, then the stream ends (what a
/// schema-driven client, `scripts/schemathesis` among them, reads to its end); a bad value is
/// BAD_REQUEST.
#[tokio::test]
async fn an_event_stream_not_following_ends_at_the_head() {
    let api = ApiStack::start().await;
    let admin = api.token(1, true);
    api.stack.deposit(4, "USDT", "10").await;
    api.stack
        .transfer(4, AccountType::Funding, AccountType::Spot, "USDT", "1")
        .await;
    let stream = |query: &'static str| {
        api.http
            .get(format!("{}/api/v1/events/stream?{query}", api.base))
            .bearer_auth(&admin)
            .send()
    };
    let resp = stream("after=2&follow=false").await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(20), resp.text())
        .await
        .expect("the stream ends")
        .unwrap();
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert_eq!(ids, ["3", "4", "5", "6"], "{text}");
    assert!(text.contains("event: TransferCommitted"), "{text}");
    // Past the head: nothing, and the end at once.
    let resp = stream("after=6&follow=false").await.unwrap();
    let text = tokio::time::timeout(Duration::from_secs(20), resp.text())
        .await
        .expect("the stream ends")
        .unwrap();
    assert!(!text.contains("id: "), "{text}");
    let resp = stream("follow=maybe").await.unwrap();
    assert_eq!(resp.status(), 400);
}
