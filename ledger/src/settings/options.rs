//! The options each command takes for itself, typed as clap parses them (a value that does not
//! parse stops the command with clap's error naming the flag): the relay's (`ledger relay`, and
//! `up` / `serve` with `--nats`), the spot-core child's storage (`ledger up`), durations given in
//! milliseconds ([`Millis`]) and spot-core's address ([`spot_address`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// A duration given as whole milliseconds on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Millis(pub Duration);

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.as_millis())
    }
}

impl std::str::FromStr for Millis {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        text.trim()
            .parse::<u64>()
            .map(|ms| Self(Duration::from_millis(ms)))
            .map_err(|_| format!("must be a whole number of milliseconds, got {text:?}"))
    }
}

/// spot-core's address, `HOST:PORT`, checked as clap reads it.
pub fn spot_address(text: &str) -> Result<String, String> {
    crate::config::spot_addr(text).map_err(|e| format!("{e:#}"))
}

/// `LEDGER_NATS_URL`: the NATS server, for every command that reaches one.
pub const NATS_URL_ENV: &str = "LEDGER_NATS_URL";

/// The NATS server, declared once for every command that reaches one (`relay`, `tail`,
/// `verify --from-stream`, and `up` / `serve` relaying in-process).
#[derive(Debug, Clone, Default, Args)]
pub struct NatsServer {
    /// NATS server (e.g. nats://127.0.0.1:4222).
    #[arg(id = "nats", long = "nats", value_name = "URL", env = NATS_URL_ENV)]
    pub url: Option<String>,
}

impl NatsServer {
    /// The server's URL, if one is given (blank counts as unset).
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref().map(str::trim).filter(|u| !u.is_empty())
    }
}

/// The JetStream stream of the feed's events, declared once (`relay`, `tail`, `up`, `serve`).
#[derive(Debug, Clone, Args)]
pub struct EventStream {
    /// The JetStream stream events are published to (created with file storage if missing) and
    /// read from.
    #[arg(id = "stream", long = "stream", value_name = "STREAM", env = "LEDGER_RELAY_STREAM",
          default_value = relay::STREAM_DEFAULT)]
    pub name: String,
}

/// The JetStream stream of the tamper-evident log's signed checkpoints, declared once (`relay`,
/// `up`, `serve` publish to it; `verify --from-stream` reads it back).
#[derive(Debug, Clone, Args)]
pub struct CheckpointStream {
    /// The JetStream stream the tamper-evident log's signed checkpoints are published to (with a
    /// signing key; created with file storage, no deletes and no purges, if missing). Never the
    /// event stream.
    #[arg(id = "checkpoint_stream", long = "checkpoint-stream", value_name = "STREAM",
          env = "LEDGER_LOG_CHECKPOINT_STREAM",
          default_value = relay::checkpoints::CHECKPOINT_STREAM_DEFAULT)]
    pub name: String,
}

/// The relay's options, shared by `ledger relay` and by `up` / `serve` (which relay the feed to
/// JetStream in-process when a NATS server is given).
#[derive(Debug, Clone, Args)]
pub struct RelayOptions {
    #[command(flatten)]
    pub nats: NatsServer,
    #[command(flatten)]
    pub stream: EventStream,
    #[command(flatten)]
    pub checkpoint_stream: CheckpointStream,
    /// Publishes in flight at once (acks are awaited in order).
    #[arg(long = "relay-window", env = "LEDGER_RELAY_WINDOW", default_value_t = 512,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub window: u64,
    /// The stream's duplicate window in milliseconds, used when the relay creates the stream.
    #[arg(
        long = "duplicate-window-ms",
        env = "LEDGER_RELAY_DUPLICATE_WINDOW_MS",
        default_value_t = 120_000
    )]
    pub duplicate_window_ms: u64,
    /// RELAY-LAG: a relay lag (age of the oldest event not relayed) above this is CRITICAL.
    #[arg(
        long = "relay-lag-alert-ms",
        env = "LEDGER_RELAY_LAG_ALERT_MS",
        default_value_t = 60_000
    )]
    pub lag_alert_ms: u64,
}

impl RelayOptions {
    /// The relay's configuration, if a NATS server is given.
    pub fn config(&self) -> Option<relay::RelayConfig> {
        let url = self.nats.url()?;
        let mut c = relay::RelayConfig::new(url, self.stream.name.clone());
        c.checkpoint_stream = self.checkpoint_stream.name.clone();
        c.window = usize::try_from(self.window).unwrap_or(512);
        c.duplicate_window = Duration::from_millis(self.duplicate_window_ms);
        c.lag_alert = Duration::from_millis(self.lag_alert_ms);
        Some(c)
    }
}

/// The spot-core child's storage settings `ledger up` passes through (spot-core's own flags of
/// the same names without `spot-`); each is left to spot-core's default when unset.
#[derive(Debug, Clone, Default, Args)]
pub struct SpotStorage {
    /// A snapshot every this many WAL records (0: never).
    #[arg(long, env = "LEDGER_SPOT_SNAPSHOT_EVERY_RECORDS")]
    pub spot_snapshot_every_records: Option<u64>,
    /// Bytes of one WAL segment.
    #[arg(long, env = "LEDGER_SPOT_SEGMENT_BYTES")]
    pub spot_segment_bytes: Option<u64>,
    /// Where compacted WAL segments are moved instead of deleted.
    #[arg(long, env = "LEDGER_SPOT_ARCHIVE_DIR")]
    pub spot_archive_dir: Option<PathBuf>,
}

impl SpotStorage {
    /// spot-core's flags for these settings.
    pub(crate) fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        if let Some(n) = self.spot_snapshot_every_records {
            args.push("--snapshot-every-records".into());
            args.push(n.to_string().into());
        }
        if let Some(n) = self.spot_segment_bytes {
            args.push("--segment-bytes".into());
            args.push(n.to_string().into());
        }
        if let Some(dir) = &self.spot_archive_dir {
            args.push("--archive-dir".into());
            args.push(dir.clone().into_os_string());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::time::Duration;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        relay: RelayOptions,
    }

    #[test]
    fn no_nats_url_means_no_relay() {
        let cmd = Cmd::try_parse_from(["x"]).unwrap();
        if std::env::var(NATS_URL_ENV).is_err() {
            assert!(cmd.relay.config().is_none());
        }
        let cmd = Cmd::try_parse_from([
            "x",
            "--nats",
            "nats://127.0.0.1:4222",
            "--duplicate-window-ms",
            "1000",
        ])
        .unwrap();
        let c = cmd.relay.config().unwrap();
        assert_eq!(c.stream, "LEDGER_EVENTS");
        assert_eq!(c.checkpoint_stream, "LEDGER_LOG_CHECKPOINTS");
        assert_eq!(c.duplicate_window, Duration::from_secs(1));
        assert_eq!(c.lag_alert, Duration::from_secs(60));
    }
}
