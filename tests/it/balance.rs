//! Balance and account-status tests (contract §9.3, BAL-001 to BAL-005) over real HTTP, and the
//! account checks without a seed id: a missing source or FUNDING target account.

use domain::{Amount, AssetSymbol, Movement, ReqId, UserId};
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{dec, ApiStack};

const TRANSFER: &str = "/api/v1/internal_transfer";

fn body(from: &str, to: &str, amount: &str) -> Value {
    json!({"from": from, "to": to, "asset": "USDT", "amount": amount})
}

async fn post(api: &ApiStack, user: u64, b: Value) -> (u16, Value) {
    let token = api.token(user, false);
    api.call(Method::POST, TRANSFER, Some(&token), Some(b))
        .await
}

async fn set_status(api: &ApiStack, user: u64, account: &str, status: &str) {
    let admin = api.token(99, true);
    let (code, resp) = api
        .call(
            Method::PUT,
            &format!("/api/v1/admin/accounts/{user}/{account}/status"),
            Some(&admin),
            Some(json!({"status": status, "asset": "USDT"})),
        )
        .await;
    assert_eq!(code, 200, "{resp}");
}

/// The transfer the refusal names ended FAILED, and nothing moved.
async fn failed_with(api: &ApiStack, user: u64, resp: &Value, expected: &str) {
    assert_eq!(resp["code"], expected, "{resp}");
    assert_eq!(resp["state"], "FAILED", "{resp}");
    let req_id = resp["req_id"].as_str().unwrap();
    let token = api.token(user, false);
    let (status, detail) = api
        .call(
            Method::GET,
            &format!("{TRANSFER}/{req_id}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(detail["state"], "FAILED");
    assert_eq!(detail["failure_code"], expected);
    api.stack.assert_conserved(user, "USDT").await;
}

#[tokio::test]
async fn bal_001_amount_above_available_is_insufficient_balance_and_changes_nothing() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let (status, resp) = post(&api, 1, body("FUNDING", "SPOT", "100.00000001")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 1, &resp, "INSUFFICIENT_BALANCE").await;
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("100"));
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("0"));
    // The same from SPOT: its balance is checked by spot-core.
    let (status, resp) = post(&api, 1, body("FUNDING", "SPOT", "40")).await;
    assert_eq!(status, 200, "{resp}");
    let (status, resp) = post(&api, 1, body("SPOT", "FUNDING", "40.5")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 1, &resp, "INSUFFICIENT_BALANCE").await;
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("40"));
}

#[tokio::test]
async fn bal_002_amount_equal_to_available_empties_the_account() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "12.34567891").await;
    let (status, resp) = post(&api, 1, body("FUNDING", "SPOT", "12.34567891")).await;
    assert_eq!(
        (status, resp["state"].as_str()),
        (200, Some("COMMITTED")),
        "{resp}"
    );
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("0"));
    let (status, resp) = post(&api, 1, body("SPOT", "FUNDING", "12.34567891")).await;
    assert_eq!(
        (status, resp["state"].as_str()),
        (200, Some("COMMITTED")),
        "{resp}"
    );
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("0"));
    assert_eq!(
        api.stack.funding_balance(1, "USDT").await,
        dec("12.34567891")
    );
    api.stack.assert_conserved(1, "USDT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bal_003_concurrent_transfers_above_the_balance_one_succeeds_nothing_overdrawn() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let a = spawn_post(&api, 1, body("FUNDING", "SPOT", "60"));
    let b = spawn_post(&api, 1, body("FUNDING", "SPOT", "60"));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 422], "{} {}", a.1, b.1);
    let refused = if a.0 == 422 { &a.1 } else { &b.1 };
    failed_with(&api, 1, refused, "INSUFFICIENT_BALANCE").await;
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("40"));
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("60"));

    // Many at once, both directions: the sums of what committed match the balances exactly.
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let (from, to) = if i % 2 == 0 {
                ("FUNDING", "SPOT")
            } else {
                ("SPOT", "FUNDING")
            };
            spawn_post(&api, 1, body(from, to, "25"))
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    for (status, resp) in &results {
        assert!(matches!(status, 200 | 422), "{resp}");
        if *status == 422 {
            assert_eq!(resp["code"], "INSUFFICIENT_BALANCE", "{resp}");
        }
    }
    let funding = api.stack.funding_balance(1, "USDT").await;
    let spot = api.stack.spot_balance(1, "USDT").await;
    assert!(funding >= dec("0") && spot >= dec("0"));
    assert_eq!(funding + spot, dec("100"));
    api.stack.assert_conserved(1, "USDT").await;
}

