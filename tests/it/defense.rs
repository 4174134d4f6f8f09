//! Defence in depth (contract §5): each check refused with its code at the API, and the
//! same bad request sent straight to the coordinator, to an adapter and to spot-core over raw TCP
//! refused there too. Also rate limits with Retry-After, admin asset changes that persist across
//! instances, and request hygiene.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use adapters::{AccountStatus, FundingLedger};
use application::{CoordinatorError, DailyLimits, NewTransfer};
use domain::{
    AccountPort, AccountType, AdapterOutcome, Amount, AssetRegistry, AssetStatus, AssetSymbol,
    ErrorCode, Movement, ReqId, UserId,
};
use reqwest::Method;
use rust_decimal::Decimal;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::helpers::{dec, ApiStack, SpotProcess, Stack, JWT_SECRET};

const TRANSFER: &str = "/api/v1/internal_transfer";

fn user(n: u64) -> UserId {
    UserId::new(n).unwrap()
}

fn usdt() -> AssetSymbol {
    AssetSymbol::parse("USDT").unwrap()
}

fn request(from: AccountType, to: AccountType, asset: &str, amount: &str) -> NewTransfer {
    try_request(from, to, asset, amount).unwrap()
}

/// A request whose asset symbol may not even parse: a `NewTransfer` holds an `AssetSymbol`, so a
/// malformed one is refused, with the same code, before it can reach the coordinator.
fn try_request(
    from: AccountType,
    to: AccountType,
    asset: &str,
    amount: &str,
) -> Result<NewTransfer, ErrorCode> {
    Ok(NewTransfer {
        user_id: user(1),
        from,
        to,
        asset: AssetSymbol::parse(asset)?,
        amount: Amount::parse(amount).unwrap(),
        cid: None,
    })
}

/// Transfer events only: the stack's deposit is an event too (aggregate `Deposit`).
async fn events(stack: &Stack) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM events WHERE aggregate_type = 'Transfer'")
        .fetch_one(&stack.db.pool)
        .await
        .unwrap()
}

fn set_asset(stack: &Stack, symbol: &str, change: impl FnOnce(&mut domain::AssetConfig)) {
    let mut registry = stack.assets.write().unwrap();
    let mut config = registry.get(symbol).unwrap().clone();
    change(&mut config);
    registry.upsert(config);
}

// ---- coordinator ------------------------------------------------------------------------------

#[tokio::test]
async fn coordinator_refuses_every_request_check_without_creating_anything() {
    use AccountType::{Funding, Future, Margin, Spot};
    let stack = Stack::start().await;
    stack.deposit(1, "USDT", "100").await;
    set_asset(&stack, "BTC", |a| a.status = AssetStatus::Suspended);
    set_asset(&stack, "ETH", |a| a.internal_transfer_enabled = false);
    set_asset(&stack, "USDT", |a| a.min_transfer_amount = dec("0.01"));
    let cases = [
        (try_request(Spot, Spot, "USDT", "1"), ErrorCode::SameAccount),
        (
            try_request(Funding, Funding, "USDT", "1"),
            ErrorCode::SameAccount,
        ),
        (
            try_request(Funding, Future, "USDT", "1"),
            ErrorCode::UnsupportedAccountType,
        ),
        (
            try_request(Margin, Spot, "USDT", "1"),
            ErrorCode::UnsupportedAccountType,
        ),
        (
            try_request(Funding, Spot, "DOGE", "1"),
            ErrorCode::InvalidAsset,
        ),
        (
            try_request(Funding, Spot, "usdt", "1"),
            ErrorCode::InvalidAsset,
        ),
        (try_request(Funding, Spot, "", "1"), ErrorCode::InvalidAsset),
        (
            try_request(Funding, Spot, "BTC", "1"),
            ErrorCode::AssetSuspended,
        ),
        (
            try_request(Funding, Spot, "ETH", "1"),
            ErrorCode::TransferNotAllowed,
        ),
        (
            try_request(Funding, Spot, "USDT", "0.000000001"),
            ErrorCode::PrecisionOverflow,
        ),
        (
            try_request(Funding, Spot, "USDT", "0.001"),
            ErrorCode::AmountTooSmall,
        ),
        (
            try_request(Funding, Spot, "USDT", "100000001"),
            ErrorCode::AmountTooLarge,
        ),
    ];
    for (req, code) in cases {
        let got = match req.clone() {
            Ok(req) => stack.coordinator.submit(req).await,
            Err(refused) => Err(CoordinatorError::Refused(refused)),
        };
        assert_eq!(got, Err(CoordinatorError::Refused(code)), "{req:?}");
    }
    for cid in ["", "has space", "ünï", &"x".repeat(65), "a/b"] {
        let mut req = request(Funding, Spot, "USDT", "1");
        req.cid = Some(cid.to_owned());
        assert_eq!(
            stack.coordinator.submit(req).await,
            Err(CoordinatorError::Refused(ErrorCode::InvalidIdempotencyKey)),
            "{cid:?}"
        );
    }
    assert_eq!(
        events(&stack).await,
        0,
        "no refused request created a transfer"
    );
    assert_eq!(stack.funding_balance(1, "USDT").await, dec("100"));
}

