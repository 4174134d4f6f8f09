//! Relay throughput: a fresh database holding about a million generated transfer events (the
//! replay benchmark's generator), projected into the feed, then the JetStream relay
//! (`relay::run`, the code `ledger relay` runs) publishing that backlog to a `nats-server -js`
//! the benchmark starts on a free port with its own store. Prints events per second relayed
//! (all of them acknowledged by JetStream and checkpointed), beside the raw feed read rate.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The database this benchmark owns; dropped and made again on every run unless `--reuse`.
const DATABASE: &str = "ledger_bench_relay";

/// The stream the benchmark publishes to.
const STREAM: &str = "BENCH_EVENTS";

/// The relay's throughput target, events per second.
const TARGET_EVENTS_PER_SECOND: f64 = 50_000.0;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// About how many events to relay.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// The PostgreSQL server (no database name); the benchmark uses its own database there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    server: String,
    /// Publishes in flight.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// The nats-server binary.
    #[arg(long, default_value = "/usr/sbin/nats-server")]
    nats_server: PathBuf,
    /// Keep the events and feed a previous run generated.
    #[arg(long)]
    reuse: bool,
}

/// A nats-server child and its store, both gone when dropped.
pub(crate) struct Nats {
    child: Child,
    store: PathBuf,
    pub(crate) url: String,
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.store).ok();
    }
}

pub(crate) async fn start_nats(binary: &PathBuf) -> anyhow::Result<Nats> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let store = std::env::temp_dir().join(format!("ledger-bench-relay-{}", std::process::id()));
    std::fs::create_dir_all(&store)?;
    let child = Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", binary.display()))?;
    let nats = Nats {
        child,
        store,
        url: format!("nats://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(client) = async_nats::connect(&nats.url).await {
            if client.request("$JS.API.INFO", "".into()).await.is_ok() {
                return Ok(nats);
            }
        }
        if Instant::now() > deadline {
            bail!("nats-server did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// long: one measurement read top to bottom (stream, load, lag, figures); a figures tool.
pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    let (url, pool, reuse) =
        crate::replay::own_database(&args.server, DATABASE, args.reuse).await?;
    if !reuse {
        println!("clean database: {url}");
        let took = crate::replay::generate_events(&pool, args.events, 20_000).await?;
        println!("generated the log in {:.1} s", took.as_secs_f64());
        sqlx::query("VACUUM (ANALYZE) events")
            .execute(&pool)
            .await?;
        let started = Instant::now();
        let caught_up = projections::Projector::new(pool.clone())
            .catch_up(Duration::from_secs(3600))
            .await?;
        if !caught_up {
            bail!("the projector did not catch up");
        }
        println!(
            "projected into the feed in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    sqlx::query("DELETE FROM relay_checkpoint")
        .execute(&pool)
        .await?;
    let head = projections::feed::head(&pool).await?;
    println!("feed head: {head} events");

    // The floor: reading the same feed page by page as the relay does, nothing published.
    let started = Instant::now();
    let mut after = 0;
    let mut bytes = 0usize;
    loop {
        let page = projections::feed::read_after(
            &pool,
            after,
            projections::feed::FEED_PAGE_SIZE_MAX,
            None,
        )
        .await?;
        let Some(last) = page.last() else { break };
        after = last.position;
        bytes += page
            .iter()
            .map(|e| relay::message::body(e).len())
            .sum::<usize>();
    }
    let read_time = started.elapsed();
    let read_rate = head as f64 / read_time.as_secs_f64();
    println!(
        "feed read + JSON bodies alone: {head} events ({:.0} MiB of bodies) in {:.2} s: {read_rate:.0} events/s",
        bytes as f64 / 1_048_576.0,
        read_time.as_secs_f64()
    );

    let nats = start_nats(&args.nats_server).await?;
    let mut config = relay::RelayConfig::new(&nats.url, STREAM);
    config.window = args.window;
    let stats = Arc::new(relay::RelayStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let task = tokio::spawn(relay::run(
        pool.clone(),
        config,
        stats.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let mut last_report = Instant::now();
    loop {
        let status = relay::status_of(&pool, STREAM).await?;
        if status.as_ref().is_some_and(|s| s.position >= head) {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            println!(
                "  {} relayed after {:.1} s",
                stats.acked_position(),
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        if let Some((_, e)) = stats.last_error() {
            println!("  relay error: {e}");
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("the relay did not finish in 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let relay_time = started.elapsed();
    let _ = stop_tx.send(());
    task.await.ok();
    let rate = head as f64 / relay_time.as_secs_f64();
    let stored = stream_messages(&nats.url).await?;
    println!(
        "relay (window {}): {head} events published, acknowledged and checkpointed in {:.2} s: {rate:.0} events/s (target >= {TARGET_EVENTS_PER_SECOND:.0})",
        args.window,
        relay_time.as_secs_f64()
    );
    println!("stream {STREAM} holds {stored} messages");
    if stored != head as u64 {
        bail!("the stream holds {stored} messages for {head} events");
    }
    println!("relay / feed read alone: {:.2}", rate / read_rate);
    Ok(vec![format!(
        "relay of {head} events from a backlog: {rate:.0} events/s (target >= {TARGET_EVENTS_PER_SECOND:.0}); feed read alone {read_rate:.0} events/s"
    )])
}

async fn stream_messages(url: &str) -> anyhow::Result<u64> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await?);
    let mut stream = js
        .get_stream(STREAM)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let info = stream.info().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(info.state.messages)
}

/// The relay's lag behind the feed, sampled while transfers run.
#[derive(Debug, Default)]
pub(crate) struct Lag {
    samples: usize,
    positions_max: i64,
    seconds_max: f64,
    seconds_sum: f64,
}

impl Lag {
    /// One line for the report.
    pub(crate) fn summary(&self) -> String {
        if self.samples == 0 {
            return "no samples (the relay never checkpointed)".to_owned();
        }
        format!(
            "{} samples every 200 ms: max {} positions, max {:.3} s, mean {:.3} s behind the feed (target < 1 s)",
            self.samples,
            self.positions_max,
            self.seconds_max,
            self.seconds_sum / self.samples as f64
        )
    }
}

/// Samples, every 200 ms until `stop` is set, the relay's own status (`relay::status_of`, what
/// `/metrics` reports): positions behind the feed, and seconds since the oldest event it has not
/// acknowledged entered the feed. The checkpoint is written every 100 ms or 2,000 acks, so this
/// overstates the lag by up to that much.
pub(crate) async fn sample_lag(
    pool: sqlx::PgPool,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Lag> {
    let mut lag = Lag::default();
    while !*stop.borrow() {
        if let Some(status) = relay::status_of(&pool, relay::STREAM_DEFAULT).await? {
            lag.samples += 1;
            lag.positions_max = lag.positions_max.max(status.lag_positions);
            lag.seconds_max = lag.seconds_max.max(status.lag_seconds);
            lag.seconds_sum += status.lag_seconds;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(lag)
}
