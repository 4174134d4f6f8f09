//! One trace per transfer across both systems (issue 37, `docs/adr/0018-traces.md`): an OTLP
//! receiver written for the test (the TraceService over gRPC, `POST /v1/traces` with a protobuf
//! body over HTTP) takes the spans of a real `ledger serve` and a real spot-core, each configured
//! only by the standard `OTEL_*` variables, over each transport in turn.
//!
//! - One transfer sent with a W3C `traceparent`: its trace holds the request, each event append,
//!   the funding call and the spot-core call, and inside spot-core (service `spot-core`) the
//!   request and its WAL append, each with the right parent.
//! - The shared steps (the event store's group commit, the funding batch, spot-core's WAL sync)
//!   are spans of their own, linked to each request they served.
//! - The console's timeline names the trace id.
//! - A transfer left in TARGET_PENDING by a fail point is resumed by a new process's recovery
//!   worker: the attempt's span is linked to the transfer's first trace, and its spot-core call
//!   (spot-core's spans too) is in the attempt's trace.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use domain::{ReqId, TransferState};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

use crate::helpers::{dec, token, SpotProcess, Stack, TestDb};
use crate::procs::{wait_terminal, LedgerProcess, RECOVER_NOW};

/// The HTTP edge's span of a transfer request (named as OpenTelemetry's HTTP conventions say:
/// the method and the route).
const REQUEST_SPAN: &str = "POST /api/v1/internal_transfer";

/// One span as received, with the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    span: Span,
}

/// Everything the receiver took, over either transport.
#[derive(Debug, Clone, Default)]
struct Sink(Arc<Mutex<Vec<Got>>>);

impl Sink {
    fn take(&self, request: ExportTraceServiceRequest) {
        let mut got = self.0.lock().unwrap();
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    Value::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    got.push(Got {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// `POST /v1/traces` (OTLP/HTTP, `application/x-protobuf`).
async fn http_traces(
    axum::extract::State(sink): axum::extract::State<Sink>,
    body: Bytes,
) -> impl axum::response::IntoResponse {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            sink.take(request);
            let answer = ExportTraceServiceResponse {
                partial_success: None,
            };
            (
                axum::http::StatusCode::OK,
                [("content-type", "application/x-protobuf")],
                answer.encode_to_vec(),
            )
        }
        Err(_) => (
            axum::http::StatusCode::BAD_REQUEST,
            [("content-type", "text/plain")],
            b"not an ExportTraceServiceRequest".to_vec(),
        ),
    }
}

/// The receiver: both transports on free loopback ports, one sink.
struct Receiver {
    sink: Sink,
    grpc: SocketAddr,
    http: SocketAddr,
}

impl Receiver {
    async fn start() -> Self {
        let sink = Sink::default();
        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = grpc_listener.local_addr().unwrap();
        let service = TraceServiceServer::new(sink.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc_listener))
                .await
                .expect("the gRPC receiver");
        });
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = http_listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(http_traces))
            .with_state(sink.clone());
        tokio::spawn(async move {
            axum::serve(http_listener, app)
                .await
                .expect("the HTTP receiver");
        });
        Self { sink, grpc, http }
    }

    /// The standard variables that point a process at this receiver over `protocol`.
    fn env(&self, protocol: &str) -> Vec<(&'static str, String)> {
        let endpoint = match protocol {
            "grpc" => format!("http://{}", self.grpc),
            _ => format!("http://{}", self.http),
        };
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_owned()),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_on".to_owned()),
            // Sent within 100 ms, so the test waits little.
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ]
    }

    /// Waits until `ready` holds of the spans received, and returns them.
    async fn wait_for(&self, what: &str, ready: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.sink.spans();
            if ready(&spans) {
                return spans;
            }
            if Instant::now() > deadline {
                let names: Vec<_> = spans
                    .iter()
                    .map(|g| format!("{}:{} {}", g.service, g.span.name, hex(&g.span.trace_id)))
                    .collect();
                panic!("never received {what}; got {names:#?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(bytes: usize) -> String {
    let id = ulid::Ulid::new().to_bytes();
    hex(&id[16 - bytes..])
}

/// The spans of `trace` (hex) named `name` from `service`.
fn named<'a>(spans: &'a [Got], trace: &str, service: &str, name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|g| g.service == service && g.span.name == name && hex(&g.span.trace_id) == trace)
        .map(|g| &g.span)
        .collect()
}

