//! Relay throughput: a fresh database holding about a million generated transfer events (the
//! replay benchmark's generator), projected into the feed, then the JetStream relay
//! (`relay::run`, the code `ledger relay` runs) publishing that backlog to a `nats-server -js`
//! the benchmark starts on a free port with its own store, and, alternating with it, a bare
//! JetStream publisher of the same messages (issue 49): the backlog's messages made beforehand by
//! the relay's own function (`relay::message::message_for`: the same subjects, headers with
//! `Nats-Msg-Id` and `Nats-Expected-Last-Sequence`, bodies), the same stream settings
//! (`relay::stream::ensure`, which creates it with `relay::stream::stream_config`), the same
//! context (`relay::stream::connect`) and the same window of acks awaited in order, but no
//! database, no checkpoint and no message made while it runs. Each run has a nats-server and a
//! store of its own. Prints each run's events per second and CPU time per message (this process,
//! its nats-server, PostgreSQL), the relay's rate as a share of the bare publisher's per pair and
//! overall, and the raw feed read rate.

use std::collections::VecDeque;
use std::future::IntoFuture;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use projections::feed::FeedEvent;
use relay::message::Message;

/// The database this benchmark owns; dropped and made again on every run unless `--reuse`.
const DATABASE: &str = "ledger_bench_relay";

/// The stream the benchmark publishes to (each run on a nats-server of its own).
const STREAM: &str = "BENCH_EVENTS";

/// The relay's throughput target, events per second.
const TARGET_EVENTS_PER_SECOND: f64 = 50_000.0;

/// The relay's target against the bare publisher of the same messages (issue 49).
const TARGET_SHARE_OF_BARE: f64 = 0.8;

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
    /// Runs of the relay and the bare publisher, alternating (relay, bare, relay, bare, ...).
    #[arg(long, default_value_t = 2)]
    pairs: usize,
    /// Only one side, `--pairs` times (to profile it): `relay` or `bare`.
    #[arg(long, value_parser = ["relay", "bare"])]
    only: Option<String>,
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
    static STARTED: AtomicU32 = AtomicU32::new(0);
    let store = std::env::temp_dir().join(format!(
        "ledger-bench-relay-{}-{}",
        std::process::id(),
        STARTED.fetch_add(1, Ordering::Relaxed)
    ));
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

/// One run's figures: its time, its rate, and the CPU time per message of this process (the
/// publisher's side), of its nats-server and of PostgreSQL (every PostgreSQL process of the
/// machine: another user's load shows there), in microseconds.
#[derive(Debug, Clone, Copy)]
struct Run {
    time: Duration,
    rate: f64,
    cpu: Cpu,
}

/// CPU microseconds per message: this process, nats-server, PostgreSQL.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    client: f64,
    nats: f64,
    postgres: f64,
}

/// CPU used so far by this process, by the nats-server `nats` and by PostgreSQL.
fn cpu_now(nats: &Nats) -> (Duration, Duration, Duration) {
    (
        crate::procstat::process_cpu(std::process::id()),
        crate::procstat::process_cpu(nats.child.id()),
        crate::procstat::postgres_cpu(),
    )
}

impl Run {
    /// `name rate (time; CPU per message)`.
    fn show(&self, name: &str) -> String {
        format!(
            "{name} {:.0} events/s ({:.2} s; {})",
            self.rate,
            self.time.as_secs_f64(),
            self.cpu
        )
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU µs a message: client {:.1}, nats-server {:.1}, postgres {:.1}",
            self.client, self.nats, self.postgres
        )
    }
}

impl Cpu {
    /// The mean of `runs`' figures.
    fn mean(runs: &[Run]) -> Self {
        let n = runs.len().max(1) as f64;
        let mean = |f: fn(&Cpu) -> f64| runs.iter().map(|r| f(&r.cpu)).sum::<f64>() / n;
        Self {
            client: mean(|c| c.client),
            nats: mean(|c| c.nats),
            postgres: mean(|c| c.postgres),
        }
    }

