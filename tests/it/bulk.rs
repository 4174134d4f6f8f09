//! Bulk transfers (`POST /api/v1/internal_transfers`, issue 25) over real HTTP, PostgreSQL and
//! spot-core: each item validated in contract §5.5's order with the single route's codes and
//! answered in request order, client keys across batches and the single route, limits counting
//! transfers, the admin's and the user's scope, the maximum, and crashes with half a batch's
//! calls made (recovered item by item, conservation exact).

use std::time::Duration;

use application::DailyLimits;
use domain::TransferState;
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{dec, token, ApiStack, Stack};
use crate::procs::{all_req_ids, spot_ops, state_of, wait_terminal, LedgerProcess, RECOVER_NOW};

const BULK: &str = "/api/v1/internal_transfers";

fn item(from: &str, to: &str, amount: &str) -> Value {
    json!({"from": from, "to": to, "asset": "USDT", "amount": amount})
}

async fn bulk(api: &ApiStack, token: &str, items: Vec<Value>) -> (u16, Vec<Value>) {
    let (status, body) = api
        .call(
            Method::POST,
            BULK,
            Some(token),
            Some(json!({ "transfers": items })),
        )
        .await;
    let results = body["results"].as_array().cloned().unwrap_or_default();
    (status, results)
}

fn code(result: &Value) -> &str {
    result["code"].as_str().unwrap_or("")
}

/// Each result's refusal code, or its transfer's state.
fn outcomes(results: &[Value]) -> Vec<&str> {
    results.iter().map(outcome).collect()
}

fn outcome(result: &Value) -> &str {
    result["code"]
        .as_str()
        .or(result["state"].as_str())
        .unwrap_or("?")
}

#[tokio::test]
async fn bulk_items_are_checked_one_by_one_in_seed_order_and_answered_in_request_order() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let user = api.token(1, false);
    let items = vec![
        item("FUNDING", "SPOT", "10"),
        // The account types come first in contract §5.5's order, before the asset.
        json!({"from": "WALLET", "to": "SPOT", "asset": "DOGE", "amount": "1"}),
        item("FUNDING", "FUNDING", "1"),
        json!({"from": "FUNDING", "to": "SPOT", "asset": "DOGE", "amount": "1"}),
        json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": 1}),
        item("FUNDING", "SPOT", "0.000000001"),
        json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1", "memo": "x"}),
        json!("not an object"),
        item("FUNDING", "SPOT", "1000"),
        json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "2", "cid": "bad key!"}),
        item("FUNDING", "SPOT", "20"),
    ];
    let (status, results) = bulk(&api, &user, items).await;
    assert_eq!(status, 200);
    assert_eq!(results.len(), 11, "one result per item");
    assert_eq!(results[0]["state"], "COMMITTED", "{}", results[0]);
    assert_eq!(code(&results[1]), "INVALID_ACCOUNT_TYPE");
    assert_eq!(code(&results[2]), "SAME_ACCOUNT");
    assert_eq!(code(&results[3]), "INVALID_ASSET");
    assert_eq!(code(&results[4]), "INVALID_AMOUNT");
    assert_eq!(code(&results[5]), "PRECISION_OVERFLOW");
    assert_eq!(code(&results[6]), "BAD_REQUEST");
    assert_eq!(code(&results[7]), "BAD_REQUEST");
    // A transfer the source refused exists: its code, req_id and state, as the single route says.
    assert_eq!(code(&results[8]), "INSUFFICIENT_BALANCE", "{}", results[8]);
    assert_eq!(results[8]["state"], "FAILED");
    assert!(results[8]["req_id"].is_string());
    assert_eq!(code(&results[9]), "INVALID_IDEMPOTENCY_KEY");
    assert_eq!(results[10]["state"], "COMMITTED");
    for r in results.iter().filter(|r| r.get("code").is_some()) {
        assert!(r["message"].is_string(), "{r}");
    }
    assert_ne!(results[0]["req_id"], results[10]["req_id"]);
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("70"));
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("30"));
    assert_eq!(
        all_req_ids(&api.stack).await.len(),
        3,
        "two committed, one failed"
    );

    // Both directions in one batch, each item its own transfer.
    let (status, results) = bulk(
        &api,
        &user,
        vec![item("SPOT", "FUNDING", "5"), item("FUNDING", "SPOT", "5")],
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        results.iter().all(|r| r["state"] == "COMMITTED"),
        "{results:?}"
    );
    api.stack.assert_invariant_exact().await;
}

