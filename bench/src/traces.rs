//! `ledger-bench traces`: what exporting traces costs the single-transfer route. The same
//! database, the same spot-core data and the same clients, run after run, alternating traces off
//! and on (ABAB...): off, the processes get no `OTEL_*` variable; on, both the ledger and
//! spot-core export every span (`OTEL_TRACES_SAMPLER=always_on`) over OTLP/HTTP to a small sink
//! this benchmark starts (it counts requests and bytes, and decodes nothing). Each run starts
//! both processes afresh. Prints every run, the medians and their ratio (target: on is at most
//! 5% slower).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use domain::UserId;
use serde_json::json;

use crate::clients::{drive, Pids};
use crate::transfers::{bin, serve_command, spawn_ready, Proc, SECRET};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Concurrent HTTP clients, each moving its own user's money back and forth.
    #[arg(long, default_value_t = 32)]
    pub(crate) clients: usize,
    /// Runs of each kind (off, on), alternating: 3 makes off, on, off, on, off, on.
    #[arg(long, default_value_t = 3)]
    pub(crate) pairs: usize,
    /// How long to drive transfers, per run.
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// A first run, traces off, not counted: a fresh database's first seconds run at a third of
    /// the rate (no statistics yet, cold caches), which would otherwise land in "off".
    #[arg(long, default_value_t = 8)]
    pub(crate) warmup_seconds: u64,
    /// The PostgreSQL server; the benchmark makes its own database `ledger_bench_traces` there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub(crate) server: String,
    /// libpq's sslmode for the ledger's connections.
    #[arg(long, default_value = "prefer")]
    pub(crate) sslmode: String,
}

/// What the sink received.
#[derive(Debug, Default)]
struct Received {
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// An OTLP/HTTP sink on a free loopback port: answers every `POST /v1/traces` 200 with an empty
/// `ExportTraceServiceResponse` (an empty protobuf message is zero bytes).
async fn start_sink() -> anyhow::Result<(SocketAddr, Arc<Received>)> {
    let received = Arc::new(Received::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let counted = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let counted = counted.clone();
            async move {
                counted.requests.fetch_add(1, Ordering::Relaxed);
                counted
                    .bytes
                    .fetch_add(body.len() as u64, Ordering::Relaxed);
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, received))
}

/// The variables that turn export on, for both processes.
fn otel_env(sink: SocketAddr) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{sink}")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
        ("OTEL_TRACES_SAMPLER", "always_on".to_owned()),
    ]
}

/// spot-core on `data` and `ledger serve` on `url`, with `env` added to both.
fn start(url: &str, data: &Path, env: &[(&str, String)]) -> anyhow::Result<(Proc, Proc, String)> {
    let mut spot_cmd = Command::new(bin("spot-core")?);
    spot_cmd
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data);
    for (k, v) in env {
        spot_cmd.env(k, v);
    }
    let (spot, spot_addr) = spawn_ready(spot_cmd, "spot-core listening on ")?;
    let mut ledger_cmd = serve_command(url, &spot_addr)?;
    for (k, v) in env {
        ledger_cmd.env(k, v);
    }
    let (ledger, serving) = spawn_ready(ledger_cmd, "ledger serving on ")?;
    let base = serving
        .split_whitespace()
        .next()
        .context("address")?
        .to_owned();
    Ok((spot, ledger, base))
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    match rates.len() {
        0 => 0.0,
        n if n % 2 == 1 => rates[n / 2],
        n => (rates[n / 2 - 1] + rates[n / 2]) / 2.0,
    }
}

