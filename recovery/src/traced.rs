//! A recovery attempt's span (`docs/adr/0018-traces.md`), when traces are exported: a trace of
//! its own (the request that created the transfer is long gone), linked to the transfer's first
//! trace (`RetryBook::first_trace`), so one leads to the other. The attempt's calls (the
//! lookups, the retried movement, the events it appends) are its children.

use domain::{ReqId, TransferState};

use crate::book::RetryBook;

/// The attempt's span; disabled (and nothing read) unless traces are exported.
pub(crate) async fn attempt_span(
    book: &dyn RetryBook,
    req_id: &ReqId,
    state: TransferState,
    worker: &str,
) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: telemetry::TARGET,
        parent: None,
        "recovery.attempt",
        req_id = %req_id,
        state = state.as_str(),
        worker = %worker
    );
    let first = book.first_trace(req_id).await;
    telemetry::link_all(
        &span,
        first.as_deref().and_then(telemetry::parse_traceparent),
    );
    span
}