/// Sends a transfer request from its own task, so many run at once.
pub fn spawn_post(api: &ApiStack, user: u64, b: Value) -> tokio::task::JoinHandle<(u16, Value)> {
    let http = api.http.clone();
    let url = format!("{}{TRANSFER}", api.base);
    let token = api.token(user, false);
    tokio::spawn(async move {
        let resp = http
            .post(url)
            .bearer_auth(token)
            .json(&b)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    })
}

#[tokio::test]
async fn bal_004_frozen_source_is_account_frozen() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let (status, _) = post(&api, 1, body("FUNDING", "SPOT", "30")).await;
    assert_eq!(status, 200);
    set_status(&api, 1, "FUNDING", "FROZEN").await;
    let (status, resp) = post(&api, 1, body("FUNDING", "SPOT", "1")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 1, &resp, "ACCOUNT_FROZEN").await;
    set_status(&api, 1, "SPOT", "FROZEN").await;
    let (status, resp) = post(&api, 1, body("SPOT", "FUNDING", "1")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 1, &resp, "ACCOUNT_FROZEN").await;
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("70"));
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("30"));
}

#[tokio::test]
async fn bal_005_disabled_source_is_account_disabled() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let (status, _) = post(&api, 1, body("FUNDING", "SPOT", "30")).await;
    assert_eq!(status, 200);
    set_status(&api, 1, "FUNDING", "DISABLED").await;
    let (status, resp) = post(&api, 1, body("FUNDING", "SPOT", "1")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 1, &resp, "ACCOUNT_DISABLED").await;
    set_status(&api, 1, "SPOT", "DISABLED").await;
    let (status, resp) = post(&api, 1, body("SPOT", "FUNDING", "1")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 1, &resp, "ACCOUNT_DISABLED").await;
    assert_eq!(api.stack.funding_balance(1, "USDT").await, dec("70"));
    assert_eq!(api.stack.spot_balance(1, "USDT").await, dec("30"));
}

#[tokio::test]
async fn missing_source_account_is_source_account_not_found() {
    let api = ApiStack::start().await;
    let (status, resp) = post(&api, 5, body("FUNDING", "SPOT", "1")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 5, &resp, "SOURCE_ACCOUNT_NOT_FOUND").await;
    // A FUNDING account but no SPOT one yet.
    api.stack.deposit(8, "USDT", "1").await;
    let (status, resp) = post(&api, 8, body("SPOT", "FUNDING", "1")).await;
    assert_eq!(status, 422, "{resp}");
    failed_with(&api, 8, &resp, "SOURCE_ACCOUNT_NOT_FOUND").await;
}

#[tokio::test]
async fn missing_funding_target_is_target_account_not_found_and_spot_is_created_lazily() {
    let api = ApiStack::start().await;
    // Money in SPOT for a user who has no FUNDING account: credited straight in spot-core.
    let movement = Movement {
        req_id: ReqId::generate(),
        user_id: UserId::new(6).unwrap(),
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("10").unwrap(),
    };
    use domain::AccountPort;
    assert_eq!(
        api.stack.spot_adapter.deposit(&movement).await,
        domain::AdapterOutcome::Success
    );
    let (status, resp) = post(&api, 6, body("SPOT", "FUNDING", "4")).await;
    assert_eq!(
        (status, resp["code"].as_str()),
        (422, Some("TARGET_ACCOUNT_NOT_FOUND")),
        "{resp}"
    );
    assert_eq!(
        api.stack.spot_balance(6, "USDT").await,
        dec("10"),
        "nothing moved"
    );
    // A SPOT target needs no account beforehand.
    api.stack.deposit(7, "USDT", "5").await;
    let (status, resp) = post(&api, 7, body("FUNDING", "SPOT", "5")).await;
    assert_eq!(
        (status, resp["state"].as_str()),
        (200, Some("COMMITTED")),
        "{resp}"
    );
    assert_eq!(api.stack.spot_balance(7, "USDT").await, dec("5"));

    // The refusal is not remembered: once user 6 has a FUNDING account, the same transfer goes
    // through, and goes through again (the account is then known to exist).
    api.stack.deposit(6, "USDT", "1").await;
    for expected_spot in ["6", "2"] {
        let (status, resp) = post(&api, 6, body("SPOT", "FUNDING", "4")).await;
        assert_eq!(
            (status, resp["state"].as_str()),
            (200, Some("COMMITTED")),
            "{resp}"
        );
        assert_eq!(api.stack.spot_balance(6, "USDT").await, dec(expected_spot));
    }
    assert_eq!(api.stack.funding_balance(6, "USDT").await, dec("9"));
}
