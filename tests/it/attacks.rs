//! External attack tests (contract §9.2, ATK-001 to ATK-013) over real HTTP, plus the identity
//! checks that have no seed id: algorithm confusion, `alg: none`, missing `exp`, `nbf`, leeway.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{dec, ApiStack, JWT_SECRET};

const TRANSFER: &str = "/api/v1/internal_transfer";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn signed(alg: Algorithm, claims: &Value, secret: &[u8]) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, &EncodingKey::from_secret(secret)).unwrap()
}

/// A token whose header names `alg` but whose body is otherwise well formed.
fn with_header(header: &Value, claims: &Value, signature: &str) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        signature
    )
}

async fn transfer(api: &ApiStack, token: Option<&str>, body: Value) -> (u16, Value) {
    api.call(Method::POST, TRANSFER, token, Some(body)).await
}

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("<none>")
}

fn good(amount: &str) -> Value {
    json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": amount})
}

/// Nothing moved for this user and asset: FUNDING still holds `funding`, SPOT nothing.
async fn untouched(api: &ApiStack, user: u64, funding: &str) {
    assert_eq!(api.stack.funding_balance(user, "USDT").await, dec(funding));
    assert_eq!(api.stack.spot_balance(user, "USDT").await, dec("0"));
    api.stack.assert_conserved(user, "USDT").await;
}

#[tokio::test]
async fn atk_001_cross_user_transfer_is_forbidden() {
    let api = ApiStack::start().await;
    api.stack.deposit(2, "USDT", "100").await;
    let attacker = api.token(1, false);
    let mut body = good("50");
    body["user_id"] = json!(2);
    let (status, resp) = transfer(&api, Some(&attacker), body).await;
    assert_eq!((status, code(&resp)), (403, "FORBIDDEN"), "{resp}");
    untouched(&api, 2, "100").await;
    // The victim's own transfers read as not found to the attacker, through every route.
    let victim = api.token(2, false);
    let (status, resp) = transfer(&api, Some(&victim), good("1")).await;
    assert_eq!(status, 200, "{resp}");
    let req_id = resp["req_id"].as_str().unwrap();
    let (status, resp) = api
        .call(
            Method::GET,
            &format!("{TRANSFER}/{req_id}"),
            Some(&attacker),
            None,
        )
        .await;
    assert_eq!((status, code(&resp)), (404, "NOT_FOUND"), "{resp}");
    let (status, resp) = api
        .call(Method::GET, "/api/v1/balances", Some(&attacker), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(resp["user_id"], 1);
    assert_eq!(
        resp["balances"],
        json!([]),
        "another user's balances never show"
    );
}

#[tokio::test]
async fn atk_002_tampered_user_id_in_body_is_forbidden() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    for tampered in [
        json!(2),
        json!("2"),
        json!("01"),
        json!(-1),
        json!(1.0),
        json!(0),
        json!(true),
        json!("1 "),
    ] {
        let mut body = good("5");
        body["user_id"] = tampered.clone();
        let (status, resp) = transfer(&api, Some(&token), body).await;
        assert_eq!(
            (status, code(&resp)),
            (403, "FORBIDDEN"),
            "{tampered}: {resp}"
        );
    }
    untouched(&api, 1, "100").await;
    // The caller's own id is accepted, as a number or a decimal string.
    for own in [json!(1), json!("1")] {
        let mut body = good("5");
        body["user_id"] = own;
        let (status, resp) = transfer(&api, Some(&token), body).await;
        assert_eq!(
            (status, resp["state"].as_str()),
            (200, Some("COMMITTED")),
            "{resp}"
        );
    }
}

async fn refused_amount(amount: Value, expected: &str) {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": amount});
    let (status, resp) = transfer(&api, Some(&token), body).await;
    assert_eq!((status, code(&resp)), (422, expected), "{amount}: {resp}");
    untouched(&api, 1, "100").await;
}

#[tokio::test]
async fn atk_003_negative_amount_is_invalid_amount() {
    refused_amount(json!("-100"), "INVALID_AMOUNT").await;
}

#[tokio::test]
async fn atk_004_zero_amount_is_invalid_amount() {
    refused_amount(json!("0"), "INVALID_AMOUNT").await;
}

#[tokio::test]
async fn atk_005_nine_decimals_is_precision_overflow() {
    refused_amount(json!("0.000000001"), "PRECISION_OVERFLOW").await;
}

#[tokio::test]
async fn atk_006_u64_max_plus_one_is_overflow() {
    refused_amount(json!("18446744073709551616"), "OVERFLOW").await;
}