#[test]
fn amounts_that_are_not_positive_or_overflow_cannot_even_be_built() {
    // The coordinator and the adapters take an `Amount`, so these never reach them.
    assert_eq!(
        Amount::from_decimal(Decimal::ZERO),
        Err(ErrorCode::InvalidAmount)
    );
    assert_eq!(
        Amount::from_decimal(dec("-100")),
        Err(ErrorCode::InvalidAmount)
    );
    assert_eq!(
        Amount::from_decimal(dec("100000000000")),
        Err(ErrorCode::Overflow)
    );
    assert_eq!(Amount::from_decimal(Decimal::MAX), Err(ErrorCode::Overflow));
    assert_eq!(
        Amount::parse("18446744073709551616"),
        Err(ErrorCode::Overflow)
    );
    assert_eq!(UserId::new(0), Err(ErrorCode::InvalidUserId));
    // Nor deserialized from a message: the same checks run.
    let movement = |amount: &str, user: Value| {
        serde_json::from_value::<Movement>(json!({
            "req_id": ReqId::generate().to_string(), "user_id": user, "asset": "USDT", "amount": amount
        }))
    };
    assert!(movement("1", json!(1)).is_ok());
    for bad in ["-1", "0", "1e3", " 1", "18446744073709551616"] {
        assert!(movement(bad, json!(1)).is_err(), "{bad}");
    }
    assert!(movement("1", json!(0)).is_err());
    assert!(movement("1", json!(-1)).is_err());
}

#[tokio::test]
async fn coordinator_enforces_idempotency_keys_per_user() {
    let stack = Stack::start().await;
    stack.deposit(1, "USDT", "100").await;
    stack.deposit(2, "USDT", "100").await;
    let mut req = request(AccountType::Funding, AccountType::Spot, "USDT", "10");
    req.cid = Some("k-1".into());
    let first = stack.coordinator.submit(req.clone()).await.unwrap();
    let again = stack.coordinator.submit(req.clone()).await.unwrap();
    assert_eq!(first.req_id, again.req_id);
    let mut other_body = req.clone();
    other_body.amount = Amount::parse("11").unwrap();
    assert_eq!(
        stack.coordinator.submit(other_body).await,
        Err(CoordinatorError::Refused(ErrorCode::IdempotencyKeyReused))
    );
    let mut other_user = req.clone();
    other_user.user_id = user(2);
    let theirs = stack.coordinator.submit(other_user).await.unwrap();
    assert_ne!(theirs.req_id, first.req_id);
    assert_eq!(stack.funding_balance(1, "USDT").await, dec("90"));
    assert_eq!(stack.funding_balance(2, "USDT").await, dec("90"));
}

