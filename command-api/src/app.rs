//! The application: shared state, the router with its limits and fallbacks, and the functions that
//! serve it (used by the `ledger` binary and by in-process integration tests).

use std::any::Any;
use std::future::Future;
use std::sync::{Arc, RwLock};

use adapters::{FundingLedger, SpotAdapter};
use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use domain::{AccountPort, AssetConfig, AssetRegistry, ErrorCode};
use recovery::{Coordinator, Sweeper};
use sqlx::PgPool;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::auth::JwtKeys;
use crate::config::BODY_BYTES_MAX;
use crate::error::ApiError;
use crate::routes;

/// What every handler shares. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct AppState {
    pub coordinator: Coordinator,
    pub funding: FundingLedger,
    pub spot: SpotAdapter,
    /// The same registry the coordinator validates against.
    pub assets: Arc<RwLock<AssetRegistry>>,
    pub jwt: Arc<JwtKeys>,
    /// Requests per second per user (this process); the daily limits live in the coordinator.
    pub rate: Arc<crate::ratelimit::RateLimiter>,
    /// This process's short-lived copy of the MON-003 halt flag.
    pub halt: Arc<crate::invariant::HaltCache>,
    /// How much the read surfaces (GraphQL, the feed) may hold at once.
    pub admission: Arc<crate::admission::Admission>,
    /// The HTTP server's timeouts and connection caps.
    pub http: crate::http_server::HttpLimits,
}

impl AppState {
    /// Wires the funding ledger over `pool`, the spot adapter and the asset list into a
    /// coordinator, and keeps `jwt_secret` for verifying tokens (HS256).
    pub fn new(pool: PgPool, spot: SpotAdapter, assets: AssetRegistry, jwt_secret: &[u8]) -> Self {
        let assets = Arc::new(RwLock::new(assets));
        let funding = FundingLedger::new(pool.clone()).with_assets(assets.clone());
        let coordinator = Coordinator::new(
            pool,
            Arc::new(funding.clone()) as Arc<dyn AccountPort>,
            Arc::new(spot.clone()) as Arc<dyn AccountPort>,
            assets.clone(),
        );
        Self {
            coordinator,
            funding,
            spot,
            assets,
            jwt: Arc::new(JwtKeys::new(jwt_secret)),
            rate: Arc::new(crate::ratelimit::RateLimiter::new(None)),
            halt: Arc::new(crate::invariant::HaltCache::default()),
            admission: Arc::default(),
            http: crate::http_server::HttpLimits::default(),
        }
    }

    /// Applies rate limits: per second here, daily counts and amounts in the coordinator.
    /// `new` starts without limits; the `ledger` commands apply the configured ones.
    pub fn with_limits(mut self, limits: crate::ratelimit::LimitsConfig) -> Self {
        self.rate = Arc::new(crate::ratelimit::RateLimiter::new(
            limits.requests_per_second,
        ));
        self.coordinator = self.coordinator.with_daily_limits(limits.daily);
        self
    }

    /// Serves with these HTTP timeouts and connection caps instead of the defaults.
    pub fn with_http_limits(mut self, http: crate::http_server::HttpLimits) -> Self {
        self.http = http;
        self
    }

    /// One asset's configuration, copied out so no lock is held across an await.
    pub fn asset(&self, symbol: &str) -> Result<AssetConfig, ErrorCode> {
        // A poisoned lock only means a writer panicked mid-update of a plain map; the map itself
        // is still whole, so reading on is safe.
        let registry = self.assets.read().unwrap_or_else(|e| e.into_inner());
        registry.get(symbol).cloned()
    }
}

/// The router with every route, the body limit, panic catching and request tracing.
pub fn build_app(state: AppState) -> Router {
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
        .merge(crate::metrics::routes())
        .merge(crate::admin_recovery::routes())
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

/// Serves the API on `listener` until the process ends. Does not run the sweeper (see
/// [`spawn_sweeper`]).
pub async fn serve_with(listener: tokio::net::TcpListener, state: AppState) -> anyhow::Result<()> {
    serve_with_shutdown(listener, state, std::future::pending()).await
}

/// Serves the API on `listener` until `shutdown` completes, then lets requests in progress finish.
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Admin asset changes stored by any instance are laid over the file's defaults before the
    // first request, then kept current while serving.
    crate::admin_assets::load_persisted(&state).await?;
    let reloader = crate::admin_assets::spawn_reloader(state.clone());
    // The projector and the periodic fund-conservation check run while this process serves.
    let read_side = crate::feed::spawn_read_side(&state);
    let limits = state.http;
    let served = crate::http_server::serve(listener, build_app(state), limits, shutdown).await;
    reloader.abort();
    drop(read_side);
    served?;
    Ok(())
}

/// Runs the sweeper (resumes transfers left open) in the background until the handle is aborted.
pub fn spawn_sweeper(coordinator: Coordinator) -> tokio::task::JoinHandle<()> {
    tokio::spawn(Sweeper::new(coordinator).run())
}