// long: one measurement read top to bottom (set-up, the alternating runs, the figures).
pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    if args.clients == 0 || args.pairs == 0 {
        bail!("--clients and --pairs must be above zero");
    }
    let url = format!(
        "{}/ledger_bench_traces?sslmode={}",
        args.server, args.sslmode
    );
    {
        use sqlx::ConnectOptions;
        let admin = url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .context("parse server URL")?
            .database("postgres");
        let mut conn = admin.connect().await.context("connect to PostgreSQL")?;
        sqlx::query("DROP DATABASE IF EXISTS ledger_bench_traces WITH (FORCE)")
            .execute(&mut conn)
            .await?;
    }
    let pool = schema::prepare(&url, 2).await?;
    drop(pool);
    let data: PathBuf =
        std::env::temp_dir().join(format!("ledger-bench-traces-{}", ulid::Ulid::new()));
    let (sink, received) = start_sink().await?;
    println!("clean database: {url}; OTLP/HTTP sink on {sink}");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients * 2)
        .build()?;
    let tokens: Vec<Vec<String>> = (0..args.clients)
        .map(|c| {
            let user = UserId::new(1000 + c as u64).expect("valid user id");
            vec![edge::mint(
                SECRET.as_bytes(),
                user,
                false,
                Duration::from_secs(3600),
            )]
        })
        .collect();
    let mut off = Vec::new();
    let mut on = Vec::new();
    {
        let (spot, ledger, base) = start(&url, &data.join("spot"), &[])?;
        seed(&http, &base, args.clients).await?;
        if args.warmup_seconds > 0 {
            let pids = Pids {
                ledger: Some(ledger.child.id()),
                spot: Some(spot.child.id()),
            };
            let secs = Duration::from_secs(args.warmup_seconds);
            let run = drive(&http, &base, tokens.clone(), secs, pids).await?;
            run.print("warm-up (traces off, not counted)");
        }
    }
    for round in 0..args.pairs * 2 {
        let traced = round % 2 == 1;
        let env = if traced { otel_env(sink) } else { Vec::new() };
        let (spot, ledger, base) = start(&url, &data.join("spot"), &env)?;
        let pids = Pids {
            ledger: Some(ledger.child.id()),
            spot: Some(spot.child.id()),
        };
        let before = received.requests.load(Ordering::Relaxed);
        let run = drive(
            &http,
            &base,
            tokens.clone(),
            Duration::from_secs(args.seconds),
            pids,
        )
        .await?;
        drop(ledger);
        drop(spot);
        let label = if traced {
            "traces on (OTLP/HTTP, every span)"
        } else {
            "traces off"
        };
        run.print(&format!("run {} of {}: {label}", round + 1, args.pairs * 2));
        if traced {
            let exports = received.requests.load(Ordering::Relaxed) - before;
            println!("OTLP exports received:      {exports}");
            on.push(run.tps());
        } else {
            off.push(run.tps());
        }
    }
    std::fs::remove_dir_all(&data).ok();
    let (off_median, on_median) = (median(off.clone()), median(on.clone()));
    let slower = (1.0 - on_median / off_median.max(1e-9)) * 100.0;
    let fmt = |rates: &[f64]| {
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!();
    println!(
        "== traces: single-transfer route, {} clients ==",
        args.clients
    );
    println!(
        "off transfers/s:            {} (median {off_median:.0})",
        fmt(&off)
    );
    println!(
        "on transfers/s:             {} (median {on_median:.0})",
        fmt(&on)
    );
    println!(
        "OTLP received in all:       {} requests, {:.1} MiB",
        received.requests.load(Ordering::Relaxed),
        received.bytes.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
    );
    // Each pair's own ratio (its two runs side by side in time), a check on drift across the
    // session that the medians alone would hide.
    let pairs: Vec<f64> = off
        .iter()
        .zip(&on)
        .map(|(off, on)| (1.0 - on / off.max(1e-9)) * 100.0)
        .collect();
    println!(
        "each pair, on slower by %:  {} (median {:.1})",
        pairs
            .iter()
            .map(|p| format!("{p:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        median(pairs.clone())
    );
    println!("on is {slower:.1}% slower (target <= 5%)");
    Ok(vec![format!(
        "traces ({} clients, {} s runs, ABAB x{}): off median {off_median:.0}/s, on median {on_median:.0}/s, on {slower:.1}% slower (target <= 5%)",
        args.clients, args.seconds, args.pairs
    )])
}

/// Money for every client's user, through the admin deposit route.
async fn seed(http: &reqwest::Client, base: &str, clients: usize) -> anyhow::Result<()> {
    let admin = edge::mint(
        SECRET.as_bytes(),
        UserId::new(1).unwrap(),
        true,
        Duration::from_secs(3600),
    );
    for c in 0..clients {
        let user = 1000 + c as u64;
        let r = http
            .post(format!("{base}/api/v1/admin/deposits"))
            .bearer_auth(&admin)
            .json(&json!({"user_id": user, "asset": "USDT", "amount": "1000000", "external_id": format!("bench-traces-seed-{user}")}))
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("seed deposit failed: {}", r.text().await?);
        }
    }
    Ok(())
}