    fn per_message(
        before: (Duration, Duration, Duration),
        after: (Duration, Duration, Duration),
        messages: i64,
    ) -> Self {
        let us = |a: Duration, b: Duration| {
            a.saturating_sub(b).as_secs_f64() * 1e6 / messages.max(1) as f64
        };
        Self {
            client: us(after.0, before.0),
            nats: us(after.1, before.1),
            postgres: us(after.2, before.2),
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    let pool = backlog(&args).await?;
    let head = projections::feed::head(&pool).await?;
    println!("feed head: {head} events");

    // The floor: reading the same feed page by page as the relay does, nothing published.
    let (count, read_time, bytes, _) = read_feed(&pool, false).await?;
    if count != head {
        bail!("the feed gave {count} events for a head of {head}");
    }
    let read_rate = head as f64 / read_time.as_secs_f64();
    println!(
        "feed read + JSON bodies alone: {head} events ({:.0} MiB of bodies) in {:.2} s: {read_rate:.0} events/s",
        bytes as f64 / 1_048_576.0,
        read_time.as_secs_f64()
    );
    // The bare publisher's input, read once (untimed); its messages are made before each run.
    let (_, _, _, events) = read_feed(&pool, true).await?;
    let (headers_bytes, bodies_bytes) = message_sizes(&messages(&events));
    println!(
        "messages: {head}, {:.1} bytes of headers and {:.1} bytes of body each on average",
        headers_bytes as f64 / head as f64,
        bodies_bytes as f64 / head as f64
    );

    // Relay, bare, relay, bare, ...: each on a nats-server and store of its own.
    let (mut relays, mut bares) = (Vec::new(), Vec::new());
    for pair in 1..=args.pairs.max(1) {
        let relay = match args.only.as_deref() {
            Some("bare") => None,
            _ => Some(relay_once(&args, &pool, head).await?),
        };
        let bare = match args.only.as_deref() {
            Some("relay") => None,
            _ => Some(bare_once(&args, messages(&events)).await?),
        };
        let shown: Vec<String> = [("relay", relay), ("bare", bare)]
            .into_iter()
            .filter_map(|(name, run)| run.map(|r| r.show(name)))
            .collect();
        let ratio = match (relay, bare) {
            (Some(r), Some(b)) => format!("; relay / bare {:.2}", r.rate / b.rate),
            _ => String::new(),
        };
        println!("pair {pair}: {}{ratio}", shown.join("\n        "));
        relays.extend(relay);
        bares.extend(bare);
    }
    Ok(report(&args, head, read_rate, &relays, &bares))
}

/// The benchmark's database with the generated log projected into the feed (kept from a previous
/// run with `--reuse`), and no relay checkpoint.
async fn backlog(args: &Args) -> anyhow::Result<sqlx::PgPool> {
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
    Ok(pool)
}

/// Each side's rate over all its runs, the relay's share of the bare publisher's (overall, per
/// pair: lowest, median, highest), printed; the summary's lines returned.
fn report(args: &Args, head: i64, read_rate: f64, relays: &[Run], bares: &[Run]) -> Vec<String> {
    let overall = |runs: &[Run]| {
        let time: f64 = runs.iter().map(|r| r.time.as_secs_f64()).sum();
        (head as f64 * runs.len() as f64) / time
    };
    let mut summary = Vec::new();
    if !relays.is_empty() {
        let rate = overall(relays);
        println!(
            "relay (window {}) overall: {rate:.0} events/s (target >= {TARGET_EVENTS_PER_SECOND:.0}); relay / feed read alone: {:.2}; {}",
            args.window,
            rate / read_rate,
            Cpu::mean(relays)
        );
        summary.push(format!(
            "relay of {head} events from a backlog: {rate:.0} events/s (target >= {TARGET_EVENTS_PER_SECOND:.0}); feed read alone {read_rate:.0} events/s"
        ));
    }
    if !bares.is_empty() {
        println!(
            "bare JetStream publisher (window {}) overall: {:.0} events/s; {}",
            args.window,
            overall(bares),
            Cpu::mean(bares)
        );
    }
    if !relays.is_empty() && !bares.is_empty() {
        let mut ratios: Vec<f64> = relays
            .iter()
            .zip(bares)
            .map(|(r, b)| r.rate / b.rate)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let (lo, hi) = (ratios[0], ratios[ratios.len() - 1]);
        let median = match ratios.len() % 2 {
            1 => ratios[ratios.len() / 2],
            _ => (ratios[ratios.len() / 2 - 1] + ratios[ratios.len() / 2]) / 2.0,
        };
        let ratio = overall(relays) / overall(bares);
        let line = format!(
            "relay against a bare JetStream publisher of the same messages: {ratio:.2} overall, {} pairs {lo:.2} to {hi:.2}, median {median:.2} (target >= {TARGET_SHARE_OF_BARE})",
            ratios.len()
        );
        println!("{line}");
        summary.push(line);
    }
    summary
}

/// The whole feed read page by page as the relay reads it, each event's body made: how many
/// events, the time it took, the bodies' bytes, and the events themselves when `keep` (the timed
/// floor keeps none, as the relay keeps none).
async fn read_feed(
    pool: &sqlx::PgPool,
    keep: bool,
) -> anyhow::Result<(i64, Duration, usize, Vec<FeedEvent>)> {
    let started = Instant::now();
    let mut after = 0;
    let mut bytes = 0usize;
    let mut count = 0i64;
    let mut events = Vec::new();
    loop {
        let page =
            projections::feed::read_after(pool, after, projections::feed::FEED_PAGE_SIZE_MAX, None)
                .await?;
        let Some(last) = page.last() else { break };
        after = last.position;
        bytes += page
            .iter()
            .map(|e| relay::message::body(e).len())
            .sum::<usize>();
        count += page.len() as i64;
        if keep {
            events.extend(page);
        }
    }
    Ok((count, started.elapsed(), bytes, events))
}

/// The messages the relay publishes for `events` into an empty stream, made by the relay's own
/// function (`relay::message::message_for`): the first asks for no expected sequence (an empty
/// stream), each next one for the sequence of the one before it.
fn messages(events: &[FeedEvent]) -> Vec<Message> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| relay::message::message_for(e.clone(), i as u64, None))
        .collect()
}

