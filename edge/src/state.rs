//! `AppState`, what every handler shares: the application core's commands (`Ledger`) and
//! queries (`Queries`), the read side's objects (`ReadSide`), the token keys and the read side's
//! admission. The binary's start-up builds it from the pieces it wired; nothing here holds a
//! pool or an adapter a handler could reach, and nothing says how the server is started.

use std::sync::Arc;

use application::{Ledger, Queries};
use axum::extract::FromRef;

use crate::admission::Admission;
use crate::auth::JwtKeys;
use crate::cluster::Cluster;
use crate::reads::ReadSide;

/// What every handler shares. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct AppState {
    /// The application core: every command a handler calls, and the reads of one transfer.
    pub ledger: Ledger,
    /// The core's reads: balances, each account system's records, alerts, checks, the halt.
    pub queries: Queries,
    /// The read models, the operators' views, the feed, the recovery listings, the relay.
    pub reads: ReadSide,
    /// The verifying side of the token secret (the `AuthUser` and `AdminUser` extractors).
    pub jwt: Arc<JwtKeys>,
    /// How much the read surfaces (GraphQL, the feed, the admin views) may hold at once.
    pub admission: Arc<Admission>,
    /// The cell's members under HA, their roles and the failovers observed (`cluster.rs`);
    /// start-up sets it over the cell's database and spot-core.
    pub cluster: Arc<Cluster>,
}

/// The extractors of `auth.rs` take the keys from any state that has them.
impl FromRef<AppState> for Arc<JwtKeys> {
    fn from_ref(state: &AppState) -> Self {
        state.jwt.clone()
    }
}

impl AppState {
    /// The state over the core and the read side the start-up wired, verifying tokens with
    /// `jwt_secret` (HS256).
    pub fn new(ledger: Ledger, queries: Queries, reads: ReadSide, jwt_secret: &[u8]) -> Self {
        Self {
            ledger,
            queries,
            reads,
            jwt: Arc::new(JwtKeys::new(jwt_secret)),
            admission: Arc::default(),
            cluster: Arc::new(Cluster::none()),
        }
    }
}
