//! `ledger-bench traces`: what exporting traces costs the single-transfer route. The same
//! database, the same spot-core data and the same clients, run after run, alternating traces off
//! and on (ABAB...): off, the processes get no `OTEL_*` variable; on, both the ledger and
//! spot-core export every span (`OTEL_TRACES_SAMPLER=always_on`) over OTLP/HTTP to a small sink
//! this benchmark starts (it counts requests and bytes, and decodes nothing). Each run starts
//! both processes afresh (`abab.rs`, shared with `tlog`). Prints every run, the medians and their
//! ratio (target: on is at most 5% slower).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::bail;

use crate::abab::{Bench, Series};

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
    /// A first run, traces off, not counted (`abab::Bench::warm_up`).
    #[arg(long, default_value_t = 8)]
    pub(crate) warmup_seconds: u64,
    /// Each run's first seconds, driven and not counted, in both kinds of run
    /// (`abab::Bench::drive`).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) settle_seconds: f64,
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

pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    if args.pairs == 0 {
        bail!("--pairs must be above zero");
    }
    let mut bench = Bench::new(
        &args.server,
        &args.sslmode,
        "ledger_bench_traces",
        args.clients,
        args.seconds,
    )
    .await?;
    let (sink, received) = start_sink().await?;
    println!("clean database: {}; OTLP/HTTP sink on {sink}", bench.url);
    bench.warm_up(args.warmup_seconds, 1).await?;
    bench.settle(args.settle_seconds);
    let mut series = Series::default();
    for round in 0..args.pairs * 2 {
        let traced = round % 2 == 1;
        let env = if traced { otel_env(sink) } else { Vec::new() };
        let started = bench.start(&env)?;
        let before = received.requests.load(Ordering::Relaxed);
        let run = bench.drive(&started, 1).await?;
        drop(started);
        let label = if traced {
            "traces on (OTLP/HTTP, every span)"
        } else {
            "traces off"
        };
        run.print(&format!("run {} of {}: {label}", round + 1, args.pairs * 2));
        if traced {
            let exports = received.requests.load(Ordering::Relaxed) - before;
            println!("OTLP exports received:      {exports}");
        }
        series.push(traced, run.tps());
    }
    let title = format!("traces: single-transfer route, {} clients", args.clients);
    series.print(&title, "transfers/s");
    println!(
        "OTLP received in all:       {} requests, {:.1} MiB",
        received.requests.load(Ordering::Relaxed),
        received.bytes.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
    );
    let (off_median, on_median, slower) = series.medians();
    Ok(vec![format!(
        "traces ({} clients, {} s runs, ABAB x{}): off median {off_median:.0}/s, on median {on_median:.0}/s, on {slower:.1}% slower (target <= 5%)",
        args.clients, args.seconds, args.pairs
    )])
}
