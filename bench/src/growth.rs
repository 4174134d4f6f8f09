//! Growth: what running for years costs, from real processes. Figures, never
//! assertions.
//!
//! - **spot-core**: one real process with its default snapshot settings, driven over pipelined
//!   connections with operations over `--accounts` accounts (deposits, and every fourth a
//!   withdraw). While it runs, the benchmark plays the ledger's part: every 200 ms it advances the
//!   idempotency horizon so that only the newest `--remembered` operations' keys are kept (as a
//!   retention window does), and tells spot-core the conservation check consumed everything (`retain`). At
//!   each point of `--ops` it stops sending and prints spot-core's resident memory, its newest
//!   snapshot's size, the WAL on disk, the keys it remembers; then it freezes the process
//!   (SIGSTOP), copies its data dir (what a SIGKILL would leave), lets it go on, and times a
//!   second spot-core started on the copy until it listens. The first process is never
//!   restarted, so each RSS is one process's after that many operations.
//! - **audit**: a real `ledger serve` and spot-core on a database of their own, transfers driven
//!   over HTTP until the log holds each count of `--transfers`; at each, `--new-transfers` more,
//!   then the periodic (incremental) conservation check's time; a VACUUM (what autovacuum, off
//!   on this machine's PostgreSQL, would have done), then three times `--new-transfers` more and
//!   the periodic check (the median is the figure), each through the ledger's admin route; the
//!   full check's time by `ledger audit --full` (the admin route is bounded by the HTTP request
//!   timeout); a `/metrics` scrape's time. While transfers are made, the periodic check runs
//!   every `--check-every` transfers, as the ledger's own monitor keeps its checkpoint near the
//!   head.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use domain::UserId;
use rust_decimal::Decimal;
use serde_json::json;
use spot_core::protocol::{CoreStatus, Request, Response};
use spot_core::SpotClient;

use crate::procstat;
use crate::transfers::{bin, spawn_ready, Proc, SECRET};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Points (operations sent to spot-core) at which its figures are taken.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000000,5000000,10000000"
    )]
    ops: Vec<u64>,
    /// Accounts the operations are spread over.
    #[arg(long, default_value_t = 100_000)]
    accounts: u64,
    /// Operations whose keys stay behind the horizon (the newest ones): the retention window.
    #[arg(long, default_value_t = 500_000)]
    remembered: u64,
    /// Pipelined connections to spot-core.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Requests each connection sends in one write before reading their answers.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Transfers in the log at which the conservation check is timed.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    transfers: Vec<u64>,
    /// Transfers made between the last check and the timed periodic one (the new work).
    #[arg(long, default_value_t = 1000)]
    new_transfers: u64,
    /// Concurrent HTTP clients making transfers.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// While transfers are made, the periodic check runs after every this many (the ledger's own
    /// monitor runs it every 60 s, about 90,000 transfers at this machine's rate), so its
    /// checkpoint stays near the head as it does in production.
    #[arg(long, default_value_t = 50_000)]
    check_every: u64,
    /// Skip the spot-core part.
    #[arg(long)]
    skip_spot: bool,
    /// Skip the conservation check part.
    #[arg(long)]
    skip_audit: bool,
    /// The PostgreSQL server; the benchmark makes its own database `ledger_growth` there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    server: String,
}

const DATABASE: &str = "ledger_growth";

pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    let mut summary = Vec::new();
    if !args.skip_spot {
        summary.extend(spot_growth(&args).await?);
    }
    if !args.skip_audit {
        summary.extend(audit_growth(&args).await?);
    }
    Ok(summary)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sends `SIG<name>` to a process (`kill -s`).
fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -s {name} {pid} failed");
    }
    Ok(())
}

fn spawn_spot(data: &Path, archive: Option<&Path>) -> anyhow::Result<(Proc, String, Duration)> {
    let mut cmd = Command::new(bin("spot-core")?);
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data);
    if let Some(archive) = archive {
        cmd.arg("--archive-dir").arg(archive);
    }
    let started = Instant::now();
    let (proc_, addr) = spawn_ready(cmd, "spot-core listening on ")?;
    Ok((proc_, addr, started.elapsed()))
}

