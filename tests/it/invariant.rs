//! The exact conservation check (contract §4) at `GET /api/v1/admin/invariant`: per
//! asset sums reconciled by req_id, no false alarm for a transfer caught between an applied
//! withdraw and its recorded outcome, and MON-003: a real violation halts new transfers
//! (SERVICE_HALTED) until an admin clears it.

use std::sync::Arc;

use application::NewTransfer;
use domain::AccountType::{Funding, Spot};
use domain::{Amount, TransferState, UserId};
use reqwest::Method;
use serde_json::json;

use crate::helpers::{dec, ApiStack, Stack, WithdrawThenLoseAnswer};

#[tokio::test]
async fn inv_exact_check_has_no_false_alarm_for_a_transfer_caught_mid_step() {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    let crashy = adapters::pg::coordinator(
        s.db.pool.clone(),
        Arc::new(WithdrawThenLoseAnswer(s.funding.clone())),
        Arc::new(s.spot_adapter.clone()),
        s.assets.clone(),
    );
    let t = crashy
        .submit(NewTransfer {
            user_id: UserId::new(1).unwrap(),
            from: Funding,
            to: Spot,
            asset: domain::AssetSymbol::parse("USDT").unwrap(),
            amount: Amount::parse("40").unwrap(),
            cid: None,
        })
        .await
        .unwrap();
    assert_eq!(t.state, TransferState::SourcePending);
    assert_eq!(s.funding_balance(1, "USDT").await, dec("60"));

    let report = adapters::pg::check_full(&s.funding, &s.spot_adapter)
        .await
        .unwrap();
    assert!(report.ok, "{report:#?}");
    let usdt = report.assets.iter().find(|a| a.asset == "USDT").unwrap();
    // The state-based in-flight (contract §4) misses the 40; the reconciled one does not.
    assert_eq!(usdt.in_flight_by_state, dec("0"));
    assert_eq!(usdt.in_flight, dec("40"));
    assert_eq!(
        (usdt.funding, usdt.spot, usdt.deposits),
        (dec("60"), dec("0"), dec("100"))
    );
    assert_eq!(usdt.difference, dec("0"));

    // Driving it again (the answer is now known) finishes it; still conserved.
    let done = s.coordinator.drive(&t.req_id).await.unwrap();
    assert_eq!(done.state, TransferState::Committed);
    s.assert_invariant_exact().await;
}

#[tokio::test]
async fn inv_exact_check_reports_per_asset_over_http_after_transfers() {
    let api = ApiStack::start().await;
    let admin = api.token(1, true);
    api.stack.deposit(2, "USDT", "100").await;
    api.stack.deposit(2, "ETH", "3").await;
    api.stack.transfer(2, Funding, Spot, "USDT", "25.5").await;
    api.stack.transfer(2, Spot, Funding, "USDT", "5").await;
    api.stack.transfer(2, Funding, Spot, "ETH", "1").await;
    api.stack.transfer(2, Funding, Spot, "ETH", "100").await; // FAILED

    let (status, body) = api
        .call(
            Method::GET,
            "/api/v1/admin/invariant",
            Some(&api.token(2, false)),
            None,
        )
        .await;
    assert_eq!((status, body["code"].as_str()), (403, Some("FORBIDDEN")));
    let (status, body) = api
        .call(Method::GET, "/api/v1/admin/invariant", Some(&admin), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(body["halted"], false);
    let usdt = body["assets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["asset"] == "USDT")
        .unwrap();
    assert_eq!(usdt["deposits"], "100");
    assert_eq!(usdt["funding"], "79.5");
    assert_eq!(usdt["spot"], "20.5");
    assert_eq!(usdt["in_flight"], "0");
    assert_eq!(usdt["difference"], "0");
    let eth = body["assets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["asset"] == "ETH")
        .unwrap();
    assert_eq!(
        (eth["funding"].as_str(), eth["spot"].as_str()),
        (Some("2"), Some("1"))
    );
    assert!(body["disagreements"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn mon_003_a_violation_halts_new_transfers_until_an_admin_clears_it() {
    let api = ApiStack::start().await;
    let admin = api.token(1, true);
    let user = api.token(3, false);
    api.stack.deposit(3, "USDT", "100").await;
    let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "10"});
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 200);

    // Money appears in FUNDING with no journal row: a real violation.
    sqlx::query("UPDATE funding_accounts SET balance = balance + 1 WHERE user_id = 3")
        .execute(&api.stack.db.pool)
        .await
        .unwrap();
    let (status, report) = api
        .call(Method::GET, "/api/v1/admin/invariant", Some(&admin), None)
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["ok"], false);
    assert_eq!(report["halted"], true);
    let usdt = report["assets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["asset"] == "USDT")
        .unwrap();
    assert_eq!(usdt["difference"], "1");
    assert_eq!(usdt["ok"], false);

    // Every instance sees the flag (it lives in PostgreSQL): new transfers are refused.
    let (status, refused) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(body.clone()),
        )
        .await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (503, Some("SERVICE_HALTED"))
    );
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM invariant_checks WHERE NOT ok")
        .fetch_one(&api.stack.db.pool)
        .await
        .unwrap();
    assert_eq!(recorded, 1);

    // Only an admin clears it.
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/admin/invariant/clear",
            Some(&user),
            None,
        )
        .await;
    assert_eq!(status, 403);
    sqlx::query("UPDATE funding_accounts SET balance = balance - 1 WHERE user_id = 3")
        .execute(&api.stack.db.pool)
        .await
        .unwrap();
    let (status, cleared) = api
        .call(
            Method::POST,
            "/api/v1/admin/invariant/clear",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!((status, cleared["halted"].as_bool()), (200, Some(false)));
    let (status, ok) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(body),
        )
        .await;
    assert_eq!(
        (status, ok["state"].as_str()),
        (200, Some("COMMITTED")),
        "{ok}"
    );
    api.stack.assert_conserved(3, "USDT").await;
}

