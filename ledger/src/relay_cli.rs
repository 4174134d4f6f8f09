//! The relay's commands: `ledger relay` (publish the feed to NATS JetStream, and the
//! tamper-evident log's checkpoints to their own stream) and `ledger tail`
//! (consume the stream, print JSON lines). The relay's options, which `ledger up` and
//! `ledger serve` also take to run it in-process, are `settings::options::RelayOptions`; the
//! `relay` crate takes them as arguments.

use anyhow::{bail, Context};
use clap::Args;

use crate::settings::options::RelayOptions;
use crate::settings::DatabaseSettings;

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
pub async fn relay(args: RelayArgs, database: &DatabaseSettings) -> anyhow::Result<()> {
    let Some(mut relay_config) = args.relay.config() else {
        bail!("`ledger relay` needs --nats URL or LEDGER_NATS_URL");
    };
    // Who leads, as the checkpoint row and the logs show it: process id and host.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned());
    relay_config.instance = format!("ledger-relay-{}@{host}", std::process::id());
    let url = &database.url;
    let pool = schema::prepare(url, 4).await?;
    println!(
        "ledger relay: feed of {} to stream {} at {}",
        crate::config::redact_url(url),
        relay_config.stream,
        relay_config.nats_url
    );
    if relay_config.checkpoint_stream == relay_config.stream {
        bail!(
            "the checkpoint stream must not be the event stream: give another --checkpoint-stream"
        );
    }
    // The tamper-evident log's checkpoints, if it is kept, go to their own stream beside.
    let checkpoints = relay::checkpoints::publish(
        pool.clone(),
        relay::checkpoints::CheckpointTarget {
            nats_url: relay_config.nats_url.clone(),
            stream: relay_config.checkpoint_stream.clone(),
            subject: relay::checkpoints::subject(None),
        },
    );
    let stats = std::sync::Arc::new(relay::RelayStats::default());
    tokio::select! {
        () = relay::run(pool, relay_config, stats, crate::startup::shutdown_signal()) => {}
        () = checkpoints => {}
    }
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
