//! The subscriber both binaries install: log lines to stderr as before (filtered by `RUST_LOG`,
//! default `info`, never showing the exported spans), and with an [`Export`] an OTLP pipeline
//! built explicitly from it: every value the libraries could take from the environment
//! (endpoint, protocol, timeout, sampler, resource, limits, batching) is given in code.
//!
//! The exporter runs on a small runtime of its own (one worker thread): the SDK's batch processor
//! exports from a plain thread, and both OTLP transports (tonic, hyper) need a tokio reactor.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter as OtlpExporter, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
    SpanLimits,
};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::settings::{Export, Protocol, Sampling};
use crate::TARGET;

/// Links one span may carry: a shared step's span links every request it served (spot-core's
/// WAL batch takes at most 4,096 requests; the event store's, 512 commits).
const LINKS_PER_SPAN_MAX: u32 = 4096;
/// Finished spans waiting to be sent; beyond it new ones are dropped (and counted by the SDK).
const QUEUE_SPANS_MAX: usize = 65_536;
/// Spans per export call.
const EXPORT_BATCH_SPANS_MAX: usize = 2048;

/// Keeps the OTLP pipeline alive; dropping it sends what is queued and stops the exporter.
#[derive(Debug)]
pub struct Guard {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        crate::set_enabled(false);
        if let Err(e) = self.provider.shutdown() {
            eprintln!("OpenTelemetry: flushing the last spans failed: {e}");
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Installs the process's subscriber; with `export`, spans of [`TARGET`] go to the collector
/// and the returned [`Guard`] must live as long as the process serves. A second call (an engine
/// run in-process) leaves the first subscriber in place.
pub fn init(export: Option<&Export>) -> Result<Option<Guard>, String> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(format!("{TARGET}=off").parse().expect("a valid directive"));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let Some(export) = export else {
        let _ = tracing_subscriber::registry().with(log).try_init();
        return Ok(None);
    };
    let (provider, runtime) = pipeline(export)?;
    let tracer = provider.tracer("ledger");
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        // A span's parent is the current `tracing` span, and contexts are read from spans
        // (`span_context`); nothing here reads OpenTelemetry's own current context. Activating
        // one on every enter (an async span is entered at each poll) cost a thread-local stack
        // push and a context clone per poll for nothing (`docs/perf-log.md`, traces).
        .with_context_activation(false)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
    if tracing_subscriber::registry()
        .with(log)
        .with(spans)
        .try_init()
        .is_ok()
    {
        crate::set_enabled(true);
    }
    tracing::info!(
        endpoint = %export.endpoint,
        protocol = export.protocol.as_str(),
        service = %export.service_name,
        "exporting traces over OTLP"
    );
    Ok(Some(Guard {
        provider,
        runtime: Some(runtime),
    }))
}

fn pipeline(export: &Export) -> Result<(SdkTracerProvider, tokio::runtime::Runtime), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the OTLP exporter's runtime: {e}"))?;
    // tonic's lazy channel spawns its worker on the runtime it is built in.
    let exporter = {
        let _entered = runtime.enter();
        let built = match export.protocol {
            Protocol::Grpc => OtlpExporter::builder()
                .with_tonic()
                .with_endpoint(export.endpoint.clone())
                .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                .with_timeout(export.timeout)
                .build(),
            Protocol::HttpProtobuf => OtlpExporter::builder()
                .with_http()
                .with_endpoint(export.endpoint.clone())
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(export.timeout)
                .build(),
        };
        built.map_err(|e| format!("building the OTLP exporter for {}: {e}", export.endpoint))?
    };
    let exporter = OnRuntime {
        inner: exporter,
        runtime: runtime.handle().clone(),
    };
    let batching = BatchConfigBuilder::default()
        .with_max_queue_size(QUEUE_SPANS_MAX)
        .with_max_export_batch_size(EXPORT_BATCH_SPANS_MAX)
        .with_scheduled_delay(export.schedule_delay)
        .build();
    let limits = SpanLimits {
        max_links_per_span: LINKS_PER_SPAN_MAX,
        ..SpanLimits::default()
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(
            BatchSpanProcessor::builder(exporter)
                .with_batch_config(batching)
                .build(),
        )
        .with_sampler(sampler(&export.sampling))
        .with_span_limits(limits)
        .with_resource(
            Resource::builder_empty()
                .with_service_name(export.service_name.clone())
                .build(),
        )
        .build();
    Ok((provider, runtime))
}

fn sampler(sampling: &Sampling) -> Sampler {
    match sampling {
        Sampling::AlwaysOn => Sampler::AlwaysOn,
        Sampling::AlwaysOff => Sampler::AlwaysOff,
        Sampling::Ratio(ratio) => Sampler::TraceIdRatioBased(*ratio),
        Sampling::ParentBased(inner) => Sampler::ParentBased(Box::new(sampler(inner))),
    }
}

/// The OTLP exporter, its calls run on the exporter's own runtime: the batch processor calls
/// from its plain thread, where no reactor is.
#[derive(Debug)]
struct OnRuntime {
    inner: OtlpExporter,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.runtime.block_on(self.inner.export(batch))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