#[tokio::test]
async fn bulk_cid_repeats_get_the_original_transfer_in_a_batch_later_batches_and_the_single_route()
{
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let user = api.token(1, false);
    let with_cid = |amount: &str, cid: &str| json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": amount, "cid": cid});
    // The single route first: a batch repeating its cid gets its transfer.
    let (status, single) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(with_cid("1", "c")),
        )
        .await;
    assert_eq!(status, 200, "{single}");
    let (_, first) = bulk(
        &api,
        &user,
        vec![
            with_cid("10", "a"),
            with_cid("10", "a"),
            with_cid("11", "a"),
            with_cid("2", "b"),
            with_cid("1", "c"),
        ],
    )
    .await;
    assert_eq!(first[0]["state"], "COMMITTED", "{first:?}");
    assert_eq!(
        first[1]["req_id"], first[0]["req_id"],
        "same cid and body: one transfer"
    );
    assert_eq!(code(&first[2]), "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(first[3]["state"], "COMMITTED");
    assert_eq!(first[4]["req_id"], single["req_id"]);
    // A later batch and the single route get the batch's originals.
    let (_, again) = bulk(&api, &user, vec![with_cid("10", "a"), with_cid("3", "b")]).await;
    assert_eq!(again[0]["req_id"], first[0]["req_id"]);
    assert_eq!(code(&again[1]), "IDEMPOTENCY_KEY_REUSED");
    let (status, repeat) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(with_cid("2", "b")),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(repeat["req_id"], first[3]["req_id"]);
    // 1 + 10 + 2 moved, each once.
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("87"));
    assert_eq!(all_req_ids(&api.stack).await.len(), 3);
    api.stack.assert_invariant_exact().await;
}

#[tokio::test]
async fn bulk_rate_and_daily_limits_count_transfers_not_requests() {
    let limits = edge::ratelimit::LimitsConfig {
        requests_per_second: Some(5),
        daily: DailyLimits {
            count_max: Some(3),
            amount_max: Default::default(),
        },
    };
    let api = ApiStack::start_with_limits(limits).await;
    api.stack.deposit(1, "USDT", "100").await;
    let user = api.token(1, false);
    // An invalid item is refused before it counts; then 5 pass the per-second gate (a burst of
    // its limit), 3 of them the daily count, in request order.
    let mut items = vec![item("FUNDING", "SPOT", "-1")];
    items.extend((0..7).map(|_| item("FUNDING", "SPOT", "1")));
    let (status, results) = bulk(&api, &user, items).await;
    assert_eq!(status, 200);
    assert_eq!(
        outcomes(&results),
        [
            "INVALID_AMOUNT",
            "COMMITTED",
            "COMMITTED",
            "COMMITTED",
            "DAILY_LIMIT_EXCEEDED",
            "DAILY_LIMIT_EXCEEDED",
            "RATE_LIMIT_EXCEEDED",
            "RATE_LIMIT_EXCEEDED"
        ]
    );
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("97"));
    api.stack.assert_invariant_exact().await;
}