/// The one span of `trace` named `name` from `service`.
fn one<'a>(spans: &'a [Got], trace: &str, service: &str, name: &str) -> &'a Span {
    let found = named(spans, trace, service, name);
    assert_eq!(found.len(), 1, "one {service} span {name} in trace {trace}");
    found[0]
}

/// Whether some span named `name` from `service` (in a trace of its own) links `to`.
fn linked_from<'a>(spans: &'a [Got], service: &str, name: &str, to: &Span) -> Option<&'a Span> {
    spans
        .iter()
        .filter(|g| g.service == service && g.span.name == name)
        .map(|g| &g.span)
        .find(|s| {
            s.links
                .iter()
                .any(|l| l.trace_id == to.trace_id && l.span_id == to.span_id)
        })
}

/// What one happy transfer's trace holds once both services sent everything.
fn transfer_traced(spans: &[Got], trace: &str) -> bool {
    let has = |service, name, at_least| named(spans, trace, service, name).len() >= at_least;
    has("ledger", REQUEST_SPAN, 1)
        && has("ledger", "funding.call", 1)
        && has(
            "ledger",
            "event_store.append",
            if funded_path(spans, trace) { 2 } else { 3 },
        )
        && has("ledger", "spot_core.call", 1)
        && has("spot-core", "wal.append", 1)
        && named(spans, trace, "ledger", "event_store.append")
            .iter()
            .all(|a| linked_from(spans, "ledger", "event_store.group_commit", a).is_some())
        && named(spans, trace, "ledger", "funding.call")
            .iter()
            .all(|c| {
                linked_from(spans, "ledger", "funding.batch", c).is_some()
                    || funded_path(spans, trace)
            })
        && named(spans, trace, "ledger", "spot_core.call")
            .iter()
            .all(|c| linked_from(spans, "spot-core", "wal.sync", c).is_some())
}

/// Whether the transfer took ADR 0024's path: its FUNDING call made in its creation's write,
/// with no funding batch of its own.
fn funded_path(spans: &[Got], trace: &str) -> bool {
    named(spans, trace, "ledger", "funding.call")
        .iter()
        .all(|c| linked_from(spans, "ledger", "funding.batch", c).is_none())
}

/// Parents and links of a committed FUNDING→SPOT transfer's trace, continued from `parent`.
fn check_transfer_trace(spans: &[Got], trace: &str, parent: &str) {
    let request = one(spans, trace, "ledger", REQUEST_SPAN);
    assert_eq!(hex(&request.parent_span_id), parent, "the client's span");
    let appends = named(spans, trace, "ledger", "event_store.append");
    // ADR 0024: the creation's commit makes FUNDING's withdraw and records it, so a happy
    // FUNDING→SPOT transfer commits twice (three times on the separate steps).
    let funded = funded_path(spans, trace);
    assert_eq!(
        appends.len(),
        if funded { 2 } else { 3 },
        "event commits per happy transfer"
    );
    let funding = one(spans, trace, "ledger", "funding.call");
    let spot_call = one(spans, trace, "ledger", "spot_core.call");
    for child in appends.iter().copied().chain([funding, spot_call]) {
        assert_eq!(child.parent_span_id, request.span_id, "{}", child.name);
    }
    let wal = one(spans, trace, "spot-core", "wal.append");
    assert_eq!(wal.parent_span_id, spot_call.span_id, "across the protocol");
    // The shared steps: spans of their own (another trace, no parent), linked to the requests
    // they served.
    let shared = appends
        .iter()
        .map(|a| ("ledger", "event_store.group_commit", *a))
        .chain(
            [
                // On the funded path the group commit decided FUNDING's movement, and links the
                // append that carried it (above); on the separate steps the funding batch did.
                (!funded).then_some(("ledger", "funding.batch", funding)),
                Some(("spot-core", "wal.sync", spot_call)),
            ]
            .into_iter()
            .flatten(),
        );
    for (service, name, served) in shared {
        let step = linked_from(spans, service, name, served)
            .unwrap_or_else(|| panic!("{name} links {}", served.name));
        assert!(step.parent_span_id.is_empty(), "{name} is a root");
        assert_ne!(hex(&step.trace_id), trace, "{name} has its own trace");
    }
}

