//! The relay's commands: `ledger relay` (publish the feed to NATS JetStream, and the
//! tamper-evident log's checkpoints to their own stream) and `ledger tail` (consume the stream,
//! print JSON lines); under a cell map, one stream per cell (`<stream>_<cell>`, ADR 0017 §8)
//! for both. The relay's options, which `ledger up` and
//! `ledger serve` also take to run it in-process, are `settings::options::RelayOptions`; the
//! `relay` crate takes them as arguments.

use anyhow::{bail, Context};
use clap::Args;

use cells::{CellId, CellMap, FeedCursor, Placement};

use crate::settings::options::{EventStream, NatsServer, RelayOptions};
use crate::settings::{CellFlags, DatabaseFlags, Settings};

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub relay: RelayOptions,
    #[command(flatten)]
    pub cell_map: CellFlags,
    #[command(flatten)]
    pub database: DatabaseFlags,
}

/// The NATS server `ledger tail` reads when none is given: a local one.
pub const NATS_URL_LOCAL: &str = "nats://127.0.0.1:4222";

/// `ledger tail`'s arguments. The NATS server is nats://127.0.0.1:4222 unless `--nats` or
/// LEDGER_NATS_URL says otherwise.
#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub nats: NatsServer,
    #[command(flatten)]
    pub stream: EventStream,
    /// A durable consumer: JetStream remembers what was acknowledged and resumes after it.
    /// Ephemeral when absent.
    #[arg(long)]
    pub durable: Option<String>,
    /// Start at this stream sequence (for a new consumer).
    #[arg(long)]
    pub from_sequence: Option<u64>,
    /// Print only events after this feed position (one cell; under a cell map, a map of one
    /// cell only: use --after-cursor).
    #[arg(long)]
    pub after_position: Option<i64>,
    /// Under a cell map: print only events after these positions, one per cell,
    /// `1:5120,2:4987,3:5011` (a cell left out: from its start).
    #[arg(long)]
    pub after_cursor: Option<String>,
    /// Only these subjects, e.g. `ledger.events.*.42` (user 42) or
    /// `ledger.events.TransferCommitted.>`.
    #[arg(long)]
    pub subject: Option<String>,
    /// Exit after printing this many events.
    #[arg(long)]
    pub limit: Option<u64>,
    #[command(flatten)]
    pub cell_map: CellFlags,
}

/// `ledger relay`: one relay (standby until it holds the stream's lock) until ctrl-c / SIGTERM;
/// under a cell map, one per cell (`relay_cells`).
pub async fn relay(args: RelayArgs, settings: &Settings) -> anyhow::Result<()> {
    let Some(mut relay_config) = args.relay.config() else {
        bail!("`ledger relay` needs --nats URL or LEDGER_NATS_URL");
    };
    // Who leads, as the checkpoint row and the logs show it: process id and host.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned());
    relay_config.instance = format!("ledger-relay-{}@{host}", std::process::id());
    if let Some(map) = &settings.cells {
        return relay_cells(relay_config, map).await;
    }
    let database = &settings.database;
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

/// `ledger relay` under a cell map (ADR 0017 §8): each cell's feed to its own stream
/// `<stream>_<cell>`, each relay with its checkpoint and leader lock in its cell's database
/// (whose identity is checked first, as `ledger serve` checks it).
async fn relay_cells(config: relay::RelayConfig, map: &CellMap) -> anyhow::Result<()> {
    let placement = Placement::of_map(map);
    let mut relays = Vec::new();
    for spec in map.cells() {
        let database = crate::config::redact_url(&spec.database_url);
        let pool = schema::prepare(&spec.database_url, 4)
            .await
            .with_context(|| format!("cell {}: database {database}", spec.id))?;
        schema::cell_identity::establish(&pool, &database, spec.id, &placement)
            .await
            .with_context(|| format!("cell {} refused", spec.id))?;
        relays.push((pool, config.for_cell(spec.id.get())));
    }
    let streams: Vec<String> = relays.iter().map(|(_, c)| c.stream.clone()).collect();
    println!(
        "ledger relay: {} cells' feeds to streams {} at {}",
        relays.len(),
        streams.join(", "),
        config.nats_url
    );
    let runs = relays.into_iter().map(|(pool, config)| {
        let stats = std::sync::Arc::new(relay::RelayStats::default());
        relay::run(pool, config, stats, std::future::pending())
    });
    tokio::select! {
        _ = futures_util::future::join_all(runs) => {}
        () = crate::startup::shutdown_signal() => tracing::info!("relays stop"),
    }
    Ok(())
}

/// `ledger tail`: prints the stream's events as JSON lines; under a cell map, every cell's
/// stream (`<stream>_<cell>`), each in its order, the cells interleaved as messages come.
pub async fn tail(args: TailArgs, map: Option<&CellMap>) -> anyhow::Result<()> {
    if let Some(map) = map {
        return tail_cells(args, map).await;
    }
    if args.after_cursor.is_some() {
        bail!("--after-cursor is for a cell map; without one use --after-position");
    }
    let config = relay::tail::TailConfig {
        nats_url: args.nats.url().unwrap_or(NATS_URL_LOCAL).to_owned(),
        stream: args.stream.name,
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

/// `ledger tail` under a cell map.
async fn tail_cells(args: TailArgs, map: &CellMap) -> anyhow::Result<()> {
    let ids: Vec<CellId> = map.cells().iter().map(|c| c.id).collect();
    let after = match (&args.after_cursor, args.after_position) {
        (Some(_), Some(_)) => bail!("give --after-cursor or --after-position, not both"),
        (Some(text), None) => FeedCursor::parse(text, &ids).context("--after-cursor")?,
        (None, Some(n)) => FeedCursor::parse(&n.to_string(), &ids)
            .context("--after-position (a map of several cells: use --after-cursor)")?,
        (None, None) => FeedCursor::start(ids.iter().copied()),
    };
    let configs = ids
        .iter()
        .map(|&cell| relay::tail::TailConfig {
            nats_url: args.nats.url().unwrap_or(NATS_URL_LOCAL).to_owned(),
            stream: relay::cell_stream(&args.stream.name, cell.get()),
            durable: args.durable.clone(),
            from_sequence: args.from_sequence,
            after_position: Some(after.get(cell)).filter(|p| *p > 0),
            filter_subject: args.subject.clone(),
            limit: None,
        })
        .collect();
    relay::tail::tail_all(configs, std::io::stdout(), args.limit)
        .await
        .context("ledger tail")?;
    Ok(())
}