/// Bytes of headers (as `NAME: value\r\n` lines on the wire) and of bodies.
fn message_sizes(messages: &[Message]) -> (usize, usize) {
    messages.iter().fold((0, 0), |(h, b), m| {
        let lines: usize = m
            .headers
            .iter()
            .map(|(name, values)| {
                values
                    .iter()
                    .map(|v| AsRef::<str>::as_ref(name).len() + 2 + v.as_str().len() + 2)
                    .sum::<usize>()
            })
            .sum();
        (h + lines, b + m.body.len())
    })
}

/// The relay publishing the whole feed from an empty checkpoint into a fresh nats-server: the
/// time from its start until JetStream acknowledged the feed's head and it was checkpointed.
async fn relay_once(args: &Args, pool: &sqlx::PgPool, head: i64) -> anyhow::Result<Run> {
    sqlx::query("DELETE FROM relay_checkpoint")
        .execute(pool)
        .await?;
    let nats = start_nats(&args.nats_server).await?;
    let mut config = relay::RelayConfig::new(&nats.url, STREAM);
    config.window = args.window;
    let stats = Arc::new(relay::RelayStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let cpu_before = cpu_now(&nats);
    let started = Instant::now();
    let task = tokio::spawn(relay::run(
        pool.clone(),
        config,
        stats.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    // The relay's own counter first (no database read while it runs), then the checkpoint.
    let mut last_report = Instant::now();
    let mut errors_seen = None;
    loop {
        if stats.acked_position() >= head
            && relay::status_of(pool, STREAM)
                .await?
                .is_some_and(|s| s.position >= head)
        {
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
        if let Some((at, e)) = stats.last_error() {
            if errors_seen != Some(at) {
                println!("  relay error: {e}");
                errors_seen = Some(at);
            }
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("the relay did not finish in 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let time = started.elapsed();
    // Before the relay stops: its lock's connection (a PostgreSQL process) still counts.
    let cpu = Cpu::per_message(cpu_before, cpu_now(&nats), head);
    let _ = stop_tx.send(());
    task.await.ok();
    check_stream(&nats.url, head).await?;
    Ok(Run {
        time,
        rate: head as f64 / time.as_secs_f64(),
        cpu,
    })
}

/// The bare publisher: `messages` into a fresh nats-server's stream made as the relay makes it,
/// through a context made as the relay makes it, at most `--window` publishes in flight, acks
/// awaited in order and each checked (sequence, not a duplicate). Run as a task on the runtime's
/// workers, as the relay is, and timed from the connection to the last ack, as the relay is from
/// its start to its checkpoint.
async fn bare_once(args: &Args, messages: Vec<Message>) -> anyhow::Result<Run> {
    let count = messages.len();
    let nats = start_nats(&args.nats_server).await?;
    let duplicate_window = relay::RelayConfig::new(&nats.url, STREAM).duplicate_window;
    let window = args.window.max(1);
    let url = nats.url.clone();
    let cpu_before = cpu_now(&nats);
    let started = Instant::now();
    tokio::spawn(async move {
        let js = relay::stream::connect(&url, window).await?;
        relay::stream::ensure(&js, STREAM, duplicate_window, None).await?;
        bare_publish(&js, window, messages).await
    })
    .await??;
    let time = started.elapsed();
    let cpu = Cpu::per_message(cpu_before, cpu_now(&nats), count as i64);
    check_stream(&nats.url, count as i64).await?;
    Ok(Run {
        time,
        rate: count as f64 / time.as_secs_f64(),
        cpu,
    })
}

/// Publishes `messages` in order, at most `window` in flight, and awaits every ack.
async fn bare_publish(
    js: &async_nats::jetstream::Context,
    window: usize,
    messages: Vec<Message>,
) -> anyhow::Result<()> {
    let mut inflight = VecDeque::with_capacity(window);
    let mut acked = 0u64;
    for Message {
        subject,
        headers,
        body,
    } in messages
    {
        if inflight.len() >= window {
            bare_ack(&mut inflight, &mut acked).await?;
        }
        let ack = js
            .publish_with_headers(subject, headers, body)
            .await
            .map_err(|e| anyhow::anyhow!("bare publish: {e}"))?;
        inflight.push_back(ack.into_future());
    }
    while !inflight.is_empty() {
        bare_ack(&mut inflight, &mut acked).await?;
    }
    Ok(())
}

type AckFuture = <async_nats::jetstream::context::PublishAckFuture as IntoFuture>::IntoFuture;

/// Awaits the oldest ack in flight; it must store the next sequence, and not as a duplicate.
async fn bare_ack(inflight: &mut VecDeque<AckFuture>, acked: &mut u64) -> anyhow::Result<()> {
    let Some(ack) = inflight.pop_front() else {
        return Ok(());
    };
    let ack = ack
        .await
        .map_err(|e| anyhow::anyhow!("bare ack of sequence {}: {e}", *acked + 1))?;
    *acked += 1;
    if ack.duplicate || ack.sequence != *acked {
        bail!(
            "bare publisher: sequence {} (duplicate {}) where {} was due",
            ack.sequence,
            ack.duplicate,
            *acked
        );
    }
    Ok(())
}

/// The stream on `url` holds exactly `head` messages.
async fn check_stream(url: &str, head: i64) -> anyhow::Result<()> {
    let stored = stream_messages(url).await?;
    if stored != head as u64 {
        bail!("the stream holds {stored} messages for {head} events");
    }
    Ok(())
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
