//! Replay throughput: a fresh database holding about a million realistic transfer events, made
//! directly in SQL, then in one run (a) the raw read of those rows (`COPY ... TO STDOUT` in the
//! projector's order), (b) the live projector's normal catch-up over them, and (c) the full
//! rebuild `ledger replay` does (`projections::replay::replay`, same code), with its equality
//! report. Prints rows or events per second for each and the ratio replay / raw read.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::StreamExt;
use sqlx::{Connection, PgConnection, PgPool};

/// Measured runs of the raw read and of the replay; the fastest of each counts.
const RUNS: usize = 3;

/// The database this benchmark owns; dropped and made again on every run.
const DATABASE: &str = "ledger_bench_replay";

/// Transfers generated per INSERT (and per transaction): about 10,000 events each, so the log
/// has many writing transactions as a batched repository would leave, not one giant one.
const TRANSFERS_PER_CHUNK: i64 = 2000;

/// Mean events per generated transfer (see the mix in [`GENERATE`]):
/// 0.80 × 5 + 0.10 × 3 + 0.08 × 6 + 0.02 × 4.
const EVENTS_PER_TRANSFER: f64 = 4.86;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// About how many events to generate.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// The PostgreSQL server (no database name); the benchmark uses its own database there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    server: String,
    /// Distinct users the transfers belong to.
    #[arg(long, default_value_t = 20_000)]
    users: i64,
    /// Keep the log a previous run generated (its projections are emptied and rebuilt), to
    /// measure again without generating it anew.
    #[arg(long)]
    reuse: bool,
}

/// One chunk of transfers `$1..=$2`, each a full lifecycle, with payloads shaped exactly as serde
/// serializes `domain::TransferEvent` (externally tagged enum; ULID, user id as a number, amount
/// as canonical text, RFC 3339 UTC times). The mix, by a hash of the transfer number:
/// 80 % committed (5 events), 10 % failed at the withdraw (3), 8 % rolled back after a refused
/// deposit (6), 2 % still waiting for the deposit (4, so money stays in flight). Rows are ordered
/// by the time of each step, so the lifecycles of neighbouring transfers interleave in the log as
/// they do under concurrent load. Feed positions follow that order, after the feed's head, which
/// the statement takes under the feed's lock as the ledger's appender does.
const GENERATE: &str = r#"
WITH head AS MATERIALIZED (SELECT feed_take() AS before),
ins AS (
INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload,
                    metadata, user_id, occurred_at, feed_position)
SELECT 'Transfer', t.req_id, s.seq, s.event_type, '1',
       jsonb_build_object(s.event_type, CASE s.event_type
           WHEN 'TransferCreated' THEN jsonb_build_object(
               'req_id', t.req_id, 'user_id', t.user_id, 'from', t.src, 'to', t.dst,
               'asset', t.asset, 'amount', t.amount, 'cid', t.cid, 'at', s.at)
           WHEN 'TransferFailed' THEN jsonb_build_object(
               'code', 'INSUFFICIENT_BALANCE', 'message', 'funding balance is below the amount',
               'at', s.at)
           WHEN 'CompensationStarted' THEN jsonb_build_object(
               'code', 'ACCOUNT_DISABLED', 'message', 'account is disabled', 'at', s.at)
           ELSE jsonb_build_object('at', s.at)
       END)::json,
       json_build_object('user_id', t.user_id::text),
       t.user_id, s.at::timestamptz,
       head.before + row_number() OVER (ORDER BY t.t0 + s.seq * interval '1.5 ms', t.i, s.seq)
