//! The application: the router joining the command routes (`command_api::router`) and the
//! query routes (`query_api::router`) over the state both share, with the health and fallback
//! routes, the OpenAPI document, the limits and the panic catching; and the functions that serve
//! it (used by the `ledger` binary and by in-process integration tests). How a server is started
//! (`Serving`) is `startup.rs`.

use std::future::Future;

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::Router;
use edge::config::BODY_BYTES_MAX;
use edge::health;
use edge::routes::Routes;
use edge::state::AppState;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::startup::{Serving, Tasks};
use crate::wiring::{Assembled, Wiring};

/// Every route the application serves, listed (`edge::routes`): the REST routes among them are
/// the OpenAPI document's (`api_doc`'s tests compare the two); `/metrics` among them when
/// `serving` says so.
pub fn route_table(bulk_max: usize, serving: &Serving) -> Routes {
    let metrics = if serving.metrics_on_api {
        query_api::metrics::routes(serving.target_pending_alert_after())
    } else {
        Routes::new()
    };
    Routes::new()
        .api(Method::GET, "/healthz", health::healthz)
        .api(
            Method::GET,
            "/api/v1/openapi.json",
            crate::api_doc::openapi_json,
        )
        .merge(command_api::router(bulk_max))
        .merge(query_api::router())
        .merge(metrics)
}

/// The router with every route, the body limit, panic catching and request tracing;
/// `/metrics` among the routes when `serving` says so.
pub fn build_app(state: AppState, serving: &Serving) -> Router {
    route_table(state.ledger.bulk_max(), serving)
        .into_router()
        .fallback(health::not_found)
        .method_not_allowed_fallback(health::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(axum::middleware::from_fn_with_state(
            serving.http,
            edge::http_server::request_limits,
        ))
        .layer(CatchPanicLayer::custom(edge::error::panic_response))
        .layer(TraceLayer::new_for_http())
        .layer(axum::middleware::from_fn(crate::http_traces::request_span))
        .with_state(state)
}

/// Serves the API on `listener` until the process ends, as an in-process server does: the
/// default [`Serving`] (no recovery worker, no idempotency horizon, no relay; see `startup.rs`).
pub async fn serve_with(listener: tokio::net::TcpListener, wiring: Wiring) -> anyhow::Result<()> {
    let assembled = wiring.assemble();
    serve_with_shutdown(
        listener,
        assembled,
        Serving::default(),
        std::future::pending(),
    )
    .await
}

/// Serves the API on `listener` until `shutdown` completes, then lets requests in progress finish;
/// starts the background tasks `serving` names first and stops them after. A background task
/// that ends stops the server with an error.
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    assembled: Assembled,
    serving: Serving,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut tasks = Tasks::start(&assembled.pieces, &serving.background).await?;
    let app = build_app(assembled.state, &serving);
    let served = edge::http_server::serve(listener, app, serving.http, shutdown);
    let outcome = tokio::select! {
        served = served => served.map_err(anyhow::Error::from),
        name = tasks.first_exit() => Err(anyhow::anyhow!("background task {name} stopped")),
    };
    tasks.stop().await;
    outcome
}
