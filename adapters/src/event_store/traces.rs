//! The event store's part in traces (`docs/adr/0018-traces.md`): a span per append (a child of
//! the caller's, linked from the group commit that wrote it), and each traced transfer's first
//! trace, kept in its creation's metadata (the event's envelope, outside the tamper-evident
//! log's leaf; earlier versions wrote a row of `transfer_traces`). Nothing here does any work
//! unless traces are exported.

use std::collections::HashMap;

use cqrs_es::persist::SerializedEvent;
use serde_json::Value;

/// Whether `e` creates a transfer (its first event).
fn creates(e: &SerializedEvent) -> bool {
    e.sequence == 1 && e.event_type == "TransferCreated"
}

/// The span of one caller's append (one commit, or a bulk request's many).
pub(super) fn append_span<'a>(
    mut events: impl Iterator<Item = &'a SerializedEvent>,
) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    let Some(first) = events.next() else {
        return tracing::Span::none();
    };
    tracing::info_span!(
        target: telemetry::TARGET,
        "event_store.append",
        req_id = first.aggregate_id.as_str(),
        sequence = first.sequence,
        event_type = first.event_type.as_str(),
        events = 1 + events.count()
    )
}

/// The current span's traceparent, when these events create a transfer and its trace is
/// sampled: the transfer's first trace.
pub(super) fn creation_trace<'a>(
    mut events: impl Iterator<Item = &'a SerializedEvent>,
) -> Option<String> {
    if !telemetry::enabled() || !events.any(creates) {
        return None;
    }
    telemetry::current()
        .filter(|c| c.is_sampled())
        .map(|c| telemetry::traceparent(&c))
}

/// The metadata key of a traced creation's first trace (a W3C traceparent).
use eventlog::TRACE_METADATA_KEY;

/// The metadata of each traced creation in a batch, keyed by (req_id, sequence): its commit's
/// metadata with the job's first trace added under [`TRACE_METADATA_KEY`]. Empty (and nothing
/// allocated) when no job carries a trace, which is always the case when traces are not exported.
pub(super) fn traced_metadata<'a>(
    commits: &[(&'static str, &'a [SerializedEvent], Option<&'a str>)],
) -> HashMap<(&'a str, usize), Value> {
    let mut traced = HashMap::new();
    for (_, events, trace) in commits {
        let Some(trace) = trace else { continue };
        for e in events.iter().filter(|e| creates(e)) {
            let mut metadata = e.metadata.clone();
            if let Value::Object(fields) = &mut metadata {
                fields.insert(
                    TRACE_METADATA_KEY.into(),
                    Value::String((*trace).to_owned()),
                );
                traced.insert((e.aggregate_id.as_str(), e.sequence), metadata);
            }
        }
    }
    traced
}

/// The transfer's first trace (a W3C traceparent), if any: for the admin timeline and the
/// recovery worker's link. Kept in its creation's metadata; transfers created by earlier versions
/// kept it in `transfer_traces` (`eventlog::transfers::first_trace` reads both).
pub async fn first_trace(pool: &sqlx::PgPool, req_id: &str) -> Result<Option<String>, sqlx::Error> {
    eventlog::transfers::first_trace(pool, req_id).await
}
