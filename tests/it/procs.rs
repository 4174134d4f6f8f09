//! Real `ledger serve` processes for the recovery and crash tests: started against a test's
//! database and spot-core, with a fail point or recovery settings in their environment, and
//! killed or waited for like any process.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use domain::{ReqId, TransferData, TransferState};

use crate::helpers::{bin, token, SpotProcess, Stack, JWT_SECRET};

/// The line `ledger serve` prints on stdout once it listens.
const SERVE_READY_PREFIX: &str = "ledger serving on ";

/// A `ledger serve` child process.
pub struct LedgerProcess {
    pub base: String,
    /// `/metrics`' full URL: its own address (a free port on loopback, as `--metrics-listen`
    /// puts it), or on `base` when the test set `LEDGER_METRICS_LISTEN=api`.
    pub metrics: String,
    child: Option<Child>,
    stderr_path: PathBuf,
    _tmp: tempfile::TempDir,
}

impl LedgerProcess {
    /// Starts `ledger serve` on a free port against `db_url` and `spot` (its address and token),
    /// with `env` added to its environment; returns once it listens.
    pub fn start(db_url: &str, spot: &SpotProcess, env: &[(&str, &str)]) -> Self {
        Self::try_start(db_url, spot, env)
            .unwrap_or_else(|log| panic!("ledger serve exited before listening:\n{log}"))
    }

    /// [`Self::start`], or the log of a process that refused to start.
    pub fn try_start(
        db_url: &str,
        spot: &SpotProcess,
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let mut all: Vec<(&str, &str)> = vec![("DATABASE_URL", db_url)];
        all.extend(spot.env());
        all.extend_from_slice(env);
        Self::launch(&["--spot-url", &spot.addr], &all)
    }

    /// Starts `ledger serve` against the spot-core at `spot_addr` (one the test put in front of
    /// a real engine) with its token; returns once it listens.
    pub fn start_at(db_url: &str, spot_addr: &str, spot_token: &str, env: &[(&str, &str)]) -> Self {
        let mut all: Vec<(&str, &str)> =
            vec![("DATABASE_URL", db_url), (spot_core::TOKEN_ENV, spot_token)];
        all.extend_from_slice(env);
        Self::launch(&["--spot-url", spot_addr], &all)
            .unwrap_or_else(|log| panic!("ledger serve exited before listening:\n{log}"))
    }

    /// Starts `ledger serve` under the cell map `map` (`LEDGER_CELL_MAP`), every cell's database
    /// and spot-core named there; returns once it listens.
    pub fn start_cells(map: &std::path::Path, env: &[(&str, &str)]) -> Self {
        Self::try_start_cells(map, env)
            .unwrap_or_else(|log| panic!("ledger serve exited before listening:\n{log}"))
    }

    /// [`Self::start_cells`], or the log of a process that refused to start.
    pub fn try_start_cells(map: &std::path::Path, env: &[(&str, &str)]) -> Result<Self, String> {
        let map = map.to_str().expect("a UTF-8 path");
        let mut all: Vec<(&str, &str)> = vec![("LEDGER_CELL_MAP", map)];
        all.extend_from_slice(env);
        Self::launch(&[], &all)
    }

