//! The operators' admin API (`query-api/src/admin_views.rs`) against a real PostgreSQL and a
//! real spot-core: the transfer listing's filters and cursor pages (no duplicate, no gap, while
//! new transfers arrive), a transfer's timeline (events, attempts with their error categories,
//! the funding journal, spot-core's lookup, a manual resolution's who and why), a user's view
//! against the balances route, the overview before and after a conservation check, the check's
//! history, the new `/metrics` lines, and the refusals (no token, a user's token, bad values).

use std::collections::HashSet;
use std::time::Duration;

use domain::AccountType::{Funding, Spot};
use domain::TransferState;
use recovery::{RecoveryConfig, RecoveryWorker};
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::ApiStack;

const ADMIN_ROUTES: [&str; 5] = [
    "/api/v1/admin/transfers",
    "/api/v1/admin/transfers/01ARZ3NDEKTSV4RRFFQ69G5FAV",
    "/api/v1/admin/users/1",
    "/api/v1/admin/overview",
    "/api/v1/admin/invariant/history",
];

async fn get(api: &ApiStack, path: &str) -> Value {
    let admin = api.token(1, true);
    let (status, body) = api.call(Method::GET, path, Some(&admin), None).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// A transfer through the public route, with a client key.
async fn create(api: &ApiStack, user: u64, asset: &str, amount: &str, cid: &str) -> String {
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&api.token(user, false)),
            Some(json!({"from": "FUNDING", "to": "SPOT", "asset": asset, "amount": amount, "cid": cid})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "COMMITTED", "{body}");
    body["req_id"].as_str().unwrap().to_owned()
}

fn req_ids(page: &Value) -> Vec<String> {
    page["transfers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["req_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn atk_admin_views_refuse_without_a_token_and_for_a_user_token() {
    let api = ApiStack::start().await;
    let user = api.token(5, false);
    for path in ADMIN_ROUTES {
        let (status, body) = api.call(Method::GET, path, None, None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("UNAUTHORIZED")),
            "{path}"
        );
        let (status, body) = api.call(Method::GET, path, Some(&user), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("FORBIDDEN")),
            "{path}"
        );
    }
    // Documented in the OpenAPI document the binary serves.
    let (status, doc) = api
        .call(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, 200);
    for path in [
        "/api/v1/admin/transfers",
        "/api/v1/admin/transfers/{req_id}",
        "/api/v1/admin/users/{user_id}",
        "/api/v1/admin/overview",
        "/api/v1/admin/invariant/history",
    ] {
        assert!(doc["paths"][path]["get"].is_object(), "{path} undocumented");
    }
}

#[tokio::test]
async fn mon_admin_views_refuse_bad_query_values_with_bad_request() {
    let api = ApiStack::start().await;
    let admin = api.token(1, true);
    for path in [
        "/api/v1/admin/transfers?state=DONE",
        "/api/v1/admin/transfers?limit=0",
        "/api/v1/admin/transfers?limit=501",
        "/api/v1/admin/transfers?limit=abc",
        "/api/v1/admin/transfers?user_id=0",
        "/api/v1/admin/transfers?user_id=x",
        "/api/v1/admin/transfers?asset=usd%20t",
        "/api/v1/admin/transfers?req_id=nope",
        "/api/v1/admin/transfers?cid=a%20b",
        "/api/v1/admin/transfers?after=garbage",
        "/api/v1/admin/transfers?older_than_ms=-5",
        "/api/v1/admin/transfers?colour=red",
        "/api/v1/admin/invariant/history?limit=0",
        "/api/v1/admin/invariant/history?limit=1001",
        "/api/v1/admin/users/0",
        "/api/v1/admin/users/abc",
    ] {
        let (status, body) = api.call(Method::GET, path, Some(&admin), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("BAD_REQUEST")),
            "{path}: {body}"
        );
    }
    for path in [
        "/api/v1/admin/transfers/01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "/api/v1/admin/transfers/not-a-req-id",
    ] {
        let (status, body) = api.call(Method::GET, path, Some(&admin), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("NOT_FOUND")),
            "{path}"
        );
    }
}