/// The hot tables are vacuumed by the ledger itself (this machine's PostgreSQL runs without
/// autovacuum, and `open_transfers` then keeps a dead row version of every transfer that passed
/// through it): one maintenance pass vacuums every one of them, and the check still agrees.
#[tokio::test]
async fn hot_tables_are_vacuumed_by_the_ledger_whatever_autovacuum_does() {
    let s = Stack::start().await;
    s.deposit(7, "USDT", "100").await;
    for _ in 0..20 {
        s.transfer(7, Funding, Spot, "USDT", "1").await;
    }
    let pool = &s.db.pool;
    let vacuumed = || async {
        let rows: Vec<(String, bool)> = sqlx::query_as(
            "SELECT relname::text, last_vacuum IS NOT NULL FROM pg_stat_user_tables
             WHERE relname = ANY($1) ORDER BY relname",
        )
        .bind(
            adapters::pg::maintenance::HOT_TABLES
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>(),
        )
        .fetch_all(pool)
        .await
        .unwrap();
        rows
    };
    assert!(
        vacuumed().await.iter().all(|(_, v)| !*v),
        "nothing vacuumed before the pass"
    );
    adapters::pg::maintenance::vacuum_hot_tables(pool)
        .await
        .unwrap();
    let after = vacuumed().await;
    assert_eq!(
        after.len(),
        adapters::pg::maintenance::HOT_TABLES.len(),
        "every hot table exists: {after:?}"
    );
    assert!(after.iter().all(|(_, v)| *v), "{after:?}");
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM open_transfers")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(open, 0, "no transfer left open");
    s.assert_invariant_exact().await;
}