async fn post_transfer(base: &str, traceparent: &str) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{base}/api/v1/internal_transfer"))
        .bearer_auth(token(1, false))
        .header("traceparent", traceparent)
        .json(&json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "10"}))
        .send()
        .await
}

async fn one_trace_across_both_systems(protocol: &str) {
    let receiver = Receiver::start().await;
    let env_owned = receiver.env(protocol);
    let env: Vec<(&str, &str)> = env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let spot = SpotProcess::start_with_env(&env);
    let s = Stack::over(TestDb::new().await, spot);
    s.deposit(1, "USDT", "100").await;

    // A transfer whose client sent its own trace context.
    let mut serving_env = env.clone();
    serving_env.push(("LEDGER_RECOVERY_STALE_MS", "3600000"));
    let ledger = LedgerProcess::start(&s.db.url, &s.spot, &serving_env);
    let trace = random_hex(16);
    let parent = random_hex(8);
    let answer: serde_json::Value = post_transfer(&ledger.base, &format!("00-{trace}-{parent}-01"))
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON");
    assert_eq!(answer["state"], "COMMITTED", "{answer}");
    let req_id = answer["req_id"].as_str().expect("req_id").to_owned();
    let spans = receiver
        .wait_for("the transfer's trace", |s| transfer_traced(s, &trace))
        .await;
    check_transfer_trace(&spans, &trace, &parent);

    // The console's timeline names the trace.
    let timeline: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/api/v1/admin/transfers/{req_id}", ledger.base))
        .bearer_auth(token(900, true))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(timeline["trace_id"], trace.as_str(), "{timeline}");
    drop(ledger);

    recovery_links_the_first_trace(&receiver, &s, &env).await;
    assert_eq!(s.funding_balance(1, "USDT").await, dec("80"));
    assert_eq!(s.spot_balance(1, "USDT").await, dec("20"));
    s.assert_conserved(1, "USDT").await;
}

/// A transfer stopped in TARGET_PENDING by a fail point (its process aborts before the deposit)
/// is resumed by another process's recovery worker, in a trace linked to the first one.
async fn recovery_links_the_first_trace(receiver: &Receiver, s: &Stack, env: &[(&str, &str)]) {
    let mut crashing_env = env.to_vec();
    crashing_env.extend([
        ("LEDGER_FAILPOINT", "target_pending_before_call"),
        ("LEDGER_ALLOW_FAILPOINTS", "1"),
        ("LEDGER_RECOVERY_STALE_MS", "3600000"),
    ]);
    let mut crashing = LedgerProcess::start(&s.db.url, &s.spot, &crashing_env);
    let first_trace = random_hex(16);
    let sent = post_transfer(
        &crashing.base,
        &format!("00-{first_trace}-{}-01", random_hex(8)),
    )
    .await;
    assert!(sent.is_err(), "the process dies mid-request: {sent:?}");
    assert!(!crashing.wait_exit(Duration::from_secs(15)).success());
    let req_id: String = sqlx::query_scalar(
        "SELECT aggregate_id FROM events WHERE aggregate_type = 'Transfer' AND sequence = 1
           AND metadata->>'traceparent' LIKE '00-' || $1 || '-%'",
    )
    .bind(&first_trace)
    .fetch_one(&s.db.pool)
    .await
    .expect("the first trace is kept with the creation");
    let req_id = ReqId::parse(&req_id).unwrap();
    assert_eq!(
        crate::procs::state_of(s, &req_id).await,
        TransferState::TargetPending
    );

    let mut recovering_env = env.to_vec();
    recovering_env.extend(RECOVER_NOW);
    let _recovering = LedgerProcess::start(&s.db.url, &s.spot, &recovering_env);
    let done = wait_terminal(s, &req_id, Duration::from_secs(30)).await;
    assert_eq!(done.state, TransferState::Committed);
    let attempt_of = |spans: &[Got]| -> Option<Span> {
        spans
            .iter()
            .filter(|g| g.service == "ledger" && g.span.name == "recovery.attempt")
            .map(|g| g.span.clone())
            .find(|a| a.links.iter().any(|l| hex(&l.trace_id) == first_trace))
    };
    let spans = receiver
        .wait_for("the recovery attempt and its calls", |spans| {
            attempt_of(spans).is_some_and(|a| {
                let trace = hex(&a.trace_id);
                !named(spans, &trace, "ledger", "spot_core.call").is_empty()
                    && !named(spans, &trace, "spot-core", "wal.append").is_empty()
            })
        })
        .await;
    let attempt = attempt_of(&spans).unwrap();
    let trace = hex(&attempt.trace_id);
    assert_ne!(trace, first_trace, "the attempt has a trace of its own");
    assert!(attempt.parent_span_id.is_empty());
    let call = one(&spans, &trace, "ledger", "spot_core.call");
    assert_eq!(call.parent_span_id, attempt.span_id);
    let engine = one(&spans, &trace, "spot-core", "wal.append");
    assert_eq!(engine.parent_span_id, call.span_id);
}