#[tokio::test]
async fn mon_admin_transfers_filter_and_page_without_duplicates_or_gaps() {
    let api = ApiStack::start().await;
    api.stack.deposit(11, "USDT", "1000").await;
    api.stack.deposit(12, "BTC", "10").await;
    let mut mine = Vec::new();
    for n in 1..=7 {
        mine.push(create(&api, 11, "USDT", &n.to_string(), &format!("c{n}")).await);
    }
    let btc = create(&api, 12, "BTC", "0.5", "c1").await;
    api.stack.wait_for_projections().await;

    // Pages of 3 over user 11, newest first; a transfer created between pages never shifts them.
    let mut seen = Vec::new();
    let mut path = "/api/v1/admin/transfers?user_id=11&limit=3".to_owned();
    let mut pages = 0;
    loop {
        let page = get(&api, &path).await;
        seen.extend(req_ids(&page));
        pages += 1;
        if pages == 1 {
            create(&api, 11, "USDT", "8", "c8").await;
            api.stack.wait_for_projections().await;
        }
        match page["next"].as_str() {
            Some(next) => path = format!("/api/v1/admin/transfers?user_id=11&limit=3&after={next}"),
            None => break,
        }
    }
    let mut newest_first = mine.clone();
    newest_first.reverse();
    assert_eq!(
        seen, newest_first,
        "every original transfer once, newest first"
    );
    assert_eq!(pages, 3);

    let all = get(&api, "/api/v1/admin/transfers?limit=500").await;
    assert_eq!(all["transfers"].as_array().unwrap().len(), 9);
    assert!(all["next"].is_null());
    let row = &all["transfers"][0];
    for field in [
        "req_id",
        "user_id",
        "cid",
        "from",
        "to",
        "asset",
        "amount",
        "state",
        "created_at",
        "updated_at",
        "age_ms",
    ] {
        assert!(row.get(field).is_some(), "{field} missing: {row}");
    }

    let by_asset = get(&api, "/api/v1/admin/transfers?asset=BTC").await;
    assert_eq!(req_ids(&by_asset), vec![btc.clone()]);
    assert_eq!(by_asset["transfers"][0]["amount"], "0.5");
    let by_req = get(&api, &format!("/api/v1/admin/transfers?req_id={}", mine[2])).await;
    assert_eq!(req_ids(&by_req), vec![mine[2].clone()]);
    let by_cid = get(&api, "/api/v1/admin/transfers?cid=c1&user_id=12").await;
    assert_eq!(req_ids(&by_cid), vec![btc]);
    let cid_any_user = get(&api, "/api/v1/admin/transfers?cid=c1").await;
    assert_eq!(req_ids(&cid_any_user).len(), 2, "a cid is per user");
    let committed = get(&api, "/api/v1/admin/transfers?state=COMMITTED&limit=500").await;
    assert_eq!(committed["transfers"].as_array().unwrap().len(), 9);
    let open = get(&api, "/api/v1/admin/transfers?state=OPEN").await;
    assert!(req_ids(&open).is_empty());
    let old = get(&api, "/api/v1/admin/transfers?older_than_ms=3600000").await;
    assert!(req_ids(&old).is_empty(), "nothing is an hour old");
}

#[tokio::test]
async fn mon_timeline_of_a_committed_transfer() {
    let api = ApiStack::start().await;
    api.stack.deposit(21, "USDT", "100").await;
    let req_id = create(&api, 21, "USDT", "12.5", "t1").await;
    let body = get(&api, &format!("/api/v1/admin/transfers/{req_id}")).await;
    assert_eq!(body["transfer"]["req_id"], req_id.as_str());
    assert_eq!(body["transfer"]["state"], "COMMITTED");
    assert_eq!(body["transfer"]["cid"], "t1");
    let events = body["events"].as_array().unwrap();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, api.stack.event_types(&req_id).await);
    assert_eq!(types.first(), Some(&"TransferCreated"));
    assert_eq!(types.last(), Some(&"TransferCommitted"));
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["version"], json!(n + 1));
        assert!(e["at"].as_str().unwrap().ends_with('Z'), "{e}");
    }
    assert_eq!(events[0]["data"]["amount"], "12.5", "{}", events[0]);
    let funding = body["funding"].as_array().unwrap();
    assert_eq!(funding.len(), 1, "{body}");
    assert_eq!(funding[0]["operation"], "WITHDRAW");
    assert_eq!(funding[0]["state"], "APPLIED");
    assert_eq!(funding[0]["amount"], "12.5");
    assert_eq!(body["spot"]["found"], true, "{body}");
    assert_eq!(body["spot"]["records"][0]["op"], "deposit");
    assert_eq!(body["spot"]["records"][0]["outcome"], "applied");
    assert!(body["attempts"].as_array().unwrap().is_empty());
    assert!(body["resolution"].is_null());
}

