//! The relay's command line: `ledger relay` (publish the feed to NATS JetStream), `ledger tail`
//! (consume the stream, print JSON lines), and the `--nats` options `ledger up` / `ledger serve`
//! take to run the relay in-process. Only here is the relay's configuration read from the
//! environment (clap's `env`); the `relay` crate takes it as arguments.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::settings::Settings;
use edge::config;

/// The relay's options, shared by `ledger relay` and by `up` / `serve`.
#[derive(Debug, Clone, Args)]
pub struct RelayOptions {
    /// NATS server for the event relay (e.g. nats://127.0.0.1:4222). `up` and `serve` relay
    /// the feed to JetStream in-process when it is set.
    #[arg(long = "nats", env = "LEDGER_NATS_URL")]
    pub nats: Option<String>,
    /// The JetStream stream events are published to (created with file storage if missing).
    #[arg(long = "stream", env = "LEDGER_RELAY_STREAM", default_value = relay::STREAM_DEFAULT)]
    pub stream: String,
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
        let url = self
            .nats
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())?;
        let mut c = relay::RelayConfig::new(url, self.stream.clone());
        c.window = usize::try_from(self.window).unwrap_or(512);
        c.duplicate_window = Duration::from_millis(self.duplicate_window_ms);
        c.lag_alert = Duration::from_millis(self.lag_alert_ms);
        Some(c)
    }
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub relay: RelayOptions,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    /// NATS server.
    #[arg(
        long = "nats",
        env = "LEDGER_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats: String,
    /// The stream to read.
    #[arg(long = "stream", env = "LEDGER_RELAY_STREAM", default_value = relay::STREAM_DEFAULT)]
    pub stream: String,
    /// A durable consumer: JetStream remembers what was acknowledged and resumes after it.
    /// Ephemeral when absent.
    #[arg(long)]
    pub durable: Option<String>,
    /// Start at this stream sequence (for a new consumer).
    #[arg(long)]
    pub from_sequence: Option<u64>,
    /// Print only events after this feed position.
    #[arg(long)]
    pub after_position: Option<i64>,
    /// Only these subjects, e.g. `ledger.events.*.42` (user 42) or
    /// `ledger.events.TransferCommitted.>`.
    #[arg(long)]
    pub subject: Option<String>,
    /// Exit after printing this many events.
    #[arg(long)]
    pub limit: Option<u64>,
}

/// `ledger relay`: one relay (standby until it holds the stream's lock) until ctrl-c / SIGTERM.
pub async fn relay(args: RelayArgs, settings: &Settings) -> anyhow::Result<()> {
    let Some(mut relay_config) = args.relay.config() else {
        bail!("`ledger relay` needs --nats URL or LEDGER_NATS_URL");
    };
    // Who leads, as the checkpoint row and the logs show it: process id and host.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned());
    relay_config.instance = format!("ledger-relay-{}@{host}", std::process::id());
    let url = settings.database_url();
    let pool = schema::prepare(&url, 4).await?;
    println!(
        "ledger relay: feed of {} to stream {} at {}",
        config::redact_url(&url),
        relay_config.stream,
        relay_config.nats_url
    );
    let stats = std::sync::Arc::new(relay::RelayStats::default());
    relay::run(pool, relay_config, stats, crate::startup::shutdown_signal()).await;
    Ok(())
}

/// `ledger tail`: prints the stream's events as JSON lines.
pub async fn tail(args: TailArgs) -> anyhow::Result<()> {
    let config = relay::tail::TailConfig {
        nats_url: args.nats,
        stream: args.stream,
        durable: args.durable,
        from_sequence: args.from_sequence,
        after_position: args.after_position,
        filter_subject: args.subject,
        limit: args.limit,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    relay::tail::tail(&config, &mut out)
        .await
        .context("ledger tail")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        relay: RelayOptions,
    }

    #[test]
    fn no_nats_url_means_no_relay() {
        let cmd = Cmd::try_parse_from(["x"]).unwrap();
        if std::env::var("LEDGER_NATS_URL").is_err() {
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
        assert_eq!(c.duplicate_window, Duration::from_secs(1));
        assert_eq!(c.lag_alert, Duration::from_secs(60));
    }
}