/// The daily limits charge a batch at once (one reservation for all its items), with the
/// answers the same items sent one after another would get: per user, in request order, the
/// count and each asset's amount apart. Batches and single requests racing at the limit never
/// pass it together.
#[tokio::test]
async fn bulk_daily_limits_charge_the_batch_at_once_as_one_item_after_another() {
    let limits = edge::ratelimit::LimitsConfig {
        requests_per_second: None,
        daily: DailyLimits {
            count_max: Some(3),
            amount_max: [(domain::AssetSymbol::parse("USDT").unwrap(), dec("10"))]
                .into_iter()
                .collect(),
        },
    };
    let api = ApiStack::start_with_limits(limits).await;
    for user in [1, 2, 3] {
        api.stack.deposit(user, "USDT", "100").await;
        api.stack.deposit(user, "ETH", "100").await;
    }
    let admin = api.token(9, true);
    let of = |user: u64, asset: &str, amount: &str| {
        let mut item = json!({"from": "FUNDING", "to": "SPOT", "asset": asset, "amount": amount});
        item["user_id"] = json!(user);
        item
    };
    let items = vec![
        of(1, "USDT", "11"), // over the day's amount alone
        of(1, "USDT", "6"),
        of(2, "USDT", "10"), // another user's own counters
        of(1, "USDT", "5"),  // 11 in the day
        of(1, "ETH", "50"),  // no amount limit on ETH
        of(1, "USDT", "4"),  // the third transfer, 10 in the day
        of(1, "ETH", "1"),   // a fourth
    ];
    let (status, results) = bulk(&api, &admin, items).await;
    assert_eq!(status, 200);
    assert_eq!(
        outcomes(&results),
        [
            "DAILY_AMOUNT_EXCEEDED",
            "COMMITTED",
            "COMMITTED",
            "DAILY_AMOUNT_EXCEEDED",
            "COMMITTED",
            "COMMITTED",
            "DAILY_LIMIT_EXCEEDED"
        ]
    );
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("90"));
    assert_eq!(api.stack.funding_balance(1, "ETH").await, dec("50"));
    // The single route sees the same counters: user 1's day is used up, user 2's amount too.
    let single = |user: u64, asset: &'static str| {
        let api = &api;
        async move {
            let (_, body) = api
                .call(
                    Method::POST,
                    "/api/v1/internal_transfer",
                    Some(&api.token(user, false)),
                    Some(json!({"from": "FUNDING", "to": "SPOT", "asset": asset, "amount": "1"})),
                )
                .await;
            outcome(&body).to_owned()
        }
    };
    assert_eq!(single(1, "ETH").await, "DAILY_LIMIT_EXCEEDED");
    assert_eq!(single(2, "USDT").await, "DAILY_AMOUNT_EXCEEDED");
    // Racing: four batches of three and three single requests for user 3, who may make three.
    let batch = || {
        let api = &api;
        let admin = admin.clone();
        async move {
            let items = (0..3).map(|_| of(3, "ETH", "1")).collect();
            let (status, results) = bulk(api, &admin, items).await;
            assert_eq!(status, 200);
            results.iter().filter(|r| r["state"] == "COMMITTED").count()
        }
    };
    let (b1, b2, b3, b4, s1, s2, s3) = tokio::join!(
        batch(),
        batch(),
        batch(),
        batch(),
        single(3, "ETH"),
        single(3, "ETH"),
        single(3, "ETH")
    );
    let singles = [s1, s2, s3].iter().filter(|s| *s == "COMMITTED").count();
    assert_eq!(b1 + b2 + b3 + b4 + singles, 3, "exactly the day's three");
    assert_eq!(api.stack.funding_balance(3, "ETH").await, dec("97"));
    api.stack.assert_invariant_exact().await;
}

