//! The event store's part in traces (`docs/adr/0018-traces.md`): a span per append (a child of
//! the caller's, linked from the group commit that wrote it), and each traced transfer's first
//! trace, kept in `transfer_traces` by the statement that appends its creation (migration 0024),
//! never in the event itself. Nothing here does any work unless traces are exported.

use cqrs_es::persist::SerializedEvent;

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
        req_id = %first.aggregate_id,
        sequence = first.sequence,
        event_type = %first.event_type,
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

/// The first traces a batch writes: one per traced creation.
#[derive(Default)]
pub(super) struct FirstTraces<'a> {
    pub req_ids: Vec<&'a str>,
    pub traceparents: Vec<&'a str>,
}

impl<'a> FirstTraces<'a> {
    /// From a batch's commits: (aggregate type, events, the job's first trace).
    pub fn of(commits: &[(&'static str, &'a [SerializedEvent], Option<&'a str>)]) -> Self {
        let mut traces = Self::default();
        for (_, events, trace) in commits {
            let Some(trace) = trace else { continue };
            for e in events.iter().filter(|e| creates(e)) {
                traces.req_ids.push(e.aggregate_id.as_str());
                traces.traceparents.push(trace);
            }
        }
        traces
    }

    pub fn is_empty(&self) -> bool {
        self.req_ids.is_empty()
    }
}

/// The transfer's first trace, as `transfer_traces` keeps it (a W3C traceparent), if any: for the
/// admin timeline and the recovery worker's link.
pub async fn first_trace(pool: &sqlx::PgPool, req_id: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT traceparent FROM transfer_traces WHERE req_id = $1")
        .bind(req_id)
        .fetch_optional(pool)
        .await
}