/// Tables grown past autovacuum's analyze threshold are analyzed by the ledger itself (this
/// machine's PostgreSQL runs without autovacuum, and a connection then keeps the plan it made
/// while the event log was a page or two: a sequential scan of it per transfer answer). One pass
/// analyzes the event log once the transfers grew it, leaves the hot tables to their vacuum, and
/// the next pass finds nothing left to do.
#[tokio::test]
async fn grown_tables_are_analyzed_by_the_ledger_whatever_autovacuum_does() {
    let s = Stack::start().await;
    s.deposit(8, "USDT", "100").await;
    for _ in 0..20 {
        s.transfer(8, Funding, Spot, "USDT", "1").await;
    }
    let pool = &s.db.pool;
    let analyzed_events = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL
             FROM pg_stat_user_tables WHERE relname = 'events'",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    };
    // A backend's table counters reach the statistics when it flushes them: at most once a
    // second while busy, and up to 10 s after it went idle (PostgreSQL 15's idle interval).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut first = Vec::new();
    while !analyzed_events().await {
        assert!(
            std::time::Instant::now() < deadline,
            "the event log was never analyzed"
        );
        first = adapters::pg::maintenance::analyze_grown_tables(pool)
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(pool)
        .await
        .unwrap();
    if autovacuum == "off" {
        assert!(first.iter().any(|t| t == "events"), "{first:?}");
    }
    for hot in adapters::pg::maintenance::HOT_TABLES {
        assert!(!first.iter().any(|t| t == hot), "{hot} in {first:?}");
    }
    let again = adapters::pg::maintenance::analyze_grown_tables(pool)
        .await
        .unwrap();
    assert!(!again.iter().any(|t| t == "events"), "{again:?}");
    s.assert_invariant_exact().await;
}

/// Years of periodic checks cost a bounded table: each check's report removes the passing
/// reports older than the newest `RUNS_KEPT`, and keeps every failing one (each was a halt).
#[tokio::test]
async fn mon_invariant_reports_stay_bounded_and_keep_every_failing_one() {
    let api = ApiStack::start().await;
    let admin = api.token(1, true);
    let pool = &api.stack.db.pool;
    let kept = application::audit::history::RUNS_KEPT;
    // An old failing report, then more passing ones than are kept.
    sqlx::query("INSERT INTO invariant_checks (ok, report) VALUES (false, '{}')")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO invariant_checks (ok, report) SELECT true, '{}' FROM generate_series(1, $1)",
    )
    .bind(kept + 500)
    .execute(pool)
    .await
    .unwrap();
    let (status, body) = api
        .call(Method::GET, "/api/v1/admin/invariant", Some(&admin), None)
        .await;
    assert_eq!((status, body["ok"].as_bool()), (200, Some(true)), "{body}");
    let (passing, failing): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE ok), count(*) FILTER (WHERE NOT ok) FROM invariant_checks",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        passing, kept,
        "the newest passing reports, the new one among them"
    );
    assert_eq!(failing, 1, "a failing report is never removed");
    let newest_ok: bool =
        sqlx::query_scalar("SELECT ok FROM invariant_checks ORDER BY id DESC LIMIT 1")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(newest_ok);
}

#[tokio::test]
async fn invariant_history_links_each_check_to_its_full_report() {
    let api = ApiStack::start().await;
    let admin = api.token(1, true);
    api.stack.deposit(3, "USDT", "100").await;
    api.stack.transfer(3, Funding, Spot, "USDT", "30").await;
    let (status, checked) = api
        .call(Method::GET, "/api/v1/admin/invariant", Some(&admin), None)
        .await;
    assert_eq!(
        (status, checked["ok"].as_bool()),
        (200, Some(true)),
        "{checked}"
    );

    // The history names the check's full report (`invariant_checks`) ...
    let (status, history) = api
        .call(
            Method::GET,
            "/api/v1/admin/invariant/history?limit=5",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, 200, "{history}");
    let newest = &history["checks"][0];
    let id = newest["id"].as_i64().expect("each check has an id");
    let link = newest["report"].as_str().expect("a kept report is linked");
    assert_eq!(link, format!("/api/v1/admin/invariant/runs/{id}"));

    // ... which is the report the check returned, with its per-asset figures.
    let (status, report) = api.call(Method::GET, link, Some(&admin), None).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["checked_at"], checked["checked_at"]);
    assert_eq!(report["mode"], checked["mode"]);
    let usdt = report["assets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["asset"] == "USDT")
        .expect("USDT in the stored report");
    assert_eq!(
        (
            usdt["deposits"].as_str(),
            usdt["funding"].as_str(),
            usdt["spot"].as_str(),
            usdt["difference"].as_str()
        ),
        (Some("100"), Some("70"), Some("30"), Some("0"))
    );
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM invariant_runs r JOIN invariant_checks c ON c.id = r.report_id
         WHERE r.id = $1",
    )
    .bind(id)
    .fetch_one(&api.stack.db.pool)
    .await
    .unwrap();
    assert_eq!(stored, 1, "the run names its row in invariant_checks");

    // Admin only; an unknown run, or one whose report was pruned, is 404 and unlinked.
    let (status, body) = api
        .call(Method::GET, link, Some(&api.token(3, false)), None)
        .await;
    assert_eq!((status, body["code"].as_str()), (403, Some("FORBIDDEN")));
    let (status, _) = api
        .call(
            Method::GET,
            &format!("/api/v1/admin/invariant/runs/{}", id + 1000),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, 404);
    sqlx::query("DELETE FROM invariant_checks")
        .execute(&api.stack.db.pool)
        .await
        .unwrap();
    let (status, _) = api.call(Method::GET, link, Some(&admin), None).await;
    assert_eq!(status, 404);
    let (_, history) = api
        .call(
            Method::GET,
            "/api/v1/admin/invariant/history?limit=5",
            Some(&admin),
            None,
        )
        .await;
    assert!(history["checks"][0]["report"].is_null(), "{history}");
    assert_eq!(history["checks"][0]["id"].as_i64(), Some(id));
}