/// An engine of protocol version 1 as its clients see it: a proxy in front of a real one that
/// answers `hello` with a bare `ok` (no version), as engines before version 2 did, and refuses
/// any request carrying `trace` with BAD_REQUEST, as their `deny_unknown_fields` did (counted in
/// the returned counter). Every other line goes to the real engine on a connection of its own,
/// authenticated with `token`, and its answer comes back.
async fn version_one_engine(
    upstream: String,
    token: String,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counted = refused.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, token, refused) = (upstream.clone(), token.clone(), counted.clone());
            tokio::spawn(async move {
                let engine = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let mut engine = BufReader::new(engine);
                let hello = format!("{}\n", json!({"op": "hello", "token": token}));
                engine.get_mut().write_all(hello.as_bytes()).await.unwrap();
                let mut answer = String::new();
                engine.read_line(&mut answer).await.unwrap();
                let (read, mut write) = client.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let request: serde_json::Value = serde_json::from_str(&line).unwrap();
                    let reply = if request["op"] == "hello" {
                        r#"{"status":"ok"}"#.to_owned()
                    } else if request.get("trace").is_some() {
                        refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        r#"{"status":"error","code":"BAD_REQUEST","message":"invalid request: unknown field `trace`"}"#.to_owned()
                    } else {
                        engine
                            .get_mut()
                            .write_all(format!("{line}\n").as_bytes())
                            .await
                            .unwrap();
                        answer.clear();
                        engine.read_line(&mut answer).await.unwrap();
                        answer.trim_end().to_owned()
                    };
                    if write
                        .write_all(format!("{reply}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, refused)
}

/// A ledger exporting traces, in front of an engine that announces no protocol version, sends
/// it no trace context: its transfers work, untraced inside the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_engine_keeps_working_untraced() {
    let receiver = Receiver::start().await;
    let env_owned = receiver.env("grpc");
    let env: Vec<(&str, &str)> = env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let spot = SpotProcess::start_with_env(&env);
    let s = Stack::over(TestDb::new().await, spot);
    s.deposit(1, "USDT", "100").await;
    let (old, refused) = version_one_engine(s.spot.addr.clone(), s.spot.token.clone()).await;
    let ledger = LedgerProcess::start_at(&s.db.url, &old.to_string(), &s.spot.token, &env);
    let trace = random_hex(16);
    let answer: serde_json::Value =
        post_transfer(&ledger.base, &format!("00-{trace}-{}-01", random_hex(8)))
            .await
            .expect("an answer")
            .json()
            .await
            .expect("JSON");
    assert_eq!(answer["state"], "COMMITTED", "{answer}");
    let spans = receiver
        .wait_for("the ledger's side of the trace", |s| {
            !named(s, &trace, "ledger", "spot_core.call").is_empty()
        })
        .await;
    assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(named(&spans, &trace, "spot-core", "wal.append").is_empty());
    assert_eq!(s.spot_balance(1, "USDT").await, dec("10"));
    s.assert_conserved(1, "USDT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn traces_over_grpc() {
    one_trace_across_both_systems("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn traces_over_http_protobuf() {
    one_trace_across_both_systems("http/protobuf").await;
}
