//! The application: shared state, the router with its limits and fallbacks, and the functions that
//! serve it (used by the `ledger` binary and by in-process integration tests).

use std::any::Any;
use std::future::Future;
use std::sync::Arc;

use adapters::SpotAdapter;
use application::alerts::{FrequencyConfig, WatchedGate};
use application::{FailPoints, Ledger, RateGate};
use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use domain::{AssetRegistry, ErrorCode, UserId};
use projections::TransferView;
use sqlx::PgPool;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::auth::JwtKeys;
use crate::config::BODY_BYTES_MAX;
use crate::error::ApiError;
use crate::ratelimit::{LimitsConfig, RateLimiter};
use crate::routes;
use crate::startup::{Background, Tasks};

/// What every handler shares. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct AppState {
    /// The application core: every command a handler calls.
    pub ledger: Ledger,
    /// The transfer read models (history, in-flight sums, counts by state).
    pub view: TransferView,
    pub jwt: Arc<JwtKeys>,
    /// How much the read surfaces (GraphQL, the feed) may hold at once.
    pub admission: Arc<crate::admission::Admission>,
    /// The HTTP server's timeouts and connection caps.
    pub http: crate::http_server::HttpLimits,
    /// The GraphQL schema, built once.
    pub graphql: crate::graphql::LedgerSchema,
    /// The background work `serve_with_shutdown` starts (see `startup.rs`).
    pub background: Background,
    /// Whether `/metrics` is served on the API's own address (in-process servers); the `ledger`
    /// binary serves it on `--metrics-listen` instead unless told `api`.
    pub metrics_on_api: bool,
}

/// The per-second limiter is the core's rate gate.
impl RateGate for RateLimiter {
    fn admit(&self, user: UserId) -> Result<(), ErrorCode> {
        self.check(user)
    }
}

impl AppState {
    /// Wires the application core over `pool`, the spot adapter and the asset list, and keeps
    /// `jwt_secret` for verifying tokens (HS256). No limits, no recovery worker, the default
    /// audit interval: the `ledger` commands apply their settings.
    pub fn new(pool: PgPool, spot: SpotAdapter, assets: AssetRegistry, jwt_secret: &[u8]) -> Self {
        Self {
            view: TransferView::new(pool.clone()),
            ledger: Ledger::new(pool, spot, assets),
            jwt: Arc::new(JwtKeys::new(jwt_secret)),
            admission: Arc::default(),
            http: crate::http_server::HttpLimits::default(),
            graphql: crate::graphql::schema(),
            background: Background::default(),
            metrics_on_api: true,
        }
    }

    /// Applies rate limits: per second in this process, daily counts and amounts in PostgreSQL;
    /// MON-004 watches the requests with its default thresholds.
    pub fn with_limits(self, limits: LimitsConfig) -> Self {
        self.with_watched_limits(limits, FrequencyConfig::default())
    }

    /// Applies rate limits, with MON-004 (a user's abnormal request frequency) watching every
    /// request the per-second gate sees (`application::alerts::WatchedGate`).
    pub fn with_watched_limits(mut self, limits: LimitsConfig, frequency: FrequencyConfig) -> Self {
        let rate = Arc::new(RateLimiter::new(limits.requests_per_second));
        let gate = WatchedGate::new(rate, frequency, self.ledger.pool().clone());
        self.ledger = self.ledger.with_limits(Arc::new(gate), limits.daily);
        self
    }

    /// Serves `/metrics` on the API's address (`true`) or only where the caller serves
    /// `crate::metrics::app` (`false`).
    pub fn with_metrics_on_api(mut self, on_api: bool) -> Self {
        self.metrics_on_api = on_api;
        self
    }

    /// Serves with these HTTP timeouts and connection caps instead of the defaults.
    pub fn with_http_limits(mut self, http: crate::http_server::HttpLimits) -> Self {
        self.http = http;
        self
    }

    /// Arms a crash-test fail point.
    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Self {
        self.ledger = self.ledger.with_failpoints(failpoints);
        self
    }

    /// Relays the feed to JetStream while serving, when `relay` is given.
    pub fn with_relay(mut self, relay: Option<relay::RelayConfig>) -> Self {
        self.background.relay = relay;
        self
    }

    /// The background work to run while serving.
    pub fn with_background(mut self, background: Background) -> Self {
        self.background = background;
        self
    }
}

/// The router with every route, the body limit, panic catching and request tracing.
pub fn build_app(state: AppState) -> Router {
    let metrics = if state.metrics_on_api {
        crate::metrics::routes()
    } else {
        Router::new()
    };
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/api/v1/internal_transfer", post(routes::create_transfer))
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
        .merge(
            crate::feed::routes()
                .merge(crate::invariant::routes())
                .merge(crate::graphql::routes()),
        )
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(axum::middleware::from_fn_with_state(
            state.http,
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

/// Serves the API on `listener` until the process ends, with the background work `state` is
/// configured for (see `startup.rs`).
pub async fn serve_with(listener: tokio::net::TcpListener, state: AppState) -> anyhow::Result<()> {
    serve_with_shutdown(listener, state, std::future::pending()).await
}

/// Serves the API on `listener` until `shutdown` completes, then lets requests in progress finish;
/// starts the background tasks first and stops them after. A background task that ends stops the
/// server with an error.
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut tasks = Tasks::start(&state).await?;
    let limits = state.http;
    let served = crate::http_server::serve(listener, build_app(state), limits, shutdown);
    let outcome = tokio::select! {
        served = served => served.map_err(anyhow::Error::from),
        name = tasks.first_exit() => Err(anyhow::anyhow!("background task {name} stopped")),
    };
    tasks.stop().await;
    outcome
}
