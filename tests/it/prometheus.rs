//! The shipped MON-001 rule end to end: a real Prometheus server (`/usr/bin/prometheus`, Debian's
//! `prometheus` package, installed by `scripts/ensure-prometheus`) loads
//! `deploy/prometheus/rules.yml` unchanged and scrapes a real `ledger serve` on its metrics
//! address every second; a transfer is held in TARGET_PENDING by stopping spot-core for real, and
//! Prometheus' own `/api/v1/alerts` must show `LedgerTargetPendingTooLong` (code MON-001)
//! `firing`. The ledger's threshold is lowered to 2 s through its setting
//! (`LEDGER_ALERT_TARGET_PENDING_MS`), which the rule reads from the ledger's own gauge.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::Stack;
use crate::procs::{LedgerProcess, RECOVER_NOW};

/// Where Debian's package puts the server.
const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A Prometheus server of the test's own: its config, storage and log in a temp dir.
struct Prometheus {
    base: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one that evaluates `rules` every second and scrapes `target` (HOST:PORT) every
    /// second; returns once it answers.
    async fn start(rules: &Path, target: &str) -> Self {
        assert!(
            Path::new(PROMETHEUS).exists(),
            "{PROMETHEUS} is missing: run scripts/ensure-prometheus (installs Debian's \
             `prometheus` package) before this test"
        );
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: ledger\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.path().join("prometheus.log");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("start prometheus");
        let server = Self {
            base: format!("http://127.0.0.1:{port}"),
            child,
            log,
            _dir: dir,
        };
        server.wait_ready().await;
        server
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = reqwest::get(format!("{}/-/ready", self.base)).await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never became ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Prometheus' own view of its alerts.
    async fn alerts(&self) -> Value {
        reqwest::get(format!("{}/api/v1/alerts", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// The state of `name` in an `/api/v1/alerts` answer, if listed.
fn state_of<'a>(alerts: &'a Value, name: &str) -> Option<&'a str> {
    alerts["data"]["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["labels"]["alertname"] == name)
        .and_then(|a| a["state"].as_str())
}

#[tokio::test]
async fn mon_001_shipped_rule_fires_in_a_real_prometheus_scraping_a_real_ledger() {
    let mut s = Stack::start().await;
    s.deposit(3, "USDT", "10").await;
    let mut env = RECOVER_NOW.to_vec();
    env.push(("LEDGER_ALERT_TARGET_PENDING_MS", "2000"));
    let ledger = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let target = ledger
        .metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_owned();
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/rules.yml");
    let prometheus = Prometheus::start(&rules.canonicalize().unwrap(), &target).await;

    // Not firing while nothing is stuck (a few evaluations in).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = prometheus.alerts().await;
    assert_eq!(
        state_of(&before, "LedgerTargetPendingTooLong"),
        None,
        "{before}"
    );

    s.spot.kill();
    let answer = ledger
        .transfer(
            3,
            json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "7"}),
        )
        .await;
    assert_eq!(answer["state"], "TARGET_PENDING", "{answer}");

    let deadline = Instant::now() + Duration::from_secs(60);
    let firing = loop {
        let alerts = prometheus.alerts().await;
        if state_of(&alerts, "LedgerTargetPendingTooLong") == Some("firing") {
            break alerts;
        }
        assert!(
            Instant::now() < deadline,
            "MON-001 never fired in Prometheus: {alerts}\nprometheus log:\n{}\nledger log:\n{}",
            prometheus.log(),
            ledger.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let alert = firing["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["labels"]["alertname"] == "LedgerTargetPendingTooLong")
        .unwrap();
    assert_eq!(alert["labels"]["code"], "MON-001", "{alert}");
    // A live ledger with its worker and projector running pages for nothing else but what is
    // true: spot-core is down (its rule waits a minute), the rest is healthy.
    for healthy in [
        "LedgerRecoveryWorkerNotRunning",
        "LedgerProjectorStalled",
        "LedgerHalted",
        "LedgerAuditUnavailable",
    ] {
        assert_ne!(state_of(&firing, healthy), Some("firing"), "{firing}");
    }
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    assert_eq!(
        alert["annotations"]["runbook"], "docs/runbook.md#mon-001",
        "{alert}"
    );
    // spot-core is down for real: the same scrape says so.
    let spot_down = prometheus_query(&prometheus, "ledger_spot_core_up").await;
    assert_eq!(
        spot_down, "0",
        "ledger_spot_core_up as Prometheus scraped it"
    );

    // spot-core back: the worker commits the transfer and the alert resolves.
    s.spot.restart();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alerts = prometheus.alerts().await;
        if state_of(&alerts, "LedgerTargetPendingTooLong").is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "MON-001 still listed after spot-core came back: {alerts}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The newest value of an instant query `expr` (one series).
async fn prometheus_query(prometheus: &Prometheus, expr: &str) -> String {
    let answer: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/query", prometheus.base))
        .query(&[("query", expr)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["data"]["result"][0]["value"][1]
        .as_str()
        .unwrap_or_else(|| panic!("{expr}: {answer}"))
        .to_owned()
}