FROM head, (
    SELECT i,
           -- A canonical ULID: a fixed 8-character prefix and the transfer number in Crockford
           -- base32 (18 digits).
           '01JBENCH' || (SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ',
                                                   ((i >> (5 * k)) & 31)::int + 1, 1), ''
                                            ORDER BY k DESC)
                          FROM generate_series(0, 17) k) AS req_id,
           1 + (i * 7919) % $3 AS user_id,
           CASE WHEN i % 2 = 0 THEN 'FUNDING' ELSE 'SPOT' END AS src,
           CASE WHEN i % 2 = 0 THEN 'SPOT' ELSE 'FUNDING' END AS dst,
           (ARRAY['USDT', 'USDT', 'BTC', 'ETH'])[1 + (i * 31) % 4] AS asset,
           -- Canonical amount text: no trailing fractional zeros.
           trim_scale(CASE (i * 31) % 4
               WHEN 2 THEN (1 + (i * 104729) % 5000000)::numeric / 100000000
               WHEN 3 THEN (1 + (i * 104729) % 9000000)::numeric / 1000000
               ELSE (1 + (i * 104729) % 2000000)::numeric / 100
           END)::text AS amount,
           CASE WHEN i % 3 = 0 THEN 'bench-' || i END AS cid,
           CASE WHEN (i * 2654435761) % 100 < 80 THEN 'commit'
                WHEN (i * 2654435761) % 100 < 90 THEN 'fail'
                WHEN (i * 2654435761) % 100 < 98 THEN 'rollback'
                ELSE 'open' END AS kind,
           timestamptz '2026-01-01 00:00:00+00' + i * interval '2 ms' AS t0
    FROM generate_series($1::bigint, $2::bigint) i
) t
CROSS JOIN LATERAL (
    SELECT v.seq, v.event_type,
           to_char((t.t0 + v.seq * interval '1.5 ms' + (t.i % 7) * interval '1 us')
                       AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS at
    FROM (VALUES
        (1, 'TransferCreated'),
        (2, 'SourceWithdrawStarted'),
        (3, CASE WHEN t.kind = 'fail' THEN 'TransferFailed' ELSE 'SourceWithdrawn' END),
        (4, 'TargetDepositStarted'),
        (5, CASE WHEN t.kind = 'commit' THEN 'TransferCommitted' ELSE 'CompensationStarted' END),
        (6, 'TransferRolledBack')
    ) v(seq, event_type)
    WHERE v.seq <= CASE t.kind WHEN 'commit' THEN 5 WHEN 'fail' THEN 3 WHEN 'rollback' THEN 6
                               ELSE 4 END
) s
ORDER BY t.t0 + s.seq * interval '1.5 ms', t.i, s.seq
RETURNING feed_position
)
SELECT count(*) FROM ins
"#;

/// A benchmark's own database on `server`: dropped and made anew, or kept when `reuse` is asked
/// and it exists. Returns its URL, its pool, and whether it was kept.
pub(crate) async fn own_database(
    server: &str,
    database: &str,
    reuse: bool,
) -> anyhow::Result<(String, sqlx::PgPool, bool)> {
    let server = server.trim_end_matches('/');
    let url = format!("{server}/{database}");
    let mut admin = PgConnection::connect(&format!("{server}/postgres"))
        .await
        .context("connect to the PostgreSQL server")?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(database)
            .fetch_one(&mut admin)
            .await?;
    let reuse = reuse && exists;
    if !reuse {
        sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .context("drop the benchmark database")?;
    }
    admin.close().await.ok();
    let pool = schema::prepare(&url, 8).await?;
    Ok((url, pool, reuse))
}

