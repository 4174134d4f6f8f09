//! OpenTelemetry traces for the ledger and spot-core (`docs/adr/0018-traces.md`).
//!
//! - `settings.rs`: the `OTEL_*` values as each binary's command line read them ([`OtelVars`]),
//!   checked into an [`Export`] (or none: nothing is exported).
//! - `export.rs`: the subscriber both binaries install ([`init`]): their log lines as before, and
//!   with an [`Export`] an OTLP pipeline built explicitly from it (gRPC or HTTP/protobuf).
//! - this file: the spans' target and the helpers the instrumented crates use: the current span's
//!   context, a W3C `traceparent` written and read, a remote parent, links.
//!
//! Spans meant for export are made with `target: telemetry::TARGET`. The log output never shows
//! them, and without an exporter no layer wants them: `tracing` then disables their call sites,
//! and making one costs a load and a branch (no allocation, no clock read). [`enabled`] says
//! whether an exporter is installed, for the few places that would otherwise do work (a
//! traceparent formatted, a row written) for nothing.

mod export;
mod settings;

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use export::{init, Guard};
pub use opentelemetry::trace::SpanContext;
pub use settings::{Export, OtelVars, Protocol, Sampling};

/// The target of every span meant for export (and of nothing else).
pub const TARGET: &str = "otel_span";

/// The W3C header (and spot-core protocol field) that carries a trace context.
pub const TRACEPARENT: &str = "traceparent";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether this process exports traces (an OTLP pipeline is installed).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// The OpenTelemetry context of `span`, when traces are exported and the span is recorded.
pub fn span_context(span: &Span) -> Option<SpanContext> {
    if !enabled() || span.is_disabled() {
        return None;
    }
    let context = span.context().span().span_context().clone();
    context.is_valid().then_some(context)
}

/// The context of the current span (see [`span_context`]).
pub fn current() -> Option<SpanContext> {
    span_context(&Span::current())
}

/// The W3C `traceparent` of `context` (version 00).
pub fn traceparent(context: &SpanContext) -> String {
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

/// The `traceparent` of the current span, when there is one to carry.
pub fn current_traceparent() -> Option<String> {
    current().map(|c| traceparent(&c))
}

/// One header's value, as the propagator reads a carrier.
struct OneHeader<'a>(&'a str);

impl Extractor for OneHeader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

/// The remote span context a W3C `traceparent` names; `None` when it does not parse (W3C:
/// a malformed traceparent is ignored, and a new trace is started).
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let context = TraceContextPropagator::new().extract(&OneHeader(text.trim()));
    let remote = context.span().span_context().clone();
    remote.is_valid().then_some(remote)
}

/// Makes `span` a child of the remote `parent` (from a `traceparent`). Call it before the span
/// is entered.
pub fn set_remote_parent(span: &Span, parent: SpanContext) {
    if span.is_disabled() {
        return;
    }
    let _ = span.set_parent(Context::new().with_remote_span_context(parent));
}

/// Links `span` to each of `to` (a shared step to the requests it served).
pub fn link_all(span: &Span, to: impl IntoIterator<Item = SpanContext>) {
    if span.is_disabled() {
        return;
    }
    for context in to {
        span.add_link(context);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_back_as_written() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse_traceparent(text).unwrap();
        assert!(context.is_remote());
        assert!(context.is_sampled());
        assert_eq!(traceparent(&context), text);
        assert!(
            parse_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none()
        );
        assert!(parse_traceparent("garbage").is_none());
        assert!(parse_traceparent("").is_none());
    }

    #[test]
    fn without_an_exporter_there_is_no_context() {
        let span = tracing::info_span!(target: TARGET, "nothing");
        assert!(span_context(&span).is_none());
        assert!(current_traceparent().is_none());
    }
}