#[tokio::test]
async fn bulk_admin_names_a_user_per_item_and_a_user_moves_only_its_own_money() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    api.stack.deposit(2, "USDT", "100").await;
    let admin = api.token(9, true);
    let mut for_2 = item("FUNDING", "SPOT", "20");
    for_2["user_id"] = json!(2);
    let mut for_1 = item("FUNDING", "SPOT", "10");
    for_1["user_id"] = json!("1");
    let mut bad_user = item("FUNDING", "SPOT", "1");
    bad_user["user_id"] = json!("abc");
    let (status, results) = bulk(
        &api,
        &admin,
        vec![for_1, for_2.clone(), bad_user, item("FUNDING", "SPOT", "1")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(results[0]["state"], "COMMITTED", "{results:?}");
    assert_eq!(results[1]["state"], "COMMITTED");
    assert_eq!(code(&results[2]), "INVALID_USER_ID");
    // Without a user_id an admin moves its own money (none here).
    assert_eq!(
        code(&results[3]),
        "SOURCE_ACCOUNT_NOT_FOUND",
        "{}",
        results[3]
    );
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("90"));
    assert_eq!(api.stack.funding_balance(2, "USDT").await, dec("80"));

    // A user's token: an item naming any user, even itself, is refused; the others go on.
    let user = api.token(1, false);
    let mut own = item("FUNDING", "SPOT", "1");
    own["user_id"] = json!(1);
    let (status, results) = bulk(&api, &user, vec![for_2, own, item("FUNDING", "SPOT", "5")]).await;
    assert_eq!(status, 200);
    assert_eq!(code(&results[0]), "FORBIDDEN");
    assert_eq!(code(&results[1]), "FORBIDDEN");
    assert_eq!(results[2]["state"], "COMMITTED");
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("85"));
    assert_eq!(api.stack.funding_balance(2, "USDT").await, dec("80"));
    // No token at all: the whole request.
    let (status, body) = api
        .call(Method::POST, BULK, None, Some(json!({"transfers": []})))
        .await;
    assert_eq!(status, 401, "{body}");
    api.stack.assert_invariant_exact().await;
}

#[tokio::test]
async fn bulk_over_the_maximum_or_not_a_batch_is_refused_whole() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100000").await;
    let user = api.token(1, false);
    let max = application::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT;
    let over: Vec<Value> = (0..=max).map(|_| item("FUNDING", "SPOT", "1")).collect();
    let (status, body) = api
        .call(
            Method::POST,
            BULK,
            Some(&user),
            Some(json!({ "transfers": over })),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "BAD_REQUEST");
    assert!(
        body["message"].as_str().unwrap().contains("at most 1000"),
        "{body}"
    );
    for not_a_batch in [
        json!({"transfers": []}),
        json!({"transfers": {"from": "FUNDING"}}),
        json!({}),
        json!({"transfers": [], "extra": 1}),
        json!([item("FUNDING", "SPOT", "1")]),
    ] {
        let (status, body) = api
            .call(Method::POST, BULK, Some(&user), Some(not_a_batch.clone()))
            .await;
        assert_eq!(status, 400, "{not_a_batch}: {body}");
        assert_eq!(body["code"], "BAD_REQUEST");
    }
    // A body over this route's own limit (not the single route's 16 KB) is refused 413, and the
    // message names the limit that applies here.
    let limit = application::bulk::body_bytes_max(max);
    let padded = json!({"transfers": [{"from": "FUNDING", "to": "SPOT", "asset": "USDT",
        "amount": "1", "cid": "x".repeat(limit)}]});
    let (status, body) = api
        .call(Method::POST, BULK, Some(&user), Some(padded))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], "BAD_REQUEST");
    assert_eq!(
        body["message"],
        format!("request body is larger than {limit} bytes"),
        "{body}"
    );
    assert!(all_req_ids(&api.stack).await.is_empty(), "nothing created");
    // The maximum itself is accepted, every item its own transfer.
    let full: Vec<Value> = (0..max).map(|_| item("FUNDING", "SPOT", "1")).collect();
    let (status, results) = bulk(&api, &user, full).await;
    assert_eq!(status, 200);
    assert_eq!(results.len(), max);
    assert!(results.iter().all(|r| r["state"] == "COMMITTED"));
    assert_eq!(all_req_ids(&api.stack).await.len(), max);
    api.stack.assert_invariant_exact().await;
}

