//! The README's walk-through over real HTTP: deposit, FUNDING→SPOT, SPOT→FUNDING, read the
//! transfer and the balances; plus the contract's answers for a missing token and another
//! user's transfer.

use reqwest::Method;
use serde_json::json;

use crate::helpers::ApiStack;

#[tokio::test]
async fn walk_through_deposit_transfer_both_ways_read_back() {
    let api = ApiStack::start().await;
    assert!(
        api.stack.db.url.contains("/it_"),
        "each test has its own database"
    );
    let admin = api.token(1, true);
    let user = api.token(1, false);

    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/admin/deposits",
            Some(&admin),
            Some(json!({"user_id": 1, "asset": "USDT", "amount": "100", "external_id": "wire-1"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["funding_balance"], "100");

    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "25.5"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "COMMITTED");
    let req_id = body["req_id"].as_str().unwrap().to_owned();

    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(json!({"from": "SPOT", "to": "FUNDING", "asset": "USDT", "amount": "5"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "COMMITTED");

    let (status, body) = api
        .call(
            Method::GET,
            &format!("/api/v1/internal_transfer/{req_id}"),
            Some(&user),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "COMMITTED");
    assert_eq!(body["amount"], "25.5");
    assert!(chrono::DateTime::parse_from_rfc3339(body["created_at"].as_str().unwrap()).is_ok());
    assert!(chrono::DateTime::parse_from_rfc3339(body["updated_at"].as_str().unwrap()).is_ok());

    let (status, body) = api
        .call(Method::GET, "/api/v1/balances", Some(&user), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let usdt = body["balances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["asset"] == "USDT")
        .unwrap()
        .clone();
    assert_eq!(usdt["funding"], "79.5");
    assert_eq!(usdt["spot"], "20.5");
    assert_eq!(usdt["in_flight"], "0");
    api.stack.assert_conserved(1, "USDT").await;

    // Another user cannot see it; no token is UNAUTHORIZED.
    let other = api.token(2, false);
    let (status, body) = api
        .call(
            Method::GET,
            &format!("/api/v1/internal_transfer/{req_id}"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("NOT_FOUND")));
    let (status, body) = api.call(Method::GET, "/api/v1/balances", None, None).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("UNAUTHORIZED")));
}

#[tokio::test]
async fn insufficient_balance_is_422_with_the_failed_transfer_id() {
    let api = ApiStack::start().await;
    let user = api.token(9, false);
    api.stack.deposit(9, "BTC", "1").await;
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(json!({"from": "FUNDING", "to": "SPOT", "asset": "BTC", "amount": "2"})),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "INSUFFICIENT_BALANCE");
    assert_eq!(body["state"], "FAILED");
    assert_eq!(
        api.stack.funding_balance(9, "BTC").await,
        crate::helpers::dec("1")
    );
    api.stack.assert_conserved(9, "BTC").await;
}

/// Contract §3: the same user, cid and body returns the original transfer, even when the
/// asset has been suspended since; a new cid is refused with ASSET_SUSPENDED.
#[tokio::test]
async fn a_cid_repeat_after_the_asset_is_suspended_returns_the_original() {
    let api = ApiStack::start().await;
    let user = api.token(12, false);
    api.stack.deposit(12, "ETH", "3").await;
    let body =
        json!({"from": "FUNDING", "to": "SPOT", "asset": "ETH", "amount": "1", "cid": "keep-1"});
    let (status, first) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 200, "{first}");

    let (status, resp) = api
        .call(
            Method::PUT,
            "/api/v1/admin/assets/ETH",
            Some(&api.token(1, true)),
            Some(json!({"precision": 8, "min_transfer_amount": "0.00000001",
                        "max_transfer_amount": "100000", "status": "SUSPENDED",
                        "internal_transfer_enabled": true})),
        )
        .await;
    assert_eq!(status, 200, "{resp}");

    let (status, again) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(body),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["req_id"], first["req_id"]);

    let (status, refused) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(json!({"from": "FUNDING", "to": "SPOT", "asset": "ETH", "amount": "1", "cid": "keep-2"})),
        )
        .await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (422, Some("ASSET_SUSPENDED"))
    );
    assert_eq!(
        api.stack.funding_balance(12, "ETH").await,
        crate::helpers::dec("2")
    );
}