#[tokio::test]
async fn coordinator_enforces_daily_count_and_amount_across_coordinators() {
    let stack = Stack::start().await;
    stack.deposit(1, "USDT", "100").await;
    let limits = DailyLimits {
        count_max: Some(3),
        amount_max: [(usdt(), dec("25"))].into_iter().collect(),
    };
    // Two coordinators, as two processes would have, share the counters in PostgreSQL.
    let a = stack
        .another_coordinator()
        .with_daily_limits(limits.clone());
    let b = stack.another_coordinator().with_daily_limits(limits);
    let req = |amount: &str| request(AccountType::Funding, AccountType::Spot, "USDT", amount);
    assert!(a.submit(req("10")).await.is_ok());
    assert!(b.submit(req("10")).await.is_ok());
    assert_eq!(
        a.submit(req("5.00000001")).await,
        Err(CoordinatorError::Refused(ErrorCode::DailyAmountExceeded))
    );
    assert!(b.submit(req("5")).await.is_ok());
    assert_eq!(
        a.submit(req("0.1")).await,
        Err(CoordinatorError::Refused(ErrorCode::DailyLimitExceeded))
    );
    assert_eq!(stack.funding_balance(1, "USDT").await, dec("75"));
    // A repeat of a transfer with a cid is answered, not charged again.
    let limited = stack.another_coordinator().with_daily_limits(DailyLimits {
        count_max: Some(1),
        amount_max: Default::default(),
    });
    let mut keyed = request(AccountType::Funding, AccountType::Spot, "USDT", "1");
    keyed.user_id = user(2);
    keyed.cid = Some("once".into());
    stack.deposit(2, "USDT", "10").await;
    let first = limited.submit(keyed.clone()).await.unwrap();
    assert_eq!(
        limited.submit(keyed.clone()).await.unwrap().req_id,
        first.req_id
    );
    let mut another = keyed.clone();
    another.cid = Some("twice".into());
    assert_eq!(
        limited.submit(another).await,
        Err(CoordinatorError::Refused(ErrorCode::DailyLimitExceeded))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daily_count_holds_under_concurrent_requests() {
    let stack = Stack::start().await;
    stack.deposit(1, "USDT", "1000").await;
    let limits = DailyLimits {
        count_max: Some(5),
        amount_max: Default::default(),
    };
    let mut handles = Vec::new();
    for _ in 0..20 {
        let c = stack
            .another_coordinator()
            .with_daily_limits(limits.clone());
        let req = request(AccountType::Funding, AccountType::Spot, "USDT", "1");
        handles.push(tokio::spawn(async move { c.submit(req).await }));
    }
    let mut ok = 0;
    for h in handles {
        match h.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e, CoordinatorError::Refused(ErrorCode::DailyLimitExceeded)),
        }
    }
    assert_eq!(ok, 5);
    assert_eq!(stack.funding_balance(1, "USDT").await, dec("995"));
}

// ---- adapters ---------------------------------------------------------------------------------

fn movement(user_id: u64, asset: &str, amount: &str) -> Movement {
    Movement {
        req_id: ReqId::generate(),
        user_id: user(user_id),
        asset: AssetSymbol::parse(asset).unwrap(),
        amount: Amount::parse(amount).unwrap(),
    }
}