async fn core_status(client: &SpotClient, request: &Request) -> anyhow::Result<CoreStatus> {
    match client.call(request).await? {
        Response::Ok {
            core: Some(core), ..
        } => Ok(core),
        other => bail!("spot-core answered {other:?} to {request:?}"),
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// One figure point of the spot-core part.
struct SpotPoint {
    ops: u64,
    rss: u64,
    status: CoreStatus,
    data_dir_bytes: u64,
    restart: Duration,
    rss_after_restart: u64,
}

// long: one measurement read top to bottom (operations in steps, snapshot, restart, figures); a figures tool.
async fn spot_growth(args: &Args) -> anyhow::Result<Vec<String>> {
    let mut points: Vec<u64> = args.ops.clone();
    points.sort_unstable();
    points.dedup();
    if points.is_empty() || points[0] == 0 {
        bail!("--ops needs one or more counts above zero");
    }
    let data = std::env::temp_dir().join(format!("growth-spot-{}", ulid::Ulid::new()));
    let (proc_, addr, _) = spawn_spot(&data, None)?;
    println!(
        "== growth: spot-core, {} accounts, keys of the newest {} operations kept ==",
        args.accounts, args.remembered
    );
    println!("data dir: {}", data.display());
    let sent = Arc::new(AtomicU64::new(0));
    let mut results = Vec::new();
    let started = Instant::now();
    // The ledger's part, for the whole run: the horizon keeps the newest `remembered`
    // operations' keys, and the conservation check has consumed everything. One keeper throughout, as a
    // ledger's horizon follows time without a break (a keeper started afresh at each point
    // forgot what it had sent before, and the keys of the previous point stayed twice as long).
    let stop = Arc::new(AtomicBool::new(false));
    let horizon = tokio::spawn(keep_horizon(
        addr.clone(),
        sent.clone(),
        args.remembered,
        stop.clone(),
    ));
    for &point in &points {
        let mut tasks = Vec::new();
        for _ in 0..args.connections.max(1) {
            tasks.push(tokio::spawn(send_ops(
                addr.clone(),
                sent.clone(),
                point,
                args.accounts.max(1),
                args.window.max(1),
            )));
        }
        for t in tasks {
            t.await??;
        }
        let client = SpotClient::new(addr.clone(), Duration::from_secs(30));
        let status = core_status(&client, &Request::Status {}).await?;
        let rss = procstat::rss(proc_.child.id());
        let data_dir_bytes = dir_bytes(&data);
        println!(
            "{point} ops sent ({:.0} ops/s so far): RSS {:.1} MiB, remembered {}, snapshot {:.1} MiB at seq {}, WAL {:.1} MiB in {} segments, data dir {:.1} MiB",
            point as f64 / started.elapsed().as_secs_f64(),
            procstat::mib(rss),
            status.remembered,
            procstat::mib(status.snapshot_bytes),
            status.snapshot_seq,
            procstat::mib(status.wal_bytes),
            status.wal_segments,
            procstat::mib(data_dir_bytes),
        );
        // A crash image, then the time until a spot-core started on it listens (snapshot load +
        // WAL tail replay). The running process is frozen (SIGSTOP) while its data dir is copied:
        // what the copy holds is what a SIGKILL would have left (the page cache survives a
        // process's death), and the running process goes on to the next point with everything
        // it holds, so its RSS at each point is that of one process after that many operations.
        let image = data.with_extension(format!("image-{point}"));
        signal(proc_.child.id(), "STOP")?;
        let copied = Command::new("cp").arg("-a").arg(&data).arg(&image).status();
        signal(proc_.child.id(), "CONT")?;
        if !copied?.success() {
            bail!("copying {} failed", data.display());
        }
        let (restarted, restarted_addr, restart) = spawn_spot(&image, None)?;
        let client = SpotClient::new(restarted_addr, Duration::from_secs(30));
        let after = core_status(&client, &Request::Status {}).await?;
        if after.last_seq != status.last_seq {
            bail!(
                "restart lost records: last seq {} before, {} after",
                status.last_seq,
                after.last_seq
            );
        }
        let rss_after_restart = procstat::rss(restarted.child.id());
        drop(restarted);
        std::fs::remove_dir_all(&image).ok();
        println!(
            "  restart to ready on a crash image: {:.3} s (replayed {} WAL records after the snapshot), RSS after restart {:.1} MiB",
            restart.as_secs_f64(),
            after.last_seq.saturating_sub(after.snapshot_seq),
            procstat::mib(rss_after_restart)
        );
        results.push(SpotPoint {
            ops: point,
            rss,
            status,
            data_dir_bytes,
            restart,
            rss_after_restart,
        });
    }
    stop.store(true, Ordering::Relaxed);
    horizon.await??;
    drop(proc_);
    std::fs::remove_dir_all(&data).ok();

    let first = results.first().context("a point")?;
    let last = results.last().context("a point")?;
    println!();
    println!("ops        RSS MiB  after-restart MiB  remembered  snapshot MiB  WAL MiB  segments  restart s");
    for p in &results {
        println!(
            "{:<10} {:>7.1}  {:>17.1}  {:>10}  {:>12.1}  {:>7.1}  {:>8}  {:>9.3}",
            p.ops,
            procstat::mib(p.rss),
            procstat::mib(p.rss_after_restart),
            p.status.remembered,
            procstat::mib(p.status.snapshot_bytes),
            procstat::mib(p.status.wal_bytes),
            p.status.wal_segments,
            p.restart.as_secs_f64()
        );
    }
    let ratio = last.rss as f64 / first.rss.max(1) as f64;
    let restart_max = results.iter().map(|p| p.restart).max().unwrap_or_default();
    println!(
        "RSS after {} ops : RSS after {} ops = {ratio:.2} (target <= 1.2); restart to ready after {} ops {:.3} s (target <= 1 s); data dir {:.1} MiB",
        last.ops,
        first.ops,
        last.ops,
        last.restart.as_secs_f64(),
        procstat::mib(last.data_dir_bytes)
    );
    Ok(vec![format!(
        "growth, spot-core: RSS {:.1} MiB after {} ops, {:.1} MiB after {} ops (ratio {ratio:.2}, target <= 1.2); restart to ready {:.3} s after {} ops (slowest {:.3} s; target <= 1 s); snapshot {:.1} MiB, WAL {:.1} MiB on disk",
        procstat::mib(first.rss),
        first.ops,
        procstat::mib(last.rss),
        last.ops,
        last.restart.as_secs_f64(),
        last.ops,
        restart_max.as_secs_f64(),
        procstat::mib(last.status.snapshot_bytes),
        procstat::mib(last.status.wal_bytes),
    )])
}

/// Sends operations until `sent` reaches `until`: deposits of 1, every fourth a withdraw of 1,
/// each under a fresh ULID, `window` per write on one connection.
async fn send_ops(
    addr: String,
    sent: Arc<AtomicU64>,
    until: u64,
    accounts: u64,
    window: usize,
) -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let mut out = Vec::with_capacity(window * 160);
    let mut line = String::new();
    loop {
        let first = sent.fetch_add(window as u64, Ordering::Relaxed);
        if first >= until {
            sent.fetch_sub(window as u64, Ordering::Relaxed);
            return Ok(());
        }
        let n = (until - first).min(window as u64);
        if n < window as u64 {
            sent.fetch_sub(window as u64 - n, Ordering::Relaxed);
        }
        out.clear();
        for k in first..first + n {
            let user = k % accounts + 1;
            let req_id = ulid::Ulid::new().to_string();
            let request = if k % 4 == 3 {
                Request::withdraw(req_id, user, "USDT", Decimal::ONE)
            } else {
                Request::deposit(req_id, user, "USDT", Decimal::ONE)
            };
            serde_json::to_writer(&mut out, &request)?;
            out.push(b'\n');
        }
        wr.write_all(&out).await?;
        for _ in 0..n {
            line.clear();
            if rd.read_line(&mut line).await? == 0 {
                bail!("spot-core closed the connection");
            }
            match serde_json::from_str::<Response>(&line)? {
                Response::Applied { .. } | Response::Refused { seq: Some(_), .. } => {}
                other => bail!("unexpected answer: {other:?}"),
            }
        }
    }
}

/// Every 200 ms: notes (operations sent, now), advances the horizon to the newest note at least
/// `remembered` operations old, and retains nothing for the conservation check (it has consumed everything).
async fn keep_horizon(
    addr: String,
    sent: Arc<AtomicU64>,
    remembered: u64,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let client = SpotClient::new(addr, Duration::from_secs(30));
    let mut notes: VecDeque<(u64, u64)> = VecDeque::new();
    loop {
        let done = stop.load(Ordering::Relaxed);
        let count = sent.load(Ordering::Relaxed);
        notes.push_back((count, now_ms()));
        let mut horizon = None;
        while let Some(&(c, ms)) = notes.front() {
            if c + remembered <= count {
                horizon = Some(ms);
                notes.pop_front();
            } else {
                break;
            }
        }
        if let Some(before_ms) = horizon {
            core_status(&client, &Request::AdvanceHorizon { before_ms }).await?;
        }
        let status = core_status(&client, &Request::Status {}).await?;
        core_status(
            &client,
            &Request::Retain {
                after_seq: status.last_seq,
            },
        )
        .await?;
        if done {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One figure point of the conservation check part.
struct AuditPoint {
    transfers: u64,
    periodic: Duration,
    /// The same check before the database was vacuumed (autovacuum is off on this machine).
    unvacuumed: Duration,
    full: Duration,
    /// Peak resident memory of `ledger audit --full`.
    full_peak: u64,
    metrics: Duration,
}

// long: one measurement read top to bottom (history grown in steps, each step's figures); a figures tool.
async fn audit_growth(args: &Args) -> anyhow::Result<Vec<String>> {
    let mut points: Vec<u64> = args.transfers.clone();
    points.sort_unstable();
    points.dedup();
    if points.is_empty() || points[0] == 0 {
        bail!("--transfers needs one or more counts above zero");
    }
    let (url, pool, _) = crate::replay::own_database(&args.server, DATABASE, false).await?;
    let data = std::env::temp_dir().join(format!("growth-audit-{}", ulid::Ulid::new()));
    // With an archive, as an operator who runs full checks keeps one: compacted WAL segments
    // move there, and `ledger audit --full` reads spot-core's journal from seq 1 through them.
    let (spot, spot_addr, _) = spawn_spot(&data.join("spot"), Some(&data.join("archive")))?;
    let mut ledger_cmd = crate::transfers::serve_command(&url, &spot_addr)?;
    // The benchmark runs the periodic check itself, at known points.
    ledger_cmd.env("LEDGER_INVARIANT_INTERVAL_SECS", "86400");
    let (ledger, serving) = spawn_ready(ledger_cmd, "ledger serving on ")?;
    let base = serving
        .split_whitespace()
        .next()
        .context("address")?
        .to_owned();
    println!();
    println!(
        "== growth: the conservation check at {} transfers in the log ({} new since the last check) ==",
        points
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.new_transfers
    );
    println!("ledger serve: {base}, spot-core: {spot_addr}, database {url}");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients * 2)
        .timeout(Duration::from_secs(3600))
        .build()?;
    let admin = edge::mint(
        SECRET.as_bytes(),
        UserId::new(1).expect("user 1"),
        true,
        Duration::from_secs(86_400),
    );
    for c in 0..args.clients {
        let user = 1000 + c as u64;
        let r = http
            .post(format!("{base}/api/v1/admin/deposits"))
            .bearer_auth(&admin)
            .json(&json!({"user_id": user, "asset": "USDT", "amount": "1000000", "external_id": format!("growth-seed-{user}")}))
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("seed deposit failed: {}", r.text().await?);
        }
    }
    let tokens: Vec<String> = (0..args.clients)
        .map(|c| {
            edge::mint(
                SECRET.as_bytes(),
                UserId::new(1000 + c as u64).expect("valid user"),
                false,
                Duration::from_secs(86_400),
            )
        })
        .collect();
    let made = Arc::new(AtomicU64::new(0));
    let mut results = Vec::new();
    let started = Instant::now();
    for &point in &points {
        let before_new = point.saturating_sub(args.new_transfers);
        // The periodic check keeps up as the ledger's monitor would; the last one absorbs
        // everything made so far, so the run that follows sees only the new work.
        let every = args.check_every.max(1);
        let catch_up = loop {
            let next = (made.load(Ordering::Relaxed) / every + 1) * every;
            make_transfers(&http, &base, &tokens, &made, next.min(before_new)).await?;
            let (took, _) = check(&http, &base, &admin, false).await?;
            if made.load(Ordering::Relaxed) >= before_new {
                break took;
            }
        };
        make_transfers(&http, &base, &tokens, &made, point).await?;
        let (unvacuumed, _) = check(&http, &base, &admin, false).await?;
        // This machine's PostgreSQL runs with autovacuum off (`SHOW autovacuum`), so tables
        // updated in place (funding balances, open transfers, the read model) keep every dead
        // row version and any read of them grows with history. A production server vacuums
        // them: do what autovacuum would, then time the periodic check again over new work.
        let t0 = Instant::now();
        sqlx::query("VACUUM (ANALYZE)").execute(&pool).await?;
        let vacuum = t0.elapsed();
        // Three runs, each over `new_transfers` new ones; the median is the figure (one run of a
        // fraction of a second moves with whatever else the machine does).
        let mut runs = Vec::new();
        let mut report = serde_json::Value::Null;
        for _ in 0..3 {
            let target = made.load(Ordering::Relaxed) + args.new_transfers;
            make_transfers(&http, &base, &tokens, &made, target).await?;
            let (took, r) = check(&http, &base, &admin, false).await?;
            runs.push(took);
            report = r;
        }
        runs.sort_unstable();
        let periodic = runs[1];
        // From zero, as an operator runs it at this size: `ledger audit --full`, a process of its
        // own. The admin route's `?full=true` is bounded by the HTTP request timeout (30 s by
        // default), which the full check outgrows somewhere past a few hundred thousand transfers.
        let (full, full_peak, full_report) = full_check(&url, &spot_addr)?;
        let t0 = Instant::now();
        let scrape = http.get(format!("{base}/metrics")).send().await?;
        let ok = scrape.status().is_success();
        scrape.text().await?;
        let metrics = t0.elapsed();
        if !ok {
            bail!("/metrics failed");
        }
        let agree = report["assets"] == full_report["assets"];
        println!(
            "{point} transfers ({:.0}/s so far): periodic check {:.3} s (median of {:.3}, {:.3}, {:.3}; ok {}, read {}; {:.3} s before a VACUUM, which took {:.1} s), full check (`ledger audit --full`) {:.3} s, peak RSS {:.1} MiB (ok {}, same per-asset figures: {agree}), last catch-up check {:.3} s, /metrics {:.3} s",
            made.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
            periodic.as_secs_f64(),
            runs[0].as_secs_f64(),
            runs[1].as_secs_f64(),
            runs[2].as_secs_f64(),
            report["ok"],
            report["read"],
            unvacuumed.as_secs_f64(),
            vacuum.as_secs_f64(),
            full.as_secs_f64(),
            mib(full_peak),
            full_report["ok"],
            catch_up.as_secs_f64(),
            metrics.as_secs_f64(),
        );
        results.push(AuditPoint {
            transfers: point,
            periodic,
            unvacuumed,
            full,
            full_peak,
            metrics,
        });
    }
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&pool)
        .await?;
    drop(ledger);
    drop(spot);
    std::fs::remove_dir_all(&data).ok();

    let first = results.first().context("a point")?;
    let last = results.last().context("a point")?;
    println!();
    println!("transfers   periodic s   (unvacuumed s)   full s   full peak MiB   /metrics s");
    for p in &results {
        println!(
            "{:<10}  {:>10.3}  {:>16.3}  {:>7.3}  {:>13.1}  {:>10.3}",
            p.transfers,
            p.periodic.as_secs_f64(),
            p.unvacuumed.as_secs_f64(),
            p.full.as_secs_f64(),
            mib(p.full_peak),
            p.metrics.as_secs_f64()
        );
    }
    // The full check holds every transfer's details and movements until its end (ADR 0006):
    // its memory per transfer, from the growth between the first and the last point.
    let per_transfer = (last.full_peak as f64 - first.full_peak as f64)
        / (last.transfers as f64 - first.transfers as f64).max(1.0);
    println!(
        "full check memory: {per_transfer:.0} bytes per transfer between {} and {} transfers ({:.1} GiB per 100M)",
        first.transfers,
        last.transfers,
        per_transfer * 1e8 / f64::from(1u32 << 30)
    );
    let ratio = last.periodic.as_secs_f64() / first.periodic.as_secs_f64().max(1e-9);
    let unvacuumed_ratio = last.unvacuumed.as_secs_f64() / first.unvacuumed.as_secs_f64().max(1e-9);
    println!(
        "periodic check at {} : at {} transfers = {ratio:.2} (target <= 2; {unvacuumed_ratio:.2} with no VACUUM at all); {events} events in the log",
        last.transfers, first.transfers
    );
    Ok(vec![format!(
        "growth, audit: periodic check {:.3} s at {} transfers, {:.3} s at {} (ratio {ratio:.2}, target <= 2); full check {:.3} s and {:.3} s, peak RSS {:.1} and {:.1} MiB",
        first.periodic.as_secs_f64(),
        first.transfers,
        last.periodic.as_secs_f64(),
        last.transfers,
        first.full.as_secs_f64(),
        last.full.as_secs_f64(),
        mib(first.full_peak),
        mib(last.full_peak),
    )])
}

/// Runs the check through the admin route; returns its time and report.
async fn check(
    http: &reqwest::Client,
    base: &str,
    admin: &str,
    full: bool,
) -> anyhow::Result<(Duration, serde_json::Value)> {
    let t0 = Instant::now();
    let r = http
        .get(format!("{base}/api/v1/admin/invariant"))
        .query(&[("full", full)])
        .bearer_auth(admin)
        .send()
        .await?;
    let status = r.status();
    let body: serde_json::Value = r.json().await?;
    let took = t0.elapsed();
    if !status.is_success() {
        bail!("the check could not run: {status} {body}");
    }
    Ok((took, body))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// Runs `ledger audit --full` against the benchmark's database and spot-core; returns its wall
/// time, its peak resident memory (VmHWM, sampled every 5 ms while it runs: a process that has
/// exited has none to read, so growth in its last few ms may be missed) and its report.
fn full_check(
    database_url: &str,
    spot_addr: &str,
) -> anyhow::Result<(Duration, u64, serde_json::Value)> {
    let t0 = Instant::now();
    let child = Command::new(bin("ledger")?)
        .args(["audit", "--full", "--spot-url", spot_addr])
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(crate::procstat::peak_rss(pid));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let out = child.wait_with_output();
    done.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap_or(0);
    let out = out?;
    let took = t0.elapsed();
    if !out.status.success() {
        bail!(
            "ledger audit --full exited {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let body: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("ledger audit --full printed no report")?;
    Ok((took, peak, body))
}

/// Makes committed transfers until `made` reaches `until`, alternating each client's direction.
async fn make_transfers(
    http: &reqwest::Client,
    base: &str,
    tokens: &[String],
    made: &Arc<AtomicU64>,
    until: u64,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for token in tokens {
        let http = http.clone();
        let url = format!("{base}/api/v1/internal_transfer");
        let token = token.clone();
        let made = made.clone();
        tasks.push(tokio::spawn(async move {
            let mut to_spot = true;
            let mut failures = 0u32;
            loop {
                if made.load(Ordering::Relaxed) >= until {
                    return Ok::<(), anyhow::Error>(());
                }
                if crate::clients::transfer_one(&http, &url, &token, to_spot, None).await {
                    made.fetch_add(1, Ordering::Relaxed);
                    to_spot = !to_spot;
                    failures = 0;
                } else {
                    failures += 1;
                    if failures > 100 {
                        bail!("100 transfers in a row did not commit");
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