#[tokio::test]
async fn mon_timeline_of_a_manually_resolved_transfer_shows_who_and_why() {
    let mut api = ApiStack::start().await;
    api.stack.deposit(31, "USDT", "50").await;
    api.stack.spot.kill();
    let t = api.stack.transfer(31, Funding, Spot, "USDT", "20").await;
    assert_eq!(t.state, TransferState::TargetPending);
    let path = format!("/api/v1/admin/transfers/{}", t.req_id);

    // spot-core down: the timeline still answers, with the lookup's failure shown.
    let body = get(&api, &path).await;
    assert_eq!(body["transfer"]["state"], "TARGET_PENDING");
    assert!(body["spot"]["error"].is_string(), "{body}");
    assert!(body["spot"].get("found").is_none(), "{body}");

    // A recovery pass fails on it: the attempt shows its category, and the heartbeat is real.
    let overview = get(&api, "/api/v1/admin/overview").await;
    assert!(
        overview["lag"]["recovery_last_pass_age_ms"].is_null(),
        "{overview}"
    );
    assert_eq!(
        overview["oldest_open_req_id"],
        t.req_id.to_string().as_str()
    );
    let config = RecoveryConfig {
        stale_after: Duration::ZERO,
        ..RecoveryConfig::default()
    };
    RecoveryWorker::with_config(
        api.stack.coordinator.clone(),
        api.stack.db.pool.clone(),
        config,
    )
    .pass()
    .await
    .unwrap();
    let body = get(&api, &path).await;
    let attempts = body["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{body}");
    assert_eq!(attempts[0]["outcome"], "UNKNOWN", "{body}");
    assert!(
        matches!(
            attempts[0]["error_category"].as_str(),
            Some("NETWORK" | "TIMEOUT")
        ),
        "{body}"
    );
    let overview = get(&api, "/api/v1/admin/overview").await;
    let age = overview["lag"]["recovery_last_pass_age_ms"]
        .as_i64()
        .unwrap();
    assert!((0..60_000).contains(&age), "{overview}");
    api.stack.wait_for_projections().await;
    let stuck = get(&api, "/api/v1/admin/transfers?state=OPEN").await;
    assert_eq!(req_ids(&stuck), vec![t.req_id.to_string()]);

    api.stack.spot.restart();
    let (status, resolved) = api
        .call(
            Method::POST,
            &format!("{path}/resolve"),
            Some(&api.token(1, true)),
            Some(json!({"resolution": "NOT_APPLIED", "reason": "ticket 42: deposit never reached spot"})),
        )
        .await;
    assert_eq!(status, 200, "{resolved}");
    let body = get(&api, &path).await;
    assert_eq!(body["transfer"]["state"], "ROLLED_BACK", "{body}");
    let r = &body["resolution"];
    assert_eq!(r["by"], "admin:1", "{body}");
    assert_eq!(r["reason"], "ticket 42: deposit never reached spot");
    assert_eq!(r["outcome"], "NOT_APPLIED");
    assert_eq!(r["from_state"], "TARGET_PENDING");
    assert!(r["at"].is_string());
    let ops: Vec<(&str, &str)> = body["funding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["operation"].as_str().unwrap(),
                f["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(ops, vec![("WITHDRAW", "APPLIED"), ("REFUND", "APPLIED")]);
    // spot-core durably refused the pending deposit when the operator said it never happened.
    assert_eq!(body["spot"]["found"], true, "{body}");
    assert_eq!(body["spot"]["records"][0]["op"], "deposit");
    assert_eq!(body["spot"]["records"][0]["outcome"], "refused");
    assert_eq!(body["spot"]["records"][0]["code"], "CANCELLED");
    let types: Vec<&str> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(types.contains(&"TransferManuallyResolved"), "{types:?}");
}

#[tokio::test]
async fn bal_admin_user_view_matches_the_balances_route() {
    let api = ApiStack::start().await;
    api.stack.deposit(41, "USDT", "100").await;
    api.stack.deposit(41, "ETH", "3").await;
    for n in 0..22 {
        create(&api, 41, "USDT", "1.25", &format!("u{n}")).await;
    }
    create(&api, 41, "ETH", "0.1", "e1").await;
    api.stack.wait_for_projections().await;
    let body = get(&api, "/api/v1/admin/users/41").await;
    let (status, own) = api
        .call(
            Method::GET,
            "/api/v1/balances",
            Some(&api.token(41, false)),
            None,
        )
        .await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(body["user_id"], 41);
    assert_eq!(
        body["balances"], own["balances"],
        "admin view and the user's own view agree"
    );
    let usdt = body["balances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["asset"] == "USDT")
        .unwrap();
    assert_eq!(
        (usdt["funding"].as_str(), usdt["spot"].as_str()),
        (Some("72.5"), Some("27.5"))
    );
    let accounts = body["accounts"].as_array().unwrap();
    for (kind, asset) in [
        ("FUNDING", "USDT"),
        ("FUNDING", "ETH"),
        ("SPOT", "USDT"),
        ("SPOT", "ETH"),
    ] {
        assert!(
            accounts.iter().any(|a| a["account_type"] == kind
                && a["asset"] == asset
                && a["status"] == "ACTIVE"),
            "{kind} {asset}: {accounts:?}"
        );
    }
    let transfers = body["transfers"].as_array().unwrap();
    assert_eq!(transfers.len(), 20, "the latest 20");
    assert_eq!(transfers[0]["asset"], "ETH", "newest first");
    let unique: HashSet<&str> = transfers
        .iter()
        .map(|t| t["req_id"].as_str().unwrap())
        .collect();
    assert_eq!(unique.len(), 20);
}

#[tokio::test]
async fn mon_overview_counts_and_the_last_check_after_running_the_invariant() {
    let api = ApiStack::start().await;
    api.stack.deposit(51, "USDT", "100").await;
    for n in 0..4 {
        create(&api, 51, "USDT", "2", &format!("o{n}")).await;
    }
    api.stack.wait_for_projections().await;
    let before = get(&api, "/api/v1/admin/overview").await;
    assert!(before["last_check"].is_null(), "{before}");
    assert_eq!(before["halted"], false);
    assert!(before["halt_reason"].is_null());
    assert!(before["oldest_open_age_ms"].is_null(), "{before}");
    assert_eq!(before["by_state"]["COMMITTED"], 4, "{before}");
    assert_eq!(
        before["by_state"]["FAILED"], 0,
        "every state is listed: {before}"
    );
    assert_eq!(before["rate_last_minute"], 4);
    assert!(before["lag"]["projector_positions"].as_i64().unwrap() >= 0);
    assert!(
        before["lag"]["relay_positions"].is_null(),
        "no relay ran: {before}"
    );
    let history = get(&api, "/api/v1/admin/invariant/history").await;
    assert!(history["checks"].as_array().unwrap().is_empty());

    let admin = api.token(1, true);
    let (status, report) = api
        .call(Method::GET, "/api/v1/admin/invariant", Some(&admin), None)
        .await;
    assert_eq!((status, &report["ok"]), (200, &json!(true)), "{report}");
    let (status, report) = api
        .call(
            Method::GET,
            "/api/v1/admin/invariant?full=true",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!((status, &report["ok"]), (200, &json!(true)), "{report}");

    let after = get(&api, "/api/v1/admin/overview").await;
    let check = &after["last_check"];
    assert_eq!(check["ok"], true, "{after}");
    assert_eq!(check["mode"], "full");
    assert_eq!(check["violations"], 0);
    assert!(check["duration_ms"].as_i64().unwrap() >= 0);
    assert!(check["at"].as_str().unwrap().ends_with('Z'));
    let history = get(&api, "/api/v1/admin/invariant/history?limit=10").await;
    let checks = history["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2, "{history}");
    assert_eq!(
        (checks[0]["mode"].as_str(), checks[1]["mode"].as_str()),
        (Some("full"), Some("incremental"))
    );
    let usdt = checks[1]["assets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["asset"] == "USDT")
        .unwrap_or_else(|| panic!("USDT in {history}"));
    assert_eq!(usdt["ok"], true);
    assert!(
        usdt.get("detail").is_none(),
        "no detail when conserved: {usdt}"
    );
    let one = get(&api, "/api/v1/admin/invariant/history?limit=1").await;
    assert_eq!(one["checks"].as_array().unwrap().len(), 1);

    let metrics = api
        .http
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap();
    let text = metrics.text().await.unwrap();
    for name in [
        "ledger_recovery_last_pass_timestamp_seconds 0",
        "ledger_projector_lag_positions ",
        "ledger_projector_lag_seconds ",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} in\n{text}"
        );
    }
}