/// Runs a batch of 10 FUNDING→SPOT transfers of 5 USDT (user 1 holds 100) through a `ledger
/// serve` that aborts with half the batch's calls of one step made, checks what the crash left,
/// then lets a new process's recovery worker finish every item: each committed once, and the
/// conservation check exact.
async fn crash_mid_batch(failpoint: &str, left_in: TransferState) -> Stack {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    let env = [
        ("LEDGER_FAILPOINT", failpoint),
        ("LEDGER_ALLOW_FAILPOINTS", "1"),
        ("LEDGER_RECOVERY_STALE_MS", "3600000"),
    ];
    let mut crashing = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let items: Vec<Value> = (0..10).map(|_| item("FUNDING", "SPOT", "5")).collect();
    crashing
        .post_until_the_fail_point(
            BULK,
            &token(1, false),
            json!({ "transfers": items }),
            failpoint,
        )
        .await;

    let ids = all_req_ids(&s).await;
    assert_eq!(ids.len(), 10, "every item was created, in one append");
    let mut withdrawn = 0;
    let mut deposited = 0;
    for id in &ids {
        assert_eq!(state_of(&s, id).await, left_in);
        withdrawn += s.funding.journal_for(&id.to_string()).await.unwrap().len();
        deposited += spot_ops(&s, id).await.len();
    }
    match left_in {
        TransferState::SourcePending => assert_eq!((withdrawn, deposited), (5, 0)),
        _ => assert_eq!((withdrawn, deposited), (10, 5)),
    }

    let _recovering = LedgerProcess::start(&s.db.url, &s.spot, &RECOVER_NOW);
    for id in &ids {
        let t = wait_terminal(&s, id, Duration::from_secs(60)).await;
        assert_eq!(t.state, TransferState::Committed, "{id}");
        let journal = s.funding.journal_for(&id.to_string()).await.unwrap();
        assert_eq!(journal.len(), 1, "one withdraw per item");
        assert_eq!(spot_ops(&s, id).await.len(), 1, "one deposit per item");
    }
    assert_eq!(s.funding_balance(1, "USDT").await, dec("50"));
    assert_eq!(s.spot_balance(1, "USDT").await, dec("50"));
    assert_eq!(s.in_flight(1, "USDT").await, dec("0"));
    s.assert_invariant_exact().await;
    s
}

#[tokio::test]
async fn bulk_crash_with_half_the_withdraws_made_recovers_each_item_once() {
    crash_mid_batch("bulk_half_withdrawn", TransferState::SourcePending).await;
}

#[tokio::test]
async fn bulk_crash_with_half_the_deposits_made_recovers_each_item_once() {
    crash_mid_batch("bulk_half_deposited", TransferState::TargetPending).await;
}

/// The funding ledger's many-movements call: fresh movements decided in one call of its batch,
/// a refusal, a repeat and a key held for another movement each answered as alone.
#[tokio::test]
async fn funding_movements_in_one_call_answer_each_movement_as_alone() {
    use domain::{
        AccountPort, AdapterOutcome, Amount, AssetSymbol, Movement, Operation, ReqId, UserId,
    };
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    let m = |amount: &str| Movement {
        req_id: ReqId::generate(),
        user_id: UserId::new(1).unwrap(),
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse(amount).unwrap(),
    };
    let first = m("10");
    let batch = vec![first.clone(), m("20"), m("1000"), first.clone()];
    let port: &dyn AccountPort = &s.funding;
    let answered = port.movements(Operation::Withdraw, &batch).await;
    assert_eq!(answered[0], AdapterOutcome::Success);
    assert_eq!(answered[1], AdapterOutcome::Success);
    assert!(
        matches!(&answered[2], AdapterOutcome::ExplicitFail { code, .. } if code == "INSUFFICIENT_BALANCE"),
        "{:?}",
        answered[2]
    );
    assert_eq!(
        answered[3],
        AdapterOutcome::Success,
        "a repeat: the first answer"
    );
    let other = Movement {
        amount: Amount::parse("11").unwrap(),
        ..first.clone()
    };
    let answered = port.movements(Operation::Withdraw, &[other]).await;
    assert!(matches!(answered[0], AdapterOutcome::Mismatch(_)));
    assert_eq!(s.funding_balance(1, "USDT").await, dec("70"));
}
