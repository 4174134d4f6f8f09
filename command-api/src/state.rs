//! `AppState`, what every handler shares: the application core, the read models, the token
//! keys and the read side's admission. Nothing here says how the server is started (background
//! tasks, HTTP limits, where `/metrics` is served): that is `startup::Serving`, read once by the
//! code that starts a server. Handlers import this module, never the router (`app.rs`).

use std::sync::Arc;

use adapters::SpotAdapter;
use application::alerts::{FrequencyConfig, WatchedGate};
use application::{FailPoints, Ledger};
use axum::extract::FromRef;
use domain::AssetRegistry;
use projections::TransferView;
use sqlx::PgPool;

use crate::admission::Admission;
use crate::auth::JwtKeys;
use crate::ratelimit::{LimitsConfig, RateLimiter};

/// What every handler shares. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct AppState {
    /// The application core: every command a handler calls.
    pub(crate) ledger: Ledger,
    /// The transfer read models (history, in-flight sums, counts by state).
    pub(crate) view: TransferView,
    /// The verifying side of the token secret (the `AuthUser` and `AdminUser` extractors).
    pub(crate) jwt: Arc<JwtKeys>,
    /// How much the read surfaces (GraphQL, the feed) may hold at once.
    pub(crate) admission: Arc<Admission>,
}

/// The extractors of `auth.rs` take the keys from any state that has them.
impl FromRef<AppState> for Arc<JwtKeys> {
    fn from_ref(state: &AppState) -> Self {
        state.jwt.clone()
    }
}

impl AppState {
    /// Wires the application core over `pool`, the spot adapter and the asset list, and keeps
    /// `jwt_secret` for verifying tokens (HS256). No limits: the `ledger` commands apply their
    /// settings.
    pub fn new(pool: PgPool, spot: SpotAdapter, assets: AssetRegistry, jwt_secret: &[u8]) -> Self {
        Self {
            view: TransferView::new(pool.clone()),
            ledger: Ledger::new(pool, spot, assets),
            jwt: Arc::new(JwtKeys::new(jwt_secret)),
            admission: Arc::default(),
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

    /// Arms a crash-test fail point.
    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Self {
        self.ledger = self.ledger.with_failpoints(failpoints);
        self
    }
}
