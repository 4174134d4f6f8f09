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
    /// Keep what the sink receives and, after the runs, print the spans and links per HTTP
    /// request by service and span name (decoded after the runs, never during one).
    #[arg(long)]
    pub(crate) span_census: bool,
}

/// What the sink received.
#[derive(Debug, Default)]
struct Received {
    requests: AtomicU64,
    bytes: AtomicU64,
    /// The bodies, kept for `--span-census`.
    kept: Option<std::sync::Mutex<Vec<axum::body::Bytes>>>,
}

/// An OTLP/HTTP sink on a free loopback port: answers every `POST /v1/traces` 200 with an empty
/// `ExportTraceServiceResponse` (an empty protobuf message is zero bytes).
async fn start_sink(keep: bool) -> anyhow::Result<(SocketAddr, Arc<Received>)> {
    let received = Arc::new(Received {
        kept: keep.then(Default::default),
        ..Received::default()
    });
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
                if let Some(kept) = &counted.kept {
                    kept.lock().unwrap_or_else(|e| e.into_inner()).push(body);
                }
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
    let (sink, received) = start_sink(args.span_census).await?;
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
    if let Some(kept) = &received.kept {
        print_census(&kept.lock().unwrap_or_else(|e| e.into_inner()))?;
    }
    let (off_median, on_median, slower) = series.medians();
    Ok(vec![format!(
        "traces ({} clients, {} s runs, ABAB x{}): off median {off_median:.0}/s, on median {on_median:.0}/s, on {slower:.1}% slower (target <= 5%)",
        args.clients, args.seconds, args.pairs
    )])
}

/// Spans and links per HTTP request (the ledger's `http.request` spans), by service and name.
fn print_census(bodies: &[axum::body::Bytes]) -> anyhow::Result<()> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let mut by_name: std::collections::BTreeMap<(String, String), (u64, u64)> =
        std::collections::BTreeMap::new();
    for body in bodies {
        let request = ExportTraceServiceRequest::decode(body.as_ref())?;
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for span in resource.scope_spans.iter().flat_map(|s| &s.spans) {
                let entry = by_name
                    .entry((service.clone(), span.name.clone()))
                    .or_default();
                entry.0 += 1;
                entry.1 += span.links.len() as u64;
            }
        }
    }
    let requests = by_name
        .iter()
        .filter(|((_, name), _)| name.starts_with("POST "))
        .map(|(_, (n, _))| n)
        .sum::<u64>()
        .max(1) as f64;
    println!("spans per POST request ({requests} requests), by service and name:");
    for ((service, name), (spans, links)) in &by_name {
        println!(
            "  {:<40} {:<32} {:>8.3} spans {:>8.3} links",
            service,
            name,
            *spans as f64 / requests,
            *links as f64 / requests
        );
    }
    Ok(())
}
