//! MON-004 (contract §9.9: abnormal frequency per user → WARNING) against a real
//! `ledger serve`: real HTTP transfer requests over the configured frequency raise one WARNING
//! line per episode, count `ledger_alerts_request_frequency_total` on the metrics address (not
//! the API's), and are listed by the admin-only `GET /api/v1/admin/alerts`; repeated rate-limit
//! refusals raise it too. Also: every shipped rule's `runbook` annotation names a section that
//! `docs/runbook.md` has.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{token, Stack};
use crate::procs::LedgerProcess;

/// Sends `n` transfer requests of 1 USDT for `user`; their statuses.
async fn requests(ledger: &LedgerProcess, user: u64, n: usize) -> Vec<u16> {
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..n {
        let answer = http
            .post(format!("{}/api/v1/internal_transfer", ledger.base))
            .bearer_auth(token(user, false))
            .json(&json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"}))
            .send()
            .await
            .unwrap();
        statuses.push(answer.status().as_u16());
    }
    statuses
}

/// Reads `/metrics` until `line` is in it (the alert is stored after its log line).
async fn wait_metric(ledger: &LedgerProcess, line: &str) -> String {
    ledger
        .metrics_until(Duration::from_secs(15), |text| {
            text.lines().any(|l| l == line)
        })
        .await
}

async fn alerts(ledger: &LedgerProcess, bearer: &str) -> (u16, Value) {
    alerts_with(ledger, bearer, "limit=10").await
}

async fn alerts_with(ledger: &LedgerProcess, bearer: &str, query: &str) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .get(format!("{}/api/v1/admin/alerts?{query}", ledger.base))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn mon_004_request_frequency_over_threshold_is_one_warning_a_metric_and_an_admin_alert() {
    let s = Stack::start().await;
    s.deposit(7, "USDT", "100").await;
    s.deposit(8, "USDT", "100").await;
    let ledger = LedgerProcess::start(
        &s.db.url,
        &s.spot,
        &[("LEDGER_ALERT_REQUESTS_PER_MINUTE", "5")],
    );
    assert_ne!(
        ledger.metrics,
        format!("{}/metrics", ledger.base),
        "metrics on an address of their own"
    );
    let public = reqwest::get(format!("{}/metrics", ledger.base))
        .await
        .unwrap();
    assert_eq!(public.status().as_u16(), 404, "not on the public port");

    assert!(requests(&ledger, 8, 3).await.iter().all(|s| *s == 200));
    let statuses = requests(&ledger, 7, 12).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    let log = ledger
        .wait_log("WARNING MON-004", Duration::from_secs(10))
        .await;
    assert_eq!(
        log.matches("WARNING MON-004").count(),
        1,
        "once per episode:\n{log}"
    );
    let line = log.lines().find(|l| l.contains("WARNING MON-004")).unwrap();
    assert!(line.contains("user 7 "), "{line}");
    assert!(line.contains("threshold 5"), "{line}");

    let metrics = wait_metric(&ledger, "ledger_alerts_request_frequency_total 1").await;
    for line in ["ledger_spot_core_up 1", "ledger_halted 0"] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    let (status, body) = alerts(&ledger, &token(1, true)).await;
    assert_eq!(status, 200, "{body}");
    let listed = body["alerts"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{body}");
    assert_eq!(listed[0]["code"], "MON-004");
    assert_eq!(listed[0]["severity"], "WARNING");
    assert_eq!(listed[0]["user_id"], 7);
    assert!(listed[0]["at"].as_str().unwrap().ends_with('Z'), "{body}");
    assert!(listed[0]["detail"]
        .as_str()
        .unwrap()
        .contains("transfer requests"));
    let (status, body) = alerts(&ledger, &token(7, false)).await;
    assert_eq!(status, 403, "admin only: {body}");
    assert_eq!(body["code"], "FORBIDDEN");
    for query in ["limit=0", "limit=501", "limit=x", "page=2"] {
        let (status, body) = alerts_with(&ledger, &token(1, true), query).await;
        assert_eq!(status, 400, "{query}: {body}");
    }

    let doc: Value = reqwest::get(format!("{}/api/v1/openapi.json", ledger.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        doc["paths"]["/api/v1/admin/alerts"]["get"].is_object(),
        "documented"
    );
}

#[tokio::test]
async fn mon_004_repeated_rate_limit_refusals_raise_the_warning() {
    let s = Stack::start().await;
    s.deposit(9, "USDT", "100").await;
    let ledger = LedgerProcess::start(
        &s.db.url,
        &s.spot,
        &[
            ("LEDGER_RATE_PER_SECOND", "1"),
            ("LEDGER_ALERT_REQUESTS_PER_MINUTE", "off"),
            ("LEDGER_ALERT_REFUSALS_PER_MINUTE", "3"),
        ],
    );
    let statuses = requests(&ledger, 9, 8).await;
    assert!(
        statuses.iter().filter(|s| **s == 429).count() >= 4,
        "{statuses:?}"
    );
    let log = ledger
        .wait_log("WARNING MON-004", Duration::from_secs(10))
        .await;
    assert_eq!(log.matches("WARNING MON-004").count(), 1, "{log}");
    let line = log.lines().find(|l| l.contains("WARNING MON-004")).unwrap();
    assert!(line.contains("user 9 "), "{line}");
    assert!(line.contains("rate-limit refusals (threshold 3)"), "{line}");
    wait_metric(&ledger, "ledger_alerts_request_frequency_total 1").await;
}

/// Every rule of `deploy/prometheus/rules.yml` carries a summary and a runbook annotation whose
/// anchor `docs/runbook.md` defines.
#[test]
fn mon_rules_point_at_runbook_sections_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/rules.yml")).unwrap();
    let runbook = std::fs::read_to_string(root.join("docs/runbook.md")).unwrap();
    let alerts = rules.matches("- alert: ").count();
    let anchors: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook: docs/runbook.md#"))
        .collect();
    assert_eq!(alerts, 15, "{rules}");
    assert_eq!(anchors.len(), alerts, "one runbook per rule");
    assert_eq!(
        rules.matches("summary: ").count(),
        alerts,
        "one summary per rule"
    );
    for anchor in anchors {
        assert!(
            runbook.contains(&format!("<a id=\"{anchor}\"></a>")),
            "docs/runbook.md has no section #{anchor}"
        );
    }
    for code in [
        "MON-001",
        "MON-002",
        "MON-003",
        "MON-004",
        "RELAY-LAG",
        "LOG_STALLED",
        "NO_SYNC_STANDBY",
        "SPOT_REPLICAS_LOST",
        "SPOT_NO_SPARE",
        "FAILOVER_UNFINISHED",
    ] {
        assert!(rules.contains(&format!("code: {code}")), "{code}");
    }
}