fn refused(outcome: AdapterOutcome) -> String {
    match outcome {
        AdapterOutcome::ExplicitFail { code, .. } => code,
        other => panic!("expected an explicit refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn funding_adapter_refuses_on_its_own() {
    let stack = Stack::start().await;
    let assets = Arc::new(RwLock::new(AssetRegistry::default_assets()));
    let funding = FundingLedger::new(stack.db.pool.clone()).with_assets(assets);
    stack.deposit(1, "USDT", "100").await;
    stack.deposit(2, "USDT", "100").await;
    stack.deposit(3, "USDT", "100").await;
    funding
        .set_status(user(2), &usdt(), AccountStatus::Frozen)
        .await
        .unwrap();
    funding
        .set_status(user(3), &usdt(), AccountStatus::Disabled)
        .await
        .unwrap();
    let cases = [
        (
            funding.withdraw(&movement(1, "DOGE", "1")).await,
            "INVALID_ASSET",
        ),
        (
            funding.deposit(&movement(1, "DOGE", "1")).await,
            "INVALID_ASSET",
        ),
        (
            funding.withdraw(&movement(1, "USDT", "0.000000001")).await,
            "PRECISION_OVERFLOW",
        ),
        (
            funding.deposit(&movement(1, "USDT", "0.000000001")).await,
            "PRECISION_OVERFLOW",
        ),
        (
            funding.withdraw(&movement(9, "USDT", "1")).await,
            "SOURCE_ACCOUNT_NOT_FOUND",
        ),
        (
            funding.deposit(&movement(9, "USDT", "1")).await,
            "TARGET_ACCOUNT_NOT_FOUND",
        ),
        (
            funding.withdraw(&movement(2, "USDT", "1")).await,
            "ACCOUNT_FROZEN",
        ),
        (
            funding.withdraw(&movement(3, "USDT", "1")).await,
            "ACCOUNT_DISABLED",
        ),
        (
            funding.deposit(&movement(3, "USDT", "1")).await,
            "ACCOUNT_DISABLED",
        ),
        (
            funding.withdraw(&movement(1, "USDT", "100.1")).await,
            "INSUFFICIENT_BALANCE",
        ),
        (
            funding.refund(&movement(1, "USDT", "1")).await,
            "NO_MATCHING_WITHDRAW",
        ),
    ];
    for (outcome, code) in cases {
        assert_eq!(refused(outcome), code);
    }
    for u in 1..=3 {
        assert_eq!(stack.funding_balance(u, "USDT").await, dec("100"));
    }
    // A used req_id with other details is never decided as a clean refusal or a success.
    let m = movement(1, "USDT", "1");
    assert_eq!(funding.withdraw(&m).await, AdapterOutcome::Success);
    let mut tampered = m.clone();
    tampered.amount = Amount::parse("2").unwrap();
    assert!(funding.withdraw(&tampered).await.is_unknown());
    tampered = m.clone();
    tampered.user_id = user(2);
    assert!(funding.withdraw(&tampered).await.is_unknown());
    assert_eq!(stack.funding_balance(1, "USDT").await, dec("99"));
    assert_eq!(stack.funding_balance(2, "USDT").await, dec("100"));
}

#[tokio::test]
async fn spot_adapter_refuses_on_its_own() {
    let stack = Stack::start().await;
    let spot = &stack.spot_adapter;
    assert_eq!(
        spot.deposit(&movement(1, "USDT", "100")).await,
        AdapterOutcome::Success
    );
    assert_eq!(
        spot.deposit(&movement(2, "USDT", "100")).await,
        AdapterOutcome::Success
    );
    assert_eq!(
        spot.deposit(&movement(3, "USDT", "100")).await,
        AdapterOutcome::Success
    );
    spot.set_status(user(2), &usdt(), AccountStatus::Frozen)
        .await
        .unwrap();
    spot.set_status(user(3), &usdt(), AccountStatus::Disabled)
        .await
        .unwrap();
    let cases = [
        (
            spot.withdraw(&movement(1, "DOGE", "1")).await,
            "INVALID_ASSET",
        ),
        (
            spot.deposit(&movement(1, "DOGE", "1")).await,
            "INVALID_ASSET",
        ),
        (
            spot.deposit(&movement(1, "USDT", "0.000000001")).await,
            "PRECISION_OVERFLOW",
        ),
        (
            spot.withdraw(&movement(1, "USDT", "0.000000001")).await,
            "PRECISION_OVERFLOW",
        ),
        (
            spot.withdraw(&movement(9, "USDT", "1")).await,
            "SOURCE_ACCOUNT_NOT_FOUND",
        ),
        (
            spot.withdraw(&movement(2, "USDT", "1")).await,
            "ACCOUNT_FROZEN",
        ),
        (
            spot.withdraw(&movement(3, "USDT", "1")).await,
            "ACCOUNT_DISABLED",
        ),
        (
            spot.deposit(&movement(3, "USDT", "1")).await,
            "ACCOUNT_DISABLED",
        ),
        (
            spot.withdraw(&movement(1, "USDT", "100.1")).await,
            "INSUFFICIENT_BALANCE",
        ),
        (
            spot.refund(&movement(1, "USDT", "1")).await,
            "NO_MATCHING_WITHDRAW",
        ),
    ];
    for (outcome, code) in cases {
        assert_eq!(refused(outcome), code);
    }
    for u in 1..=3 {
        assert_eq!(stack.spot_balance(u, "USDT").await, dec("100"));
    }
}

// ---- spot-core over raw TCP -------------------------------------------------------------------

/// Sends raw protocol lines to spot-core on one connection, after its `hello`, and returns each
/// answer.
async fn raw_lines(spot: &SpotProcess, lines: &[String]) -> Vec<Value> {
    let stream = tokio::net::TcpStream::connect(&spot.addr).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read).lines();
    let mut answers = Vec::new();
    let hello = json!({"op": "hello", "token": spot.token}).to_string();
    for line in std::iter::once(&hello).chain(lines) {
        write.write_all(line.as_bytes()).await.unwrap();
        write.write_all(b"\n").await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), reader.next_line())
            .await
            .expect("spot-core answers within 5 s")
            .unwrap()
            .expect("a line");
        answers.push(serde_json::from_str::<Value>(&answer).unwrap());
    }
    let welcome = answers.remove(0);
    assert!(welcome.get("code").is_none(), "hello refused: {welcome}");
    answers
}

