//! The application: the router with its limits and fallbacks, and the functions that serve it
//! (used by the `ledger` binary and by in-process integration tests). The state its handlers
//! share is `state.rs`; how a server is started (`Serving`) is `startup.rs`.

use std::any::Any;
use std::future::Future;

use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::config::BODY_BYTES_MAX;
use crate::error::ApiError;
use crate::routes;
use crate::startup::{Serving, Tasks};
use crate::state::AppState;

/// The router with every route, the body limit, panic catching and request tracing;
/// `/metrics` among the routes when `serving` says so.
pub fn build_app(state: AppState, serving: &Serving) -> Router {
    let metrics = if serving.metrics_on_api {
        crate::metrics::routes(serving.target_pending_alert_after())
    } else {
        Router::new()
    };
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/api/v1/internal_transfer", post(routes::create_transfer))
        .merge(crate::bulk::routes(state.ledger.bulk_max()))
        .route(
            "/api/v1/internal_transfer/{req_id}",
            get(routes::get_transfer),
        )
        .route("/api/v1/balances", get(routes::balances))
        .route("/api/v1/admin/deposits", post(routes::admin_deposit))
        .route(
            "/api/v1/admin/accounts/{user_id}/{account_type}/status",
            put(routes::admin_set_status),
        )
        .merge(crate::admin_assets::routes())
        .merge(crate::openapi::routes())
        .merge(metrics)
        .merge(crate::admin_alerts::routes())
        .merge(crate::admin_recovery::routes())
        .merge(crate::console::routes())
        .merge(crate::admin_views::routes())
        .merge(crate::admin_repairs::routes())
        .merge(crate::log_routes::routes())
        .merge(
            crate::feed::routes()
                .merge(crate::invariant::routes())
                .merge(crate::graphql::routes()),
        )
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(axum::middleware::from_fn_with_state(
            serving.http,
            crate::http_server::request_limits,
        ))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// A handler panic still answers in the error shape; the panic text goes to the log only.
fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("non-text panic");
    ApiError::Internal(format!("handler panicked: {detail}")).into_response()
}

/// Serves the API on `listener` until the process ends, as an in-process server does: the
/// default [`Serving`] (no recovery worker, no idempotency horizon, no relay; see `startup.rs`).
pub async fn serve_with(listener: tokio::net::TcpListener, state: AppState) -> anyhow::Result<()> {
    serve_with_shutdown(listener, state, Serving::default(), std::future::pending()).await
}

/// Serves the API on `listener` until `shutdown` completes, then lets requests in progress finish;
/// starts the background tasks `serving` names first and stops them after. A background task
/// that ends stops the server with an error.
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    state: AppState,
    serving: Serving,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut tasks = Tasks::start(&state.ledger, &serving.background).await?;
    let app = build_app(state, &serving);
    let served = crate::http_server::serve(listener, app, serving.http, shutdown);
    let outcome = tokio::select! {
        served = served => served.map_err(anyhow::Error::from),
        name = tasks.first_exit() => Err(anyhow::anyhow!("background task {name} stopped")),
    };
    tasks.stop().await;
    outcome
}