    /// `ledger serve` on a free port with `args` after the common ones and `env` added; the
    /// process once it listens, or its log if it ended first.
    fn launch(args: &[&str], env: &[(&str, &str)]) -> Result<Self, String> {
        let tmp = tempfile::tempdir().expect("tempdir");
        let stderr_path = tmp.path().join("stderr.log");
        let stderr = File::create(&stderr_path).expect("stderr file");
        let mut cmd = Command::new(bin("ledger"));
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .args(["--spot-timeout-ms", "1000"])
            .env_remove("DATABASE_URL")
            .env_remove("LEDGER_CELL_MAP")
            .env_remove(spot_core::TOKEN_ENV)
            .env(
                "LEDGER_JWT_SECRET",
                std::str::from_utf8(JWT_SECRET).expect("ascii secret"),
            )
            .env("RUST_LOG", "info")
            // Rate and daily limits are another issue's; these tests send bursts on purpose.
            .env("LEDGER_RATE_PER_SECOND", "off")
            .env("LEDGER_DAILY_COUNT_MAX", "off")
            // Its own free port: the default address would be shared by parallel tests.
            .env("LEDGER_METRICS_LISTEN", "127.0.0.1:0")
            .env_remove("LEDGER_FAILPOINT")
            .env_remove("LEDGER_ALLOW_FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn ledger serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut metrics = None;
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(rest) = line.strip_prefix(ledger::serve::METRICS_READY_PREFIX) {
                        metrics = Some(rest.trim().to_owned());
                    }
                    if let Some(rest) = line.strip_prefix(SERVE_READY_PREFIX) {
                        let url = rest.split_whitespace().next().expect("address");
                        break url.to_owned();
                    }
                }
                _ => {
                    let _ = child.wait();
                    return Err(std::fs::read_to_string(&stderr_path).unwrap_or_default());
                }
            }
        };
        // Keep draining stdout so a later line can never block or kill it with EPIPE.
        std::thread::spawn(move || for _ in lines {});
        let metrics = metrics.unwrap_or_else(|| format!("{base}/metrics"));
        Ok(Self {
            base,
            metrics,
            child: Some(child),
            stderr_path,
            _tmp: tmp,
        })
    }

    /// `POST /api/v1/internal_transfer` with `body`, as `user` (a user's token): the JSON answer.
    pub async fn transfer(&self, user: u64, body: serde_json::Value) -> serde_json::Value {
        reqwest::Client::new()
            .post(format!("{}/api/v1/internal_transfer", self.base))
            .bearer_auth(token(user, false))
            .json(&body)
            .send()
            .await
            .expect("transfer request")
            .json()
            .await
            .expect("a JSON answer")
    }

    /// Reads `/metrics` until `done` holds for its text, within `within`: that text.
    pub async fn metrics_until(&self, within: Duration, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let text = reqwest::get(&self.metrics)
                .await
                .expect("metrics request")
                .text()
                .await
                .expect("metrics text");
            if done(&text) {
                return text;
            }
            assert!(Instant::now() < deadline, "never as wanted:\n{text}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its log so far (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM: asks for an orderly shutdown.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// POSTs `body` to `path` as `token` on a process armed with the fail point `failpoint`, and
    /// checks that it died there: no answer, an abnormal exit within 15 s, the fail point named
    /// in its log.
    pub async fn post_until_the_fail_point(
        &mut self,
        path: &str,
        token: &str,
        body: serde_json::Value,
        failpoint: &str,
    ) {
        let answer = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await;
        assert!(
            answer.is_err(),
            "the process must die mid-request: {answer:?}"
        );
        let status = self.wait_exit(Duration::from_secs(15));
        assert!(!status.success(), "aborted, not exited cleanly: {status}");
        assert!(self.log().contains(&format!("fail point {failpoint}")));
    }

    /// Waits for the process to end by itself (a fail point aborts it).
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "ledger did not exit in time");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until its log contains `needle`.
    pub async fn wait_log(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "log never contained {needle:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for LedgerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Settings that make a restarted process's recovery worker pick up everything at once.
pub const RECOVER_NOW: [(&str, &str); 4] = [
    ("LEDGER_RECOVERY_STALE_MS", "0"),
    ("LEDGER_RECOVERY_INTERVAL_MS", "100"),
    ("LEDGER_RETRY_BACKOFF_MS_BASE", "50"),
    ("LEDGER_RETRY_BACKOFF_MS_MAX", "500"),
];

/// Waits until the transfer is in a terminal state (its events are the truth), and returns it.
pub async fn wait_terminal(s: &Stack, req_id: &ReqId, within: Duration) -> TransferData {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(t)) = s.coordinator.load(req_id).await {
            if t.state.is_terminal() {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "transfer {req_id} still {} after {within:?}",
                t.state
            );
        } else {
            assert!(Instant::now() < deadline, "transfer {req_id} not found");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The req_ids of every transfer in the test's database, oldest first.
pub async fn all_req_ids(s: &Stack) -> Vec<ReqId> {
    try_all_req_ids(s).await.expect("list transfers")
}

/// [`all_req_ids`], or the database's error (while it is still recovering from a stop).
pub async fn try_all_req_ids(s: &Stack) -> Result<Vec<ReqId>, sqlx::Error> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT aggregate_id FROM events WHERE event_type = 'TransferCreated'
         ORDER BY payload->'TransferCreated'->>'at', aggregate_id",
    )
    .fetch_all(&s.db.pool)
    .await?;
    Ok(ids
        .iter()
        .map(|i| ReqId::parse(i).expect("req_id"))
        .collect())
}

/// The state a transfer's events fold to.
pub async fn state_of(s: &Stack, req_id: &ReqId) -> TransferState {
    s.coordinator
        .load(req_id)
        .await
        .expect("load")
        .expect("exists")
        .state
}

/// How many times spot-core recorded each op for `req_id` (from its `lookup`).
pub async fn spot_ops(s: &Stack, req_id: &ReqId) -> Vec<(String, String)> {
    let req = spot_core::protocol::Request::Lookup {
        req_id: req_id.to_string(),
    };
    match s.spot_adapter.client().call(&req).await.expect("lookup") {
        spot_core::protocol::Response::Ok { ops: Some(ops), .. } => ops
            .into_iter()
            .map(|o| {
                (
                    format!("{:?}", o.op).to_uppercase(),
                    format!("{:?}", o.outcome).to_uppercase(),
                )
            })
            .collect(),
        other => panic!("lookup answered {other:?}"),
    }
}