#[tokio::test]
async fn spot_core_refuses_bad_requests_over_raw_tcp() {
    let stack = Stack::start().await;
    let mv = |op: &str, user: Value, asset: Value, amount: Value| {
        json!({"op": op, "req_id": ReqId::generate().to_string(), "user_id": user, "asset": asset, "amount": amount}).to_string()
    };
    // Give user 1 something to take.
    let funded = raw_lines(
        &stack.spot,
        &[mv("deposit", json!(1), json!("USDT"), json!("100"))],
    )
    .await;
    assert_eq!(funded[0]["status"], "applied", "{}", funded[0]);
    let mut cases: Vec<(String, &str)> = Vec::new();
    for op in ["withdraw", "deposit", "refund"] {
        for (amount, code) in [
            ("-100", "INVALID_AMOUNT"),
            ("0", "INVALID_AMOUNT"),
            ("0.0", "INVALID_AMOUNT"),
            ("1e5", "INVALID_AMOUNT"),
            ("0x10", "INVALID_AMOUNT"),
            (" 1", "INVALID_AMOUNT"),
            ("1 ", "INVALID_AMOUNT"),
            ("+1", "INVALID_AMOUNT"),
            ("NaN", "INVALID_AMOUNT"),
            ("0.000000001", "PRECISION_OVERFLOW"),
            ("100000000000000000001", "OVERFLOW"),
            ("18446744073709551616000000", "OVERFLOW"),
        ] {
            cases.push((mv(op, json!(1), json!("USDT"), json!(amount)), code));
        }
        cases.push((mv(op, json!(1), json!("DOGE"), json!("1")), "INVALID_ASSET"));
        cases.push((
            mv(op, json!(0), json!("USDT"), json!("1")),
            "INVALID_USER_ID",
        ));
        cases.push((
            mv(op, json!(u64::MAX), json!("USDT"), json!("1")),
            "INVALID_USER_ID",
        ));
        let bad_req_id =
            json!({"op": op, "req_id": "", "user_id": 1, "asset": "USDT", "amount": "1"});
        cases.push((bad_req_id.to_string(), "INVALID_REQ_ID"));
        // Wrong JSON types and shapes are BAD_REQUEST, never a guess.
        cases.push((mv(op, json!(1), json!("USDT"), json!(100)), "BAD_REQUEST"));
        cases.push((mv(op, json!(-1), json!("USDT"), json!("1")), "BAD_REQUEST"));
        cases.push((mv(op, json!("1"), json!("USDT"), json!("1")), "BAD_REQUEST"));
        let extra = json!({"op": op, "req_id": "x1", "user_id": 1, "asset": "USDT", "amount": "1", "sneaky": true});
        cases.push((extra.to_string(), "BAD_REQUEST"));
    }
    cases.push(("{not json".to_owned(), "BAD_REQUEST"));
    cases.push((
        json!({"op": "mint", "user_id": 1}).to_string(),
        "BAD_REQUEST",
    ));
    let lines: Vec<String> = cases.iter().map(|(l, _)| l.clone()).collect();
    let answers = raw_lines(&stack.spot, &lines).await;
    for ((line, code), answer) in cases.iter().zip(&answers) {
        assert_eq!(answer["code"], *code, "{line} → {answer}");
        assert_ne!(answer["status"], "applied", "{line} → {answer}");
    }
    assert_eq!(
        stack.spot_balance(1, "USDT").await,
        dec("100"),
        "nothing changed"
    );
    // And the balance rules: not found, insufficient, frozen, disabled.
    let lines = [
        mv("withdraw", json!(5), json!("USDT"), json!("1")),
        mv("withdraw", json!(1), json!("USDT"), json!("100.5")),
    ];
    let answers = raw_lines(&stack.spot, &lines).await;
    assert_eq!(answers[0]["code"], "SOURCE_ACCOUNT_NOT_FOUND");
    assert_eq!(answers[1]["code"], "INSUFFICIENT_BALANCE");
}

// ---- rate limits at the API -------------------------------------------------------------------

fn transfer_body(amount: &str) -> Value {
    json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": amount})
}

