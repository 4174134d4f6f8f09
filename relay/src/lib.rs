//! The JetStream relay: publishes every event of the consumer feed to a NATS JetStream stream,
//! exactly once and in feed order, across crashes, outages and leader changes
//! (`docs/adr/0005-relay.md`).
//!
//! By job: `message` (an event as a message: subject, headers, body) → `stream` (the JetStream
//! side: connect, create or verify the stream, read where it ends) and `checkpoint` (the
//! PostgreSQL side: the leader lock, the checkpoint row, the status) → `publisher` (one
//! leadership: resync, then pipelined publishing) → [`run`] (standby and leadership, backoff,
//! the RELAY-LAG lag monitor). `tail` is the consumer side (`ledger tail`).
//!
//! The relay only reads the feed (`projections::feed`) and writes its own table; it takes its
//! configuration as arguments and reads no environment.

pub mod checkpoint;
pub mod checkpoints;
pub mod message;
mod monitor;
mod publisher;
mod reads;
pub mod stats;
pub mod stream;
pub mod tail;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

pub use checkpoint::{status, status_of, RelayStatus};
pub use reads::PgRelayReads;
pub use stats::RelayStats;

/// The stream's name when none is given.
pub const STREAM_DEFAULT: &str = "LEDGER_EVENTS";

/// Everything the relay is told; [`RelayConfig::new`] gives the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// The NATS server(s), e.g. `nats://127.0.0.1:4222`.
    pub nats_url: String,
    /// The JetStream stream (created with file storage when missing).
    pub stream: String,
    /// The stream of the tamper-evident log's checkpoints (`checkpoints`), never `stream`.
    pub checkpoint_stream: String,
    /// Publishes in flight at once (acks awaited in order).
    pub window: usize,
    /// The stream's duplicate window, used when the relay creates the stream.
    pub duplicate_window: Duration,
    /// RELAY-LAG: a relay lag above this raises `CRITICAL RELAY-LAG`.
    pub lag_alert: Duration,
    /// How often the feed is read again when everything was relayed.
    pub poll_interval: Duration,
    /// How often a standby tries to take the lead.
    pub standby_interval: Duration,
    /// Capped exponential backoff after an error: first wait, longest wait.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// This relay's name in `relay_checkpoint.leader` (host, pid, ...).
    pub instance: String,
    /// The cell whose feed this relay publishes (ADR 0017 §8): its subjects are the cell's
    /// (`ledger.cells.<cell>.events.>`) and each message names it. `None` without a cell map.
    pub cell: Option<u16>,
}

impl RelayConfig {
    /// The defaults for a stream on a NATS server.
    pub fn new(nats_url: impl Into<String>, stream: impl Into<String>) -> Self {
        Self {
            nats_url: nats_url.into(),
            stream: stream.into(),
            checkpoint_stream: checkpoints::CHECKPOINT_STREAM_DEFAULT.to_owned(),
            window: 512,
            duplicate_window: Duration::from_secs(120),
            lag_alert: Duration::from_secs(60),
            poll_interval: Duration::from_millis(20),
            standby_interval: Duration::from_millis(500),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            instance: format!("relay-{}", std::process::id()),
            cell: None,
        }
    }

    /// The relay of one cell's feed under a cell map: the stream `<stream>_<cell>` (one stream
    /// per cell, so JetStream's expected-last-sequence fence, which NATS checks per stream,
    /// orders each cell's feed), the cell's subjects, the rest as `self`. Its checkpoint and
    /// leader lock live in that cell's database, keyed by that stream's name.
    pub fn for_cell(&self, cell: u16) -> Self {
        Self {
            stream: cell_stream(&self.stream, cell),
            cell: Some(cell),
            ..self.clone()
        }
    }
}

/// The stream of one cell's feed: `<stream>_<cell>`, e.g. `LEDGER_EVENTS_2`.
pub fn cell_stream(stream: &str, cell: u16) -> String {
    format!("{stream}_{cell}")
}

/// Why a leadership ended or a step failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// NATS unreachable, a publish refused or unanswered: retried with backoff.
    #[error("nats: {0}")]
    Nats(String),
    /// The database (the feed, the checkpoint, the lock's connection).
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The stream is not what the relay needs (retried too: an operator may fix it).
    #[error("configuration: {0}")]
    Config(String),
    /// A broken promise of the feed (a gap in positions): never expected.
    #[error("feed: {0}")]
    Feed(String),
}

/// Runs a relay until `shutdown` completes: standby until it holds the stream's lock, then
/// leader; retries every failure forever with capped backoff. `stats` is updated as it goes.
pub async fn run(
    pool: PgPool,
    config: RelayConfig,
    stats: Arc<RelayStats>,
    shutdown: impl Future<Output = ()>,
) {
    // The lag monitor runs inside this future, not as a task of its own: cancelling `run`
    // (the start-up module stopping its tasks) stops both.
    let monitor = monitor::watch_lag(pool.clone(), config.clone(), stats.clone());
    tokio::select! {
        () = publisher::standby_and_lead(&pool, &config, &stats) => {}
        () = monitor => {}
        () = shutdown => tracing::info!(stream = %config.stream, "relay stops"),
    }
    stats.set_leader(false);
}

/// The wait before retry number `attempt` (1, 2, ...): `base × 2^(attempt-1)`, at most `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let factor = 1u32
        .checked_shl(attempt.saturating_sub(1))
        .unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(max, |d| d.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let (base, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let waits: Vec<u64> = (1..=9)
            .map(|a| backoff(a, base, max).as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(backoff(0, base, max), base);
        assert_eq!(backoff(u32::MAX, base, max), max);
    }

    #[test]
    fn defaults_name_the_stream_and_bound_the_window() {
        let c = RelayConfig::new("nats://127.0.0.1:4222", STREAM_DEFAULT);
        assert_eq!(c.stream, "LEDGER_EVENTS");
        assert!(c.window >= 256 && c.window <= 1024);
        assert_eq!(c.lag_alert, Duration::from_secs(60));
        assert_eq!(c.cell, None);
    }

    #[test]
    fn a_cells_relay_has_its_own_stream_and_subjects() {
        let c = RelayConfig::new("nats://127.0.0.1:4222", STREAM_DEFAULT).for_cell(2);
        assert_eq!(c.stream, "LEDGER_EVENTS_2");
        assert_eq!(c.cell, Some(2));
        assert_eq!(
            message::stream_subjects_for(c.cell),
            "ledger.cells.2.events.>"
        );
        assert_eq!(message::stream_subjects(), "ledger.events.>");
    }
}