#[tokio::test]
async fn malformed_amounts_are_invalid_amount_and_bounds_have_their_codes() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    let bad = [
        json!("0.000"),
        json!("-0"),
        json!("+1"),
        json!("1e5"),
        json!("1E5"),
        json!("0x10"),
        json!(" 1"),
        json!("1 "),
        json!("\t1"),
        json!("1\n"),
        json!(""),
        json!("NaN"),
        json!("Infinity"),
        json!("1,5"),
        json!(".5"),
        json!("5."),
        json!("01"),
        json!("1.2.3"),
        json!("١"),
        json!(100),
        json!(1.5),
        json!(-1),
        json!(true),
        json!(["1"]),
        json!({"v": "1"}),
    ];
    for amount in bad {
        let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": amount});
        let (status, resp) = transfer(&api, Some(&token), body).await;
        assert_eq!(
            (status, code(&resp)),
            (422, "INVALID_AMOUNT"),
            "{amount}: {resp}"
        );
    }
    let (status, resp) = transfer(&api, Some(&token), good("100000001")).await;
    assert_eq!((status, code(&resp)), (422, "AMOUNT_TOO_LARGE"), "{resp}");
    let (status, resp) = transfer(&api, Some(&token), good("99999999999999999999999999999")).await;
    assert_eq!((status, code(&resp)), (422, "OVERFLOW"), "{resp}");
    let (status, resp) = transfer(&api, Some(&token), good("0.0000000000000000001")).await;
    assert_eq!((status, code(&resp)), (422, "PRECISION_OVERFLOW"), "{resp}");
    untouched(&api, 1, "100").await;
}

#[tokio::test]
async fn atk_007_same_account_is_refused() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    for account in ["SPOT", "FUNDING"] {
        let body = json!({"from": account, "to": account, "asset": "USDT", "amount": "1"});
        let (status, resp) = transfer(&api, Some(&token), body).await;
        assert_eq!((status, code(&resp)), (422, "SAME_ACCOUNT"), "{resp}");
    }
    untouched(&api, 1, "100").await;
}

#[tokio::test]
async fn atk_008_invalid_account_type_and_unsupported_ones() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    for (from, to, expected) in [
        ("INVALID", "SPOT", "INVALID_ACCOUNT_TYPE"),
        ("FUNDING", "spot", "INVALID_ACCOUNT_TYPE"),
        ("", "SPOT", "INVALID_ACCOUNT_TYPE"),
        ("FUNDING", "FUTURE", "UNSUPPORTED_ACCOUNT_TYPE"),
        ("MARGIN", "SPOT", "UNSUPPORTED_ACCOUNT_TYPE"),
        ("FUTURE", "MARGIN", "UNSUPPORTED_ACCOUNT_TYPE"),
    ] {
        let body = json!({"from": from, "to": to, "asset": "USDT", "amount": "1"});
        let (status, resp) = transfer(&api, Some(&token), body).await;
        assert_eq!(
            (status, code(&resp)),
            (422, expected),
            "{from}->{to}: {resp}"
        );
    }
    untouched(&api, 1, "100").await;
}

#[tokio::test]
async fn atk_009_unknown_asset_is_invalid_asset() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    for asset in [
        json!("999999"),
        json!("DOGE"),
        json!("usdt"),
        json!(""),
        json!("USDT "),
        json!("A".repeat(40)),
    ] {
        let body = json!({"from": "FUNDING", "to": "SPOT", "asset": asset, "amount": "1"});
        let (status, resp) = transfer(&api, Some(&token), body).await;
        assert_eq!(
            (status, code(&resp)),
            (422, "INVALID_ASSET"),
            "{asset}: {resp}"
        );
    }
    untouched(&api, 1, "100").await;
}

#[tokio::test]
async fn atk_010_duplicate_cid_returns_the_first_result() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    let mut body = good("30");
    body["cid"] = json!("order-1");
    let (s1, first) = transfer(&api, Some(&token), body.clone()).await;
    let (s2, second) = transfer(&api, Some(&token), body.clone()).await;
    assert_eq!((s1, s2), (200, 200), "{first} {second}");
    assert_eq!(first["req_id"], second["req_id"]);
    assert_eq!(second["state"], "COMMITTED");
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("70"));
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("30"));
    // The same cid with another body is refused, and moves nothing.
    body["amount"] = json!("31");
    let (status, resp) = transfer(&api, Some(&token), body).await;
    assert_eq!(
        (status, code(&resp)),
        (409, "IDEMPOTENCY_KEY_REUSED"),
        "{resp}"
    );
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("70"));
    api.stack.assert_conserved(1, "USDT").await;
}