async fn post_raw(api: &ApiStack, base: &str, user: u64, body: &Value) -> reqwest::Response {
    api.http
        .post(format!("{base}{TRANSFER}"))
        .bearer_auth(api.token(user, false))
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn rate_limit_per_second_is_429_with_retry_after() {
    let limits = edge::ratelimit::LimitsConfig {
        requests_per_second: Some(2),
        daily: DailyLimits::default(),
    };
    let api = ApiStack::start_with_limits(limits).await;
    api.stack.deposit(1, "USDT", "100").await;
    // Sent back to back: whatever second boundary falls among them, 20 requests span at most a
    // few seconds, far fewer than the 10 windows they would need to all pass.
    let mut limited = None;
    for _ in 0..20 {
        let resp = post_raw(&api, &api.base, 1, &transfer_body("1")).await;
        if resp.status().as_u16() == 429 {
            limited = Some(resp);
            break;
        }
        assert_eq!(resp.status().as_u16(), 200);
    }
    let resp = limited.expect("the limit refused a request");
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "RATE_LIMIT_EXCEEDED");
    // Another user has a window of its own; an invalid request is refused before it counts.
    api.stack.deposit(2, "USDT", "100").await;
    assert_eq!(
        post_raw(&api, &api.base, 2, &transfer_body("1"))
            .await
            .status()
            .as_u16(),
        200
    );
    api.stack.assert_conserved(1, "USDT").await;
}

#[tokio::test]
async fn daily_limits_are_429_with_retry_after_and_shared_by_instances() {
    let limits = edge::ratelimit::LimitsConfig {
        requests_per_second: None,
        daily: DailyLimits {
            count_max: Some(3),
            amount_max: [(usdt(), dec("60"))].into_iter().collect(),
        },
    };
    let api = ApiStack::start_with_limits(limits.clone()).await;
    let second = serve_another(&api, limits).await;
    api.stack.deposit(1, "USDT", "100").await;
    assert_eq!(
        post_raw(&api, &api.base, 1, &transfer_body("30"))
            .await
            .status()
            .as_u16(),
        200
    );
    let resp = post_raw(&api, &second, 1, &transfer_body("31")).await;
    assert_eq!(resp.status().as_u16(), 429);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");
    assert_eq!(
        resp.json::<Value>().await.unwrap()["code"],
        "DAILY_AMOUNT_EXCEEDED"
    );
    assert_eq!(
        post_raw(&api, &second, 1, &transfer_body("20"))
            .await
            .status()
            .as_u16(),
        200
    );
    // A request refused by an earlier check is not counted.
    assert_eq!(
        post_raw(&api, &api.base, 1, &transfer_body("-1"))
            .await
            .status()
            .as_u16(),
        422
    );
    let mut back = transfer_body("1");
    back["from"] = json!("SPOT");
    back["to"] = json!("FUNDING");
    assert_eq!(
        post_raw(&api, &second, 1, &back).await.status().as_u16(),
        200
    );
    let resp = post_raw(&api, &api.base, 1, &back).await;
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(
        resp.json::<Value>().await.unwrap()["code"],
        "DAILY_LIMIT_EXCEEDED"
    );
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("51"));
    api.stack.assert_conserved(1, "USDT").await;
}