// long: one measurement read top to bottom (history, rebuild, comparison, figures); a figures tool.
pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    let (url, pool, reuse) = own_database(&args.server, DATABASE, args.reuse).await?;
    let events: i64 = if reuse {
        sqlx::raw_sql(
            "TRUNCATE transfers_view, transfer_balances, transfer_state_counts;
             UPDATE projector_cursor SET tx_id = '0', global_position = 0, events_applied = 0",
        )
        .execute(&pool)
        .await?;
        let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
            .fetch_one(&pool)
            .await?;
        println!("reused database {url}: {events} events, projections emptied");
        events
    } else {
        println!("clean database: {url}");
        let generated = generate(&pool, &args).await?;
        let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
            .fetch_one(&pool)
            .await?;
        println!(
            "generated {events} events in {:.1} s ({:.0} events/s, SQL only)",
            generated.as_secs_f64(),
            events as f64 / generated.as_secs_f64()
        );
        events
    };
    // What autovacuum would have done by the time anyone replays: hint bits set, statistics
    // fresh, so neither measurement below pays for the bulk load.
    sqlx::query("VACUUM (ANALYZE) events")
        .execute(&pool)
        .await?;
    let size: String =
        sqlx::query_scalar("SELECT pg_size_pretty(pg_total_relation_size('events'))")
            .fetch_one(&pool)
            .await?;
    println!("events table with indexes: {size}");

    // (a) The floor: the same rows read raw, in the projector's order, once to warm the cache
    // and then RUNS times; the fastest counts (the strictest floor).
    raw_read(&pool).await?;
    println!();
    println!("raw read (COPY (SELECT * FROM events ORDER BY tx_id, global_position) TO STDOUT):");
    let mut raw_time = Duration::MAX;
    let mut raw_rows = 0;
    for _ in 0..RUNS {
        let (rows, bytes, time) = raw_read(&pool).await?;
        println!(
            "  {rows} rows, {:.1} MiB in {:.2} s: {:.0} rows/s",
            bytes as f64 / 1_048_576.0,
            time.as_secs_f64(),
            rows as f64 / time.as_secs_f64()
        );
        raw_time = raw_time.min(time);
        raw_rows = rows;
    }
    let raw_rate = raw_rows as f64 / raw_time.as_secs_f64();
    println!("  fastest: {raw_rate:.0} rows/s");

    // (b) The live projector's normal catch-up over the whole log. The replay below compares
    // with the live tables at the live position, so this is also what makes it rebuild all.
    let started = Instant::now();
    let caught_up = projections::Projector::new(pool.clone())
        .catch_up(Duration::from_secs(3600))
        .await
        .context("live catch-up")?;
    let live_time = started.elapsed();
    if !caught_up {
        bail!("the live projector did not catch up (a long transaction on the server?)");
    }
    let live_rate = events as f64 / live_time.as_secs_f64();
    println!();
    println!("live projector catch-up (Projector::catch_up, batches of the live pass):");
    println!(
        "  {events} events in {:.2} s: {live_rate:.0} events/s",
        live_time.as_secs_f64()
    );

    // (c) The full rebuild, exactly as `ledger replay` runs it, with its equality report,
    // RUNS times; the fastest counts. The last progress call comes when the rebuild is complete,
    // just before the comparison, so it splits each run into the two.
    println!();
    println!("replay (projections::replay::replay, as `ledger replay`):");
    let mut best: Option<(Duration, Duration)> = None;
    let mut report = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let mut rebuilt_at = started;
        let run = projections::replay::replay(&pool, false, |_, _| rebuilt_at = Instant::now())
            .await
            .context("replay")?;
        let replay_time = started.elapsed();
        let rebuild_time = rebuilt_at.duration_since(started);
        println!(
            "  rebuild {} events in {:.2} s: {:.0} events/s; with the comparison {:.2} s: {:.0} events/s",
            run.events_replayed,
            rebuild_time.as_secs_f64(),
            run.events_replayed as f64 / rebuild_time.as_secs_f64(),
            replay_time.as_secs_f64(),
            run.events_replayed as f64 / replay_time.as_secs_f64(),
        );
        if best.is_none_or(|(b, _)| rebuild_time < b) {
            best = Some((rebuild_time, replay_time));
        }
        report = Some(run);
    }
    let (rebuild_time, replay_time) = best.context("no replay ran")?;
    let report = report.context("no replay ran")?;
    let rebuild_rate = report.events_replayed as f64 / rebuild_time.as_secs_f64();
    let replay_rate = report.events_replayed as f64 / replay_time.as_secs_f64();
    println!("  fastest rebuild: {rebuild_rate:.0} events/s; with the comparison: {replay_rate:.0} events/s");
    for t in &report.tables {
        println!(
            "  {:<22} live {:>8}  replay {:>8}  only-live {:>4}  only-replay {:>4}  {}",
            t.table,
            t.live_rows,
            t.replay_rows,
            t.only_live,
            t.only_replay,
            if t.equal() { "EQUAL" } else { "DIFFERENT" }
        );
    }

    // (d) `ledger replay --keep`: the same, then every index of the rebuilt tables built and the
    // tables made logged, so they stand as usable projections. Dropped here afterwards.
    let started = Instant::now();
    let kept = projections::replay::replay(&pool, true, |_, _| {})
        .await
        .context("replay --keep")?;
    let kept_time = started.elapsed();
    sqlx::query(&format!("DROP SCHEMA \"{}\" CASCADE", kept.schema))
        .execute(&pool)
        .await?;
    let kept_rate = kept.events_replayed as f64 / kept_time.as_secs_f64();
    println!(
        "  with --keep (comparison, then indexes built and tables logged): {:.2} s: {kept_rate:.0} events/s",
        kept_time.as_secs_f64()
    );
    if !kept.equal() {
        bail!("the kept replay differs from the live projections");
    }

    println!();
    println!(
        "rebuild / raw read:         {:.2} (target >= 0.50)",
        rebuild_rate / raw_rate
    );
    println!(
        "replay with comparison / raw read: {:.2}",
        replay_rate / raw_rate
    );
    println!("live catch-up / raw read:   {:.2}", live_rate / raw_rate);
    println!("replay --keep / raw read:   {:.2}", kept_rate / raw_rate);
    if !report.equal() {
        bail!("the replay differs from the live projections");
    }
    if report.events_replayed != events {
        bail!("replayed {} events of {events}", report.events_replayed);
    }
    Ok(vec![format!(
        "replay of {events} events: rebuild {rebuild_rate:.0} events/s, raw read {raw_rate:.0} rows/s, ratio {:.2} (target >= 0.50); with --keep {:.2}",
        rebuild_rate / raw_rate,
        kept_rate / raw_rate
    )])
}

