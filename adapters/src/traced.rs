//! The account systems' call spans (`docs/adr/0018-traces.md`): one per funding or spot-core
//! call a transfer makes, a child of the caller's span; spot-core continues it (the client
//! sends the span's traceparent along), and the funding batch that decided the movement links
//! it. Disabled, and free, unless traces are exported.

use domain::{Movement, Operation};

/// The span of a FUNDING call of `operation` for `movements` (one, or a bulk round's many).
pub(crate) fn funding_call(operation: Operation, movements: &[Movement]) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        target: telemetry::TARGET,
        "funding.call",
        otel.kind = "client",
        operation = operation.as_str(),
        req_id = first(movements),
        movements = movements.len()
    )
}

/// The span of a spot-core call of `operation` for `movements`.
pub(crate) fn spot_call(operation: Operation, movements: &[Movement]) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        target: telemetry::TARGET,
        "spot_core.call",
        otel.kind = "client",
        operation = operation.as_str(),
        req_id = first(movements),
        movements = movements.len()
    )
}

/// The first movement's req_id, recorded as a string (not formatted through `Debug` again).
fn first(movements: &[Movement]) -> String {
    movements
        .first()
        .map(|m| m.req_id.to_string())
        .unwrap_or_default()
}
