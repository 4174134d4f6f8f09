//! `ledger up` with no `DATABASE_URL` and nothing answering on its default PostgreSQL address
//! runs a private cluster under `<data-dir>/pg` from the installed PostgreSQL binaries, reuses
//! it on the next `up` (also after an `up` killed outright left it running), and stops it when
//! `up` ends (SIGINT here, as Ctrl-C sends). Without PostgreSQL binaries it says so in one
//! line, naming the command that installs them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{bin, token, JWT_SECRET};

/// An address nothing listens on: a port just released.
fn closed_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    addr
}

fn up_command(data: &Path, default_addr: &str) -> Command {
    let mut up = Command::new(bin("ledger"));
    up.args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .env_remove("DATABASE_URL")
        .env("LEDGER_PG_DEFAULT_ADDR", default_addr)
        .env(
            "LEDGER_JWT_SECRET",
            std::str::from_utf8(JWT_SECRET).expect("ascii secret"),
        )
        .env("LEDGER_METRICS_LISTEN", "api")
        .env("RUST_LOG", "warn")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    up
}

/// A running `ledger up`: its API address, the PostgreSQL line it printed, and its stdout so far.
struct Up {
    child: Child,
    base: String,
    pg_line: String,
    out: Arc<Mutex<Vec<String>>>,
}

impl Up {
    fn start(data: &Path, default_addr: &str) -> Up {
        let mut child = up_command(data, default_addr)
            .spawn()
            .expect("spawn ledger up");
        let stdout = child.stdout.take().expect("stdout");
        let out = Arc::new(Mutex::new(Vec::new()));
        let seen = out.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let ready = line.trim().starts_with("API:");
                seen.lock().unwrap().push(line);
                if ready {
                    let _ = ready_tx.send(());
                }
            }
        });
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
        ready_rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("ledger up never came up: {:?}", out.lock().unwrap()));
        let lines = out.lock().unwrap().clone();
        let find = |prefix: &str| {
            lines
                .iter()
                .find_map(|l| l.trim().strip_prefix(prefix).map(str::to_owned))
                .unwrap_or_else(|| panic!("no {prefix:?} line in {lines:?}"))
        };
        Up {
            base: find("API:").trim().to_owned(),
            pg_line: find("PostgreSQL:"),
            child,
            out,
        }
    }

    /// SIGINT, as Ctrl-C sends; waits for a clean exit.
    fn interrupt(mut self) -> Vec<String> {
        let sent = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "ledger up exited {status}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "ledger up did not stop after SIGINT"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(200));
        let out = self.out.lock().unwrap().clone();
        out
    }
}

/// Kills a server the test left behind if it failed midway.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(pid) = postmaster_pid(&self.0) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

fn postmaster_pid(data: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("pg/data/postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether any process runs with the cluster's data directory on its command line.
fn server_running(data: &Path) -> bool {
    let needle = data.join("pg/data").display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(&needle)
                })
                .unwrap_or(false)
        })
}

async fn call(
    base: &str,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> Value {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("request");
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.json().await.expect("json")
}

async fn balances(base: &str) -> Value {
    let body = call(
        base,
        reqwest::Method::GET,
        "/api/v1/balances",
        &token(1, false),
        None,
    )
    .await;
    body["balances"].clone()
}

#[tokio::test]
async fn ledger_up_runs_reuses_and_stops_a_private_postgresql() {
    let data = tempfile::tempdir().expect("tempdir");
    // As root the server runs as `postgres`, which must reach the data dir (tempdir makes 0700).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let _cleanup = Cleanup(data.path().to_path_buf());
    let default_addr = closed_addr();

    let up = Up::start(data.path(), &default_addr);
    assert!(up.pg_line.contains("private cluster"), "{}", up.pg_line);
    assert!(
        up.pg_line
            .contains(&data.path().join("pg").display().to_string()),
        "{}",
        up.pg_line
    );
    let deposit = json!({"user_id": 1, "asset": "USDT", "amount": "100", "external_id": "pg-1"});
    call(
        &up.base,
        reqwest::Method::POST,
        "/api/v1/admin/deposits",
        &token(1, true),
        Some(deposit),
    )
    .await;
    let transfer = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "25.5"});
    let answer = call(
        &up.base,
        reqwest::Method::POST,
        "/api/v1/internal_transfer",
        &token(1, false),
        Some(transfer),
    )
    .await;
    assert_eq!(answer["state"], "COMMITTED", "{answer}");
    let before = balances(&up.base).await;
    assert_eq!(before[0]["funding"], "74.5", "{before}");
    assert_eq!(before[0]["spot"], "25.5", "{before}");
    let out = up.interrupt();
    assert!(
        out.iter().any(|l| l.contains("private cluster stopped")),
        "{out:?}"
    );
    assert!(
        !server_running(data.path()),
        "a postgres server outlived ledger up"
    );

    // The next `up` reuses the cluster: same balances.
    let again = Up::start(data.path(), &default_addr);
    assert!(
        again.pg_line.contains("private cluster"),
        "{}",
        again.pg_line
    );
    assert_eq!(balances(&again.base).await, before);
    // Killed outright, `up` leaves its server running; the next `up` takes it over.
    let mut killed = again;
    killed.child.kill().expect("SIGKILL ledger up");
    killed.child.wait().expect("reap ledger up");
    assert!(
        server_running(data.path()),
        "the server stays when up is killed"
    );
    let third = Up::start(data.path(), &default_addr);
    assert_eq!(balances(&third.base).await, before);
    third.interrupt();
    assert!(
        !server_running(data.path()),
        "a postgres server outlived ledger up"
    );
}

#[tokio::test]
async fn ledger_up_without_postgresql_binaries_says_how_to_install_them_in_one_line() {
    let data = tempfile::tempdir().expect("tempdir");
    let empty = tempfile::tempdir().expect("tempdir");
    let out = up_command(data.path(), &closed_addr())
        .env("LEDGER_PG_BINDIR_SEARCH", empty.path())
        .output()
        .expect("run ledger up");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("PostgreSQL is not installed")
            && lines[0].contains("apt-get install -y postgresql"),
        "{stderr}"
    );
}