#[tokio::test]
async fn atk_011_missing_or_malformed_authorization_is_unauthorized() {
    let api = ApiStack::start().await;
    let token = api.token(1, false);
    let (status, resp) = transfer(&api, None, good("1")).await;
    assert_eq!((status, code(&resp)), (401, "UNAUTHORIZED"));
    for header in [
        "".to_owned(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        format!("Basic {token}"),
        format!("Token {token}"),
        "Bearer not.a.jwt".to_owned(),
    ] {
        let resp = api
            .http
            .post(format!("{}{TRANSFER}", api.base))
            .header("authorization", header.clone())
            .json(&good("1"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{header}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(code(&body), "UNAUTHORIZED");
    }
}

#[tokio::test]
async fn atk_012_expired_token_is_unauthorized_within_a_small_leeway() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let expired = signed(
        Algorithm::HS256,
        &json!({"sub": "1", "exp": now() - 60}),
        JWT_SECRET,
    );
    let (status, resp) = transfer(&api, Some(&expired), good("1")).await;
    assert_eq!((status, code(&resp)), (401, "UNAUTHORIZED"), "{resp}");
    // A token that expired a second ago is still inside the leeway for clock skew.
    let just = signed(
        Algorithm::HS256,
        &json!({"sub": "1", "exp": now() - 1}),
        JWT_SECRET,
    );
    let (status, resp) = transfer(&api, Some(&just), good("1")).await;
    assert_eq!(status, 200, "{resp}");
    // `exp` is required, in the right type.
    for claims in [
        json!({"sub": "1"}),
        json!({"sub": "1", "exp": "99999999999"}),
    ] {
        let token = signed(Algorithm::HS256, &claims, JWT_SECRET);
        let (status, resp) = transfer(&api, Some(&token), good("1")).await;
        assert_eq!(
            (status, code(&resp)),
            (401, "UNAUTHORIZED"),
            "{claims}: {resp}"
        );
    }
    // `nbf` in the future is honoured.
    let early = signed(
        Algorithm::HS256,
        &json!({"sub": "1", "exp": now() + 600, "nbf": now() + 300}),
        JWT_SECRET,
    );
    let (status, resp) = transfer(&api, Some(&early), good("1")).await;
    assert_eq!((status, code(&resp)), (401, "UNAUTHORIZED"), "{resp}");
}

#[tokio::test]
async fn atk_013_forged_token_and_algorithm_confusion_are_unauthorized() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let claims = json!({"sub": "1", "exp": now() + 600});
    let mut forged = vec![
        signed(
            Algorithm::HS256,
            &claims,
            b"another-secret-of-at-least-32-bytes!!",
        ),
        // Another HMAC algorithm with the right secret: only the configured one is accepted.
        signed(Algorithm::HS384, &claims, JWT_SECRET),
        signed(Algorithm::HS512, &claims, JWT_SECRET),
        // `alg: none`, with and without a trailing signature.
        with_header(&json!({"alg": "none", "typ": "JWT"}), &claims, ""),
        with_header(&json!({"alg": "None"}), &claims, ""),
    ];
    // A valid signature under a header that names another algorithm.
    let valid = signed(Algorithm::HS256, &claims, JWT_SECRET);
    let signature = valid.rsplit('.').next().unwrap();
    for alg in ["RS256", "ES256", "HS512", "none"] {
        forged.push(with_header(
            &json!({"alg": alg, "typ": "JWT"}),
            &claims,
            signature,
        ));
    }
    // A valid signature over other claims (the payload swapped for user 2's).
    let parts: Vec<&str> = valid.split('.').collect();
    let other = URL_SAFE_NO_PAD.encode(json!({"sub": "2", "exp": now() + 600}).to_string());
    forged.push(format!("{}.{}.{}", parts[0], other, parts[2]));
    // A `sub` that is not a user id.
    for sub in [json!("0"), json!("-1"), json!("abc"), json!(1)] {
        forged.push(signed(
            Algorithm::HS256,
            &json!({"sub": sub, "exp": now() + 600}),
            JWT_SECRET,
        ));
    }
    for token in forged {
        let (status, resp) = transfer(&api, Some(&token), good("1")).await;
        assert_eq!(
            (status, code(&resp)),
            (401, "UNAUTHORIZED"),
            "{token}: {resp}"
        );
        let (status, _) = api
            .call(Method::GET, "/api/v1/balances", Some(&token), None)
            .await;
        assert_eq!(status, 401, "{token}");
    }
    untouched(&api, 1, "100").await;
}

#[tokio::test]
async fn admin_routes_refuse_user_tokens_and_other_users_transfers_read_as_missing() {
    let api = ApiStack::start().await;
    let user = api.token(1, false);
    let (status, resp) = api
        .call(
            Method::POST,
            "/api/v1/admin/deposits",
            Some(&user),
            Some(json!({"user_id": 1, "asset": "USDT", "amount": "100", "external_id": "x-1"})),
        )
        .await;
    assert_eq!((status, code(&resp)), (403, "FORBIDDEN"), "{resp}");
    let (status, resp) = api
        .call(
            Method::PUT,
            "/api/v1/admin/assets/USDT",
            Some(&user),
            Some(json!({"precision": 8, "min_transfer_amount": "1", "max_transfer_amount": "2", "status": "SUSPENDED", "internal_transfer_enabled": false})),
        )
        .await;
    assert_eq!((status, code(&resp)), (403, "FORBIDDEN"), "{resp}");
    // Unknown, malformed and lower-case ids all read the same as another user's.
    for id in [
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "nope",
        "01arz3ndektsv4rrffq69g5fav",
        "%00",
    ] {
        let (status, resp) = api
            .call(Method::GET, &format!("{TRANSFER}/{id}"), Some(&user), None)
            .await;
        assert_eq!((status, code(&resp)), (404, "NOT_FOUND"), "{id}: {resp}");
    }
}
