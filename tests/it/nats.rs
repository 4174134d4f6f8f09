//! Real `nats-server` (JetStream, its own store directory, a free port) and real `ledger relay`
//! processes for the relay tests, and the check every relay test ends with: the stream's
//! messages, one by one, against the feed.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use projections::feed::{self, FeedEvent};
use sqlx::PgPool;

use crate::helpers::bin;

/// Where the distribution installs the server.
const NATS_SERVER: &str = "/usr/sbin/nats-server";

/// A `nats-server -js` child with its own store directory.
pub struct NatsServer {
    pub port: u16,
    pub store: PathBuf,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl NatsServer {
    pub async fn start() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = tmp.path().join("js");
        let port = free_port();
        let mut server = Self {
            port,
            store,
            child: None,
            _tmp: tmp,
        };
        server.spawn().await;
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let child = Command::new(NATS_SERVER)
                .args([
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-js",
                    "-sd",
                ])
                .arg(&self.store)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn nats-server");
            self.child = Some(child);
            // Ready when JetStream answers (a restarted server first recovers its store).
            loop {
                if let Ok(client) = async_nats::connect(self.url()).await {
                    let info = client.request("$JS.API.INFO", "".into()).await;
                    if info.is_ok_and(|m| m.payload.starts_with(b"{")) {
                        return;
                    }
                }
                let exited = self
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                    .is_some();
                if exited {
                    break;
                }
                assert!(Instant::now() < deadline, "nats-server did not start");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The port of the killed server may not be free yet: try again.
            assert!(Instant::now() < deadline, "nats-server did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    pub async fn jetstream(&self) -> jetstream::Context {
        let client = async_nats::connect(self.url()).await.expect("connect");
        jetstream::new(client)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A `ledger relay` child process.
pub struct RelayProcess {
    child: Option<Child>,
    pub pid: u32,
    stderr_path: PathBuf,
    _tmp: tempfile::TempDir,
}

impl RelayProcess {
    /// Starts `ledger relay` against `db_url` and `nats_url` with `args` added; returns once it
    /// printed its first line.
    pub fn start(db_url: &str, nats_url: &str, args: &[&str]) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let stderr_path = tmp.path().join("stderr.log");
        let stderr = File::create(&stderr_path).expect("stderr file");
        let mut child = Command::new(bin("ledger"))
            .args(["relay", "--nats", nats_url])
            .args(args)
            .env("DATABASE_URL", db_url)
            .env("RUST_LOG", "info")
            .env_remove("LEDGER_NATS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn ledger relay");
        let pid = child.id();
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        match lines.next() {
            Some(Ok(line)) if line.starts_with("ledger relay") => {}
            other => panic!(
                "ledger relay did not start: {other:?}\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            ),
        }
        std::thread::spawn(move || for _ in lines {});
        Self {
            child: Some(child),
            pid,
            stderr_path,
            _tmp: tmp,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Whether it logged that it leads.
    pub fn leads(&self) -> bool {
        self.log().contains("relay leads")
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `check` every 20 ms until it holds; fails with `what` after `within`.
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stream's last sequence and the feed position of its last message (0, 0 when empty or
/// missing).
pub async fn stream_end(js: &jetstream::Context, stream: &str) -> (u64, i64) {
    let Ok(mut st) = js.get_stream(stream).await else {
        return (0, 0);
    };
    let Ok(last) = st.info().await.map(|i| i.state.last_sequence) else {
        return (0, 0);
    };
    if last == 0 {
        return (0, 0);
    }
    let position = st
        .get_raw_message(last)
        .await
        .ok()
        .and_then(|m| relay::message::position_of(&m.headers))
        .unwrap_or(0);
    (last, position)
}

/// The whole feed, in order.
pub async fn whole_feed(pool: &PgPool) -> Vec<FeedEvent> {
    let mut all = Vec::new();
    loop {
        let after = all.last().map_or(0, |e: &FeedEvent| e.position);
        let page = feed::read_after(pool, after, feed::FEED_PAGE_SIZE_MAX, None)
            .await
            .expect("read the feed");
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// Waits for the projector to hand out every committed event and for the stream to reach the
/// feed's head, then checks the stream message by message against the feed: sequence i holds
/// feed position i, its event id, headers, subject and body; nothing more, nothing missing.
/// Returns the number of events.
pub async fn assert_stream_equals_feed(
    pool: &PgPool,
    js: &jetstream::Context,
    stream: &str,
) -> usize {
    assert_stream_equals_cell_feed(pool, js, stream, None).await
}

/// [`assert_stream_equals_feed`] for the stream of one cell's feed (ADR 0017 §8): the cell's
/// subjects, its `Ledger-Cell` header and the `cell` in each body.
pub async fn assert_stream_equals_cell_feed(
    pool: &PgPool,
    js: &jetstream::Context,
    stream: &str,
    cell: Option<u16>,
) -> usize {
    let caught_up = projections::Projector::new(pool.clone())
        .catch_up(Duration::from_secs(30))
        .await
        .expect("projector");
    assert!(caught_up, "projections did not catch up");
    let head = feed::head(pool).await.expect("feed head");
    assert!(head > 0, "the load made no events");
    wait_until(
        Duration::from_secs(30),
        "the stream to reach the feed's head",
        || async { stream_end(js, stream).await.1 >= head },
    )
    .await;
    let events = whole_feed(pool).await;
    assert_eq!(events.len() as i64, head, "the feed is dense");
    let mut st = js.get_stream(stream).await.expect("stream");
    let info = st.info().await.expect("stream info").clone();
    assert_eq!(
        info.state.messages,
        events.len() as u64,
        "the stream holds exactly one message per feed event"
    );
    assert_eq!(info.state.last_sequence, events.len() as u64);
    for (i, e) in events.iter().enumerate() {
        let seq = i as u64 + 1;
        let m = st
            .get_raw_message(seq)
            .await
            .unwrap_or_else(|err| panic!("stream message {seq}: {err}"));
        let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(
            relay::message::position_of(&m.headers),
            Some(e.position),
            "sequence {seq} holds feed position {}",
            e.position
        );
        assert_eq!(header("Nats-Msg-Id").as_deref(), Some(e.event_id.as_str()));
        assert_eq!(
            header("Ledger-Req-Id").as_deref(),
            Some(e.aggregate_id.as_str())
        );
        assert_eq!(
            header("Ledger-Event-Type").as_deref(),
            Some(e.event_type.as_str())
        );
        assert_eq!(
            header("Ledger-Event-Version").as_deref(),
            Some(e.event_version.as_str())
        );
        assert_eq!(header("Ledger-User-Id"), e.user_id.map(|u| u.to_string()));
        assert_eq!(m.subject.as_str(), relay::message::subject_for(e, cell));
        assert_eq!(header("Ledger-Cell"), cell.map(|c| c.to_string()));
        let body: serde_json::Value = serde_json::from_slice(&m.payload).expect("the body is JSON");
        let mut expected = feed::event_json(e);
        if let Some(cell) = cell {
            expected["cell"] = serde_json::json!(cell);
        }
        assert_eq!(body, expected, "sequence {seq}'s body");
    }
    events.len()
}