/// A second API instance over the same database and spot-core, as another `ledger serve`.
async fn serve_another(api: &ApiStack, limits: edge::ratelimit::LimitsConfig) -> String {
    let wiring = ledger::Wiring::new(
        api.stack.db.pool.clone(),
        api.stack.spot.adapter(),
        AssetRegistry::default_assets(),
        JWT_SECRET,
    )
    .with_limits(limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(ledger::serve_with(listener, wiring));
    wait_for(|| async { reqwest::get(format!("{base}/healthz")).await.is_ok() }).await;
    base
}

async fn wait_for<F, Fut>(mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(Instant::now() < deadline, "condition not met within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- admin asset changes ----------------------------------------------------------------------

async fn put_asset(api: &ApiStack, base: &str, symbol: &str, body: Value) -> (u16, Value) {
    let resp = api
        .http
        .put(format!("{base}/api/v1/admin/assets/{symbol}"))
        .bearer_auth(api.token(1, true))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

fn asset_body(status: &str, enabled: bool, min: &str) -> Value {
    json!({"precision": 8, "min_transfer_amount": min, "max_transfer_amount": "1000",
           "status": status, "internal_transfer_enabled": enabled})
}

#[tokio::test]
async fn admin_asset_changes_apply_at_once_persist_and_reach_other_instances() {
    let api = ApiStack::start().await;
    let second = serve_another(&api, edge::ratelimit::LimitsConfig::unlimited()).await;
    api.stack.deposit(1, "USDT", "100").await;
    api.stack.deposit(1, "BTC", "10").await;
    let btc =
        |amount: &str| json!({"from": "FUNDING", "to": "SPOT", "asset": "BTC", "amount": amount});

    let (status, resp) = put_asset(
        &api,
        &api.base,
        "BTC",
        asset_body("SUSPENDED", true, "0.001"),
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["status"], "SUSPENDED");
    let code_at = |base: String, body: Value| {
        let api = &api;
        async move {
            let resp = post_raw(api, &base, 1, &body).await;
            let status = resp.status().as_u16();
            (
                status,
                resp.json::<Value>().await.unwrap()["code"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        }
    };
    assert_eq!(
        code_at(api.base.clone(), btc("1")).await,
        (422, "ASSET_SUSPENDED".into())
    );
    // The other instance picks the change up from PostgreSQL.
    // Until it does (at most ASSET_RELOAD_INTERVAL), it still accepts: poll with a small amount.
    wait_for(|| async { code_at(second.clone(), btc("0.001")).await.1 == "ASSET_SUSPENDED" }).await;

    let (status, _) = put_asset(&api, &second, "BTC", asset_body("ACTIVE", false, "0.001")).await;
    assert_eq!(status, 200);
    assert_eq!(
        code_at(second.clone(), btc("1")).await,
        (422, "TRANSFER_NOT_ALLOWED".into())
    );
    wait_for(|| async {
        code_at(api.base.clone(), btc("0.001")).await.1 == "TRANSFER_NOT_ALLOWED"
    })
    .await;

    let (status, _) = put_asset(&api, &api.base, "BTC", asset_body("ACTIVE", true, "0.001")).await;
    assert_eq!(status, 200);
    assert_eq!(
        code_at(api.base.clone(), btc("0.0001")).await,
        (422, "AMOUNT_TOO_SMALL".into())
    );
    assert_eq!(
        code_at(api.base.clone(), btc("1000.1")).await,
        (422, "AMOUNT_TOO_LARGE".into())
    );
    assert_eq!(
        code_at(api.base.clone(), btc("1")).await,
        (200, String::new())
    );

    // A restart (a fresh instance) starts from the stored settings over the file's defaults.
    let (status, _) = put_asset(
        &api,
        &api.base,
        "ETH",
        asset_body("SUSPENDED", true, "0.01"),
    )
    .await;
    assert_eq!(status, 200);
    let restarted = serve_another(&api, edge::ratelimit::LimitsConfig::unlimited()).await;
    let eth = json!({"from": "FUNDING", "to": "SPOT", "asset": "ETH", "amount": "1"});
    assert_eq!(
        code_at(restarted, eth).await,
        (422, "ASSET_SUSPENDED".into())
    );

    // Bad settings are refused and change nothing.
    for (symbol, body) in [
        (
            "BTC",
            json!({"precision": 19, "min_transfer_amount": "1", "max_transfer_amount": "2", "status": "ACTIVE", "internal_transfer_enabled": true}),
        ),
        (
            "BTC",
            json!({"precision": 8, "min_transfer_amount": "3", "max_transfer_amount": "2", "status": "ACTIVE", "internal_transfer_enabled": true}),
        ),
        (
            "BTC",
            json!({"precision": 2, "min_transfer_amount": "0.001", "max_transfer_amount": "2", "status": "ACTIVE", "internal_transfer_enabled": true}),
        ),
        (
            "BTC",
            json!({"precision": 8, "min_transfer_amount": 1, "max_transfer_amount": "2", "status": "ACTIVE", "internal_transfer_enabled": true}),
        ),
        (
            "BTC",
            json!({"precision": 8, "min_transfer_amount": "1", "max_transfer_amount": "2", "status": "ACTIVE"}),
        ),
        (
            "BTC",
            json!({"precision": 8, "min_transfer_amount": "1", "max_transfer_amount": "2", "status": "ACTIVE", "internal_transfer_enabled": true, "x": 1}),
        ),
        (
            "BTC",
            json!({"symbol": "ETH", "precision": 8, "min_transfer_amount": "1", "max_transfer_amount": "2", "status": "ACTIVE", "internal_transfer_enabled": true}),
        ),
    ] {
        let (status, resp) = put_asset(&api, &api.base, symbol, body.clone()).await;
        assert!(matches!(status, 400 | 422), "{body}: {status} {resp}");
    }
    let (status, resp) = put_asset(&api, &api.base, "btc", asset_body("ACTIVE", true, "1")).await;
    assert_eq!(
        (status, resp["code"].as_str()),
        (422, Some("INVALID_ASSET"))
    );
    assert_eq!(
        code_at(api.base.clone(), btc("1")).await.0,
        200,
        "BTC unchanged by the refusals"
    );
}

// ---- request hygiene --------------------------------------------------------------------------

#[tokio::test]
async fn request_hygiene_answers_in_the_contract_shape_and_leaks_nothing() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    let url = format!("{}{TRANSFER}", api.base);
    let send = |content_type: Option<&'static str>, body: Vec<u8>| {
        let mut req = api
            .http
            .post(url.clone())
            .bearer_auth(token.clone())
            .body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            (status, text)
        }
    };
    let good = transfer_body("1").to_string().into_bytes();
    let big = format!(
        r#"{{"from":"FUNDING","to":"SPOT","asset":"USDT","amount":"1","cid":"{}"}}"#,
        "a".repeat(20_000)
    );
    let cases: Vec<(Option<&'static str>, Vec<u8>, u16)> = vec![
        (None, good.clone(), 415),
        (Some("text/plain"), good.clone(), 415),
        (
            Some("application/x-www-form-urlencoded"),
            b"from=FUNDING".to_vec(),
            415,
        ),
        (Some("application/json"), big.into_bytes(), 413),
        (Some("application/json"), b"{not json".to_vec(), 400),
        (Some("application/json"), b"".to_vec(), 400),
        (Some("application/json"), b"[]".to_vec(), 400),
        (Some("application/json"), b"\"x\"".to_vec(), 400),
        (Some("application/json"), vec![0xff, 0xfe, b'{', b'}'], 400),
        (
            Some("application/json"),
            br#"{"from":"FUNDING","to":"SPOT","asset":"USDT","amount":"1","memo":"x"}"#.to_vec(),
            400,
        ),
        (
            Some("application/json"),
            br#"{"from":"FUNDING","to":"SPOT","asset":"USDT"}"#.to_vec(),
            400,
        ),
        (
            Some("application/json"),
            br#"{"from":"FUNDING","to":"SPOT","asset":"USDT","amount":"1","amount":"2"}"#.to_vec(),
            0,
        ),
    ];
    for (content_type, body, expected) in cases {
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(80)
            .collect::<String>();
        let (status, text) = send(content_type, body).await;
        if expected != 0 {
            assert_eq!(status, expected, "{content_type:?} {shown}: {text}");
        }
        let json: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        if status >= 400 {
            assert!(
                json["code"].is_string() && json["message"].is_string(),
                "{text}"
            );
            for leak in [
                "sqlx", "postgres", "panicked", "serde", "line 1", "column", "Error(",
            ] {
                assert!(!text.contains(leak), "{leak} leaked: {text}");
            }
        }
    }
    // A malformed or contradicting query parameter is refused, not ignored (schemathesis find).
    let admin = api.token(1, true);
    for query in ["?asset=%2B%F0%A3%A4%BA", "?asset=BTC"] {
        let (status, body) = api
            .call(
                Method::PUT,
                &format!("/api/v1/admin/accounts/1/FUNDING/status{query}"),
                Some(&admin),
                Some(json!({"status": "ACTIVE", "asset": "USDT"})),
            )
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("BAD_REQUEST")),
            "{query}"
        );
    }
    // Unknown route and wrong method answer in the same shape.
    let (status, body) = api
        .call(Method::GET, "/api/v1/nope", Some(&token), None)
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("NOT_FOUND")));
    let (status, body) = api.call(Method::DELETE, TRANSFER, Some(&token), None).await;
    assert_eq!((status, body["code"].as_str()), (405, Some("BAD_REQUEST")));
    // The invalid requests moved nothing; the one duplicate-key body was judged on its last value.
    let funding = api.stack.funding_balance(1, "USDT").await;
    assert!(funding == dec("100") || funding == dec("98"), "{funding}");
    api.stack.assert_conserved(1, "USDT").await;
}