/// Fills the log chunk by chunk, one transaction each (also the relay benchmark's backlog).
pub(crate) async fn generate(pool: &PgPool, args: &Args) -> anyhow::Result<Duration> {
    generate_events(pool, args.events, args.users).await
}

/// About `events` events of transfers of `users` users, chunk by chunk.
pub(crate) async fn generate_events(
    pool: &PgPool,
    events: u64,
    users: i64,
) -> anyhow::Result<Duration> {
    let transfers = ((events as f64 / EVENTS_PER_TRANSFER).ceil() as i64).max(1);
    let started = Instant::now();
    let mut lo = 1;
    while lo <= transfers {
        let hi = (lo + TRANSFERS_PER_CHUNK - 1).min(transfers);
        sqlx::query(GENERATE)
            .bind(lo)
            .bind(hi)
            .bind(users.max(1))
            .execute(pool)
            .await
            .context("generate events")?;
        lo = hi + 1;
    }
    Ok(started.elapsed())
}

/// Streams every event out with COPY in (tx_id, global_position) order and counts rows (text
/// format escapes newlines inside values, so each line is one row) and bytes.
async fn raw_read(pool: &PgPool) -> anyhow::Result<(u64, u64, Duration)> {
    let mut conn = pool.acquire().await?;
    let started = Instant::now();
    let mut stream = conn
        .copy_out_raw("COPY (SELECT * FROM events ORDER BY tx_id, global_position) TO STDOUT")
        .await?;
    let (mut rows, mut bytes) = (0u64, 0u64);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        bytes += chunk.len() as u64;
        rows += chunk.iter().filter(|b| **b == b'\n').count() as u64;
    }
    Ok((rows, bytes, started.elapsed()))
}
