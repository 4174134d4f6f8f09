//! The HTTP edge's span (`docs/adr/0018-traces.md`): every request, when traces are exported,
//! gets a server span `http.request` that continues the client's W3C `traceparent` when it sends
//! one (and starts a trace when it does not); everything the request does below (the event
//! appends, the funding and spot-core calls) is its child. Without an exporter this is one
//! branch per request.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The middleware (outermost layer of `router::build_app`).
pub async fn request_span(request: Request, next: Next) -> Response {
    if !telemetry::enabled() {
        return next.run(request).await;
    }
    let route = request.extensions().get::<MatchedPath>().map_or_else(
        || request.uri().path().to_owned(),
        |m| m.as_str().to_owned(),
    );
    let span = tracing::info_span!(
        target: telemetry::TARGET,
        parent: None,
        "http.request",
        otel.name = format!("{} {route}", request.method()),
        otel.kind = "server",
        http.request.method = request.method().as_str(),
        http.route = route.as_str(),
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(parent) = request
        .headers()
        .get(telemetry::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(telemetry::parse_traceparent)
    {
        telemetry::set_remote_parent(&span, parent);
    }
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}
