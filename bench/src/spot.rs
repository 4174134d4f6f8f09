//! spot-core alone: durable operations per second in-process (straight into the engine's commit
//! thread) and over TCP (a real spot-core process), and resident memory per million accounts.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rust_decimal::Decimal;
use spot_core::protocol::{Request, Response};
use spot_core::SpotClient;

use crate::procstat;
use crate::transfers::{bin, spawn_ready};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Concurrent submitters (each has one operation in flight, so this bounds batch size).
    #[arg(long, default_value_t = 1024)]
    clients: usize,
    /// How long each throughput phase runs.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Accounts to create for the memory figure.
    #[arg(long, default_value_t = 1_000_000)]
    accounts: u64,
    /// Connections of the pipelined network phase; the `clients` operations in flight are
    /// spread over them (the protocol lets a client pipeline; answers come back in order).
    #[arg(long, default_value_t = 16)]
    pipelined_connections: usize,
}

fn ok(response: &Response) -> bool {
    matches!(response, Response::Applied { .. })
}

// long: one measurement read top to bottom (engine, load, restart, figures); a figures tool.
pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    let tmp = std::env::temp_dir().join(format!("spot-bench-{}", ulid::Ulid::new()));

    // In-process: requests go straight to the commit thread; each is durable before it answers.
    let (engine, wal) =
        spot_core::open_engine(spot_core::assets::Assets::builtin(), &tmp.join("inproc"))?;
    let (handle, thread) =
        spot_core::wal::spawn_committer(engine, wal, spot_core::storage::FailPoints::default())?;
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let handle = handle.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let r = handle
                    .call(Request::deposit(
                        ulid::Ulid::new().to_string(),
                        1 + c as u64,
                        "USDT",
                        Decimal::ONE,
                    ))
                    .await;
                if r.as_ref().is_some_and(ok) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let inproc = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    drop(handle);
    thread.join().ok();

    // Over the network: a real spot-core process, one connection per client.
    let mut cmd = Command::new(bin("spot-core")?);
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.join("net"));
    let (proc_, addr) = spawn_ready(cmd, "spot-core listening on ")?;
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let client = SpotClient::new(addr.clone(), Duration::from_secs(10));
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let r = client
                    .call(&Request::deposit(
                        ulid::Ulid::new().to_string(),
                        1 + c as u64,
                        "USDT",
                        Decimal::ONE,
                    ))
                    .await;
                if r.as_ref().is_ok_and(ok) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let net = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();

    // Over the network, pipelined: the same number of operations in flight, over a few
    // connections, each sending a window of requests in one write and reading their answers.
    let connections = args.pipelined_connections.clamp(1, args.clients.max(1));
    let window = (args.clients / connections).max(1);
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let addr = addr.clone();
        tasks.push(tokio::spawn(pipelined(addr, c, window, deadline)));
    }
    let mut applied = 0u64;
    for t in tasks {
        applied += t.await??;
    }
    let piped = applied as f64 / started.elapsed().as_secs_f64();

    drop(proc_);

    // Memory per million accounts: a fresh spot-core process (the phases above leave memory its
    // allocator keeps for reuse, which would hide the accounts' own), `accounts` new accounts
    // (one deposit each, so each also leaves one remembered req_id), and the process's resident
    // memory before and after.
    let mut cmd = Command::new(bin("spot-core")?);
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.join("memory"));
    let (proc_, addr) = spawn_ready(cmd, "spot-core listening on ")?;
    let pid = proc_.child.id();
    let before = procstat::rss(pid);
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let client = SpotClient::new(addr.clone(), Duration::from_secs(10));
        let next = next.clone();
        let total = args.accounts;
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return Ok::<(), anyhow::Error>(());
                }
                let r = client
                    .call(&Request::deposit(
                        ulid::Ulid::new().to_string(),
                        1_000_000 + n,
                        "BTC",
                        Decimal::ONE,
                    ))
                    .await?;
                if !ok(&r) {
                    bail!("deposit refused: {r:?}");
                }
            }
        }));
    }
    for t in tasks {
        t.await?.context("account creation")?;
    }
    let after = procstat::rss(pid);
    let per_million = (after.saturating_sub(before)) as f64 * 1_000_000.0 / args.accounts as f64;
    drop(proc_);
    std::fs::remove_dir_all(&tmp).ok();

    println!(
        "== spot-core ({} concurrent submitters, {} s per phase) ==",
        args.clients, args.seconds
    );
    println!("durable ops/s in-process:   {inproc:.0}");
    println!("durable ops/s over TCP:     {net:.0} (one connection per submitter, one operation in flight on each)");
    println!(
        "durable ops/s over TCP, pipelined: {piped:.0} ({connections} connections, {window} operations in flight on each)"
    );
    println!(
        "memory per million accounts: {:.1} MiB (RSS {:.1} -> {:.1} MiB for {} accounts, each with one remembered req_id)",
        procstat::mib(per_million as u64),
        procstat::mib(before),
        procstat::mib(after),
        args.accounts
    );
    Ok(vec![format!(
        "spot-core: {inproc:.0} durable ops/s in-process, over TCP {net:.0} (a connection per submitter) and {piped:.0} pipelined (target >= 100,000); {:.1} MiB per million accounts",
        procstat::mib(per_million as u64)
    )])
}

/// One pipelined connection until `deadline`: writes `window` deposits in one write, reads their
/// `window` answers (in request order, as the protocol promises), and repeats. Returns how many
/// were applied; any other answer is an error.
async fn pipelined(
    addr: String,
    c: usize,
    window: usize,
    deadline: Instant,
) -> anyhow::Result<u64> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let mut out = Vec::with_capacity(window * 160);
    let mut line = String::new();
    let mut applied = 0u64;
    while Instant::now() < deadline {
        out.clear();
        for _ in 0..window {
            let request = Request::deposit(
                ulid::Ulid::new().to_string(),
                1 + c as u64,
                "USDT",
                Decimal::ONE,
            );
            serde_json::to_writer(&mut out, &request)?;
            out.push(b'\n');
        }
        wr.write_all(&out).await?;
        for _ in 0..window {
            line.clear();
            if rd.read_line(&mut line).await? == 0 {
                bail!("spot-core closed the connection");
            }
            let response: Response = serde_json::from_str(&line)?;
            if !ok(&response) {
                bail!("deposit refused: {response:?}");
            }
            applied += 1;
        }
    }
    Ok(applied)
}
