//! `ledger-bench tlog`: what the tamper-evident log costs (`docs/adr/0016-tamper-evident-log.md`).
//!
//! (a) The single-transfer route, then the bulk route, with the log on (`ledger serve` with
//! `LEDGER_LOG_SIGNING_KEY_FILE` set: its follower builds the tree and signs checkpoints beside
//! the traffic) and off (unset), in alternating runs on one database (`abab.rs`, as `traces`):
//! every run, the medians and how much slower on is (target: at most 5%). Before each on run the
//! follower first catches up with the off run before it (timed apart), so every on run measures
//! the tree keeping up with live traffic, not a backlog the off run left.
//!
//! (b) `ledger verify`, the binary as an operator runs it, over a log of about a million events
//! (`replay.rs`'s generator, and one deposit per user with its entry), its tree and checkpoints
//! built first by the follower: entries per second (target: at least 100,000).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sqlx::PgPool;
use tlog_follower::{Follower, FollowerConfig};

use crate::abab::{median, Bench, Series};
use crate::transfers::bin;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Concurrent HTTP clients, each moving its own user's money back and forth.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Runs of each kind (off, on) per route, alternating: 3 makes off, on, off, on, off, on.
    #[arg(long, default_value_t = 3)]
    pairs: usize,
    /// How long to drive transfers, per run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// A first run, the log off, not counted (`abab::Bench::warm_up`).
    #[arg(long, default_value_t = 8)]
    warmup_seconds: u64,
    /// Each run's first seconds, driven and not counted, in both kinds of run
    /// (`abab::Bench::drive`).
    #[arg(long, default_value_t = 2.0)]
    settle_seconds: f64,
    /// Transfers per request of the bulk route's runs.
    #[arg(long, default_value_t = 100)]
    bulk: usize,
    /// Which routes' rates to measure: both, single or bulk.
    #[arg(long, value_enum, default_value_t = Routes::Both)]
    routes: Routes,
    /// About how many events the log `ledger verify` reads holds.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Users of the generated log, each with one deposit.
    #[arg(long, default_value_t = 20_000)]
    users: i64,
    /// Timed runs of `ledger verify`.
    #[arg(long, default_value_t = 3)]
    verify_runs: usize,
    /// Only the verification (b).
    #[arg(long)]
    verify_only: bool,
    /// Only the rates (a).
    #[arg(long)]
    rates_only: bool,
    /// The PostgreSQL server; the benchmark makes its own databases `ledger_bench_tlog` and
    /// `ledger_bench_tlog_verify` there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    server: String,
    /// libpq's sslmode for the ledger's connections.
    #[arg(long, default_value = "prefer")]
    sslmode: String,
}

/// The routes (a) measures.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Routes {
    Both,
    Single,
    Bulk,
}

/// The log's name (its checkpoints' origin) in both parts.
const ORIGIN: &str = "bench.ledger/log";

/// Most the follower may take to catch up with an off run's events before an on run.
const CATCH_UP_MAX: Duration = Duration::from_secs(300);

pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    if args.pairs == 0 || args.bulk < 2 || args.events == 0 {
        bail!("--pairs and --events must be above zero, --bulk above one");
    }
    let dir = std::env::temp_dir().join(format!("ledger-bench-tlog-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir)?;
    let key = dir.join("log.key");
    let signer = ::tlog::Signer::from_seed(ORIGIN, [7; 32]).context("the benchmark's key")?;
    std::fs::write(&key, format!("{}\n", signer.to_skey()))?;
    let mut summary = Vec::new();
    let measured = async {
        if !args.verify_only {
            summary.extend(rates(&args, &key).await?);
        }
        if !args.rates_only {
            summary.push(verify_rate(&args, &key, signer).await?);
        }
        anyhow::Ok(())
    }
    .await;
    std::fs::remove_dir_all(&dir).ok();
    measured?;
    Ok(summary)
}

/// (a): the single route's ABAB runs, then the bulk route's, on one database.
async fn rates(args: &Args, key: &Path) -> anyhow::Result<Vec<String>> {
    let mut bench = Bench::new(
        &args.server,
        &args.sslmode,
        "ledger_bench_tlog",
        args.clients,
        args.seconds,
    )
    .await?;
    let pool = schema::connect(&bench.url, 2).await?;
    println!("clean database: {}", bench.url);
    let on_env = vec![(
        "LEDGER_LOG_SIGNING_KEY_FILE",
        key.to_str().context("a UTF-8 key path")?.to_owned(),
    )];
    bench.warm_up(args.warmup_seconds, 1).await?;
    bench.settle(args.settle_seconds);
    let mut summary = Vec::new();
    let routes = [
        (Routes::Single, 1, "single-transfer route".to_owned()),
        (
            Routes::Bulk,
            args.bulk,
            format!("bulk route, {} per request", args.bulk),
        ),
    ];
    let wanted = routes
        .into_iter()
        .filter(|(r, _, _)| args.routes == Routes::Both || args.routes == *r);
    for (_, bulk, route) in wanted {
        let mut series = Series::default();
        for round in 0..args.pairs * 2 {
            let on = round % 2 == 1;
            let started = bench.start(if on { on_env.as_slice() } else { &[] })?;
            if on {
                print_caught_up(&pool).await?;
            }
            let run = bench.drive(&started, bulk).await?;
            if on {
                print_lag(&pool).await?;
            }
            drop(started);
            let label = if on {
                "log on (tree and checkpoints)"
            } else {
                "log off"
            };
            run.print(&format!(
                "{route}: run {} of {}: {label}",
                round + 1,
                args.pairs * 2
            ));
            series.push(on, run.tps());
        }
        let title = format!(
            "tlog: {route}, {} clients, {} s runs, ABAB x{}",
            args.clients, args.seconds, args.pairs
        );
        summary.push(series.print(&title, "transfers/s"));
    }
    let (tree, head): (i64, i64) =
        sqlx::query_as("SELECT (SELECT size FROM tlog_state), (SELECT position FROM feed_head)")
            .fetch_one(&pool)
            .await?;
    println!("the tree holds {tree} of the feed's {head} entries");
    summary.push(storage(&pool, tree).await?);
    Ok(summary)
}

/// Waits for the follower to catch up with what the off run left, and says how long it took.
async fn print_caught_up(pool: &PgPool) -> anyhow::Result<()> {
    let (entries, took) = caught_up(pool).await?;
    println!(
        "log on: the follower caught up with {entries} entries in {:.1} s first",
        took.as_secs_f64()
    );
    Ok(())
}

/// How far behind the feed the tree is (at an on run's end: the follower keeps up, or not).
async fn print_lag(pool: &PgPool) -> anyhow::Result<()> {
    let (tree, head): (i64, i64) =
        sqlx::query_as("SELECT (SELECT size FROM tlog_state), (SELECT position FROM feed_head)")
            .fetch_one(pool)
            .await?;
    println!(
        "log on: at the run's end the tree held {tree} of {head} entries ({} behind)",
        head - tree
    );
    Ok(())
}

/// The tiles' size (table, TOAST and index, dead versions not yet vacuumed included) per entry of
/// the tree: printed, and the summary's line.
async fn storage(pool: &PgPool, tree: i64) -> anyhow::Result<String> {
    let (tiles, rows): (i64, i64) = sqlx::query_as(
        "SELECT pg_total_relation_size('tlog_tiles'), (SELECT count(*) FROM tlog_tiles)",
    )
    .fetch_one(pool)
    .await?;
    let per = tiles as f64 / tree.max(1) as f64;
    println!(
        "tlog_tiles: {tiles} bytes in {rows} rows (table, TOAST and index): {per:.1} B per entry"
    );
    Ok(format!(
        "tlog: storage after the runs: tlog_tiles {tiles} bytes for {tree} entries, {per:.1} B per entry"
    ))
}

/// Waits until the tree holds every event of the feed as it stood when called (the on run's
/// follower has started): how many entries it added and how long it took.
async fn caught_up(pool: &PgPool) -> anyhow::Result<(i64, Duration)> {
    let started = Instant::now();
    let (from, head): (i64, i64) =
        sqlx::query_as("SELECT (SELECT size FROM tlog_state), (SELECT position FROM feed_head)")
            .fetch_one(pool)
            .await?;
    loop {
        let size: i64 = sqlx::query_scalar("SELECT size FROM tlog_state")
            .fetch_one(pool)
            .await?;
        if size >= head {
            return Ok((size - from, started.elapsed()));
        }
        if started.elapsed() > CATCH_UP_MAX {
            bail!("the follower stayed at {size} of {head} entries");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (b): a generated log of about `--events` events and a deposit per user, its tree built by
/// the follower, then `ledger verify` timed `--verify-runs` times.
async fn verify_rate(args: &Args, key: &Path, signer: ::tlog::Signer) -> anyhow::Result<String> {
    let (url, pool, _) =
        crate::replay::own_database(&args.server, "ledger_bench_tlog_verify", false).await?;
    println!();
    println!("clean database: {url}");
    let generated = crate::replay::generate_events(&pool, args.events, args.users).await?;
    deposits(&pool, args.users).await?;
    sqlx::query("VACUUM (ANALYZE) events")
        .execute(&pool)
        .await?;
    let head: i64 = sqlx::query_scalar("SELECT position FROM feed_head")
        .fetch_one(&pool)
        .await?;
    println!(
        "generated {head} entries ({} deposits) in {:.1} s",
        args.users,
        generated.as_secs_f64()
    );
    let built = build_tree(&pool, signer, head).await?;
    println!(
        "the follower built the tree and its checkpoints in {:.1} s ({:.0} entries/s)",
        built.as_secs_f64(),
        head as f64 / built.as_secs_f64()
    );
    let mut rates = Vec::new();
    for n in 1..=args.verify_runs.max(1) {
        let started = Instant::now();
        let out = Command::new(bin("ledger")?)
            .arg("verify")
            .env("DATABASE_URL", &url)
            .env("LEDGER_LOG_SIGNING_KEY_FILE", key)
            .env("RUST_LOG", "warn")
            .output()
            .context("run ledger verify")?;
        let took = started.elapsed();
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.contains("the log verifies") {
            bail!("ledger verify failed: {text}");
        }
        let rate = head as f64 / took.as_secs_f64();
        println!(
            "ledger verify run {n}: {head} entries in {:.2} s: {rate:.0} entries/s; {}",
            took.as_secs_f64(),
            text.lines().next().unwrap_or_default()
        );
        rates.push(rate);
    }
    let rate = median(rates);
    println!("ledger verify median: {rate:.0} entries/s (target >= 100,000)");
    Ok(format!(
        "tlog: ledger verify of {head} entries ({} deposits, tree and checkpoints stored): median {rate:.0} entries/s (target >= 100,000)",
        args.users
    ))
}

/// One deposit per user, with its entry at the log's end, as migration 0025 appends earlier
/// deposits' (the same SQL function the ledger's deposits append theirs with).
async fn deposits(pool: &PgPool, users: i64) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO external_deposits (external_id, user_id, asset, amount)
         SELECT 'bench-deposit-' || u, u, 'USDT', 1000 FROM generate_series(1, $1::bigint) u",
    )
    .bind(users.max(1))
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "SELECT deposit_entries_append(ARRAY(SELECT external_id FROM external_deposits
                                            ORDER BY external_id COLLATE \"C\"))",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The follower's passes until the tree holds `head` entries, signing a checkpoint every 10,000
/// as `ledger serve` does by default; how long it took.
async fn build_tree(pool: &PgPool, signer: ::tlog::Signer, head: i64) -> anyhow::Result<Duration> {
    let follower = Follower::new(
        pool.clone(),
        FollowerConfig {
            signer,
            checkpoint_events: 10_000,
            checkpoint_interval: Duration::from_secs(10),
        },
    );
    let started = Instant::now();
    loop {
        let pass = follower.pass().await.context("follower pass")?;
        if pass.size >= head as u64 {
            return Ok(started.elapsed());
        }
        if pass.added == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
