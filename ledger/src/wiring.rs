//! The core wired over the pool and the spot adapter start-up made: the funding ledger, the
//! coordinator (its limits, fail points and idempotency retention), the application front door
//! (`application::Ledger`), its queries (`application::Queries`) and the read side's objects
//! (`edge::reads::ReadSide`), gathered into the handlers' `AppState`; and the pieces the
//! background tasks run over ([`Pieces`]), the same ones. Only start-up holds the pool and the
//! adapters; the handlers get commands and queries.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use adapters::{FundingLedger, SpotAdapter};
use application::alerts::{FrequencyConfig, WatchedGate};
use application::{Coordinator, FailPoints, Ledger, Queries};
use domain::{AccountPort, AssetRegistry};
use edge::ratelimit::{LimitsConfig, RateLimiter};
use edge::reads::ReadSide;
use edge::state::AppState;
use sqlx::PgPool;

/// How the core is to be wired; [`Wiring::assemble`] builds it. Defaults: no limits, no fail
/// point, the coordinator's own idempotency retention and the default bulk maximum.
#[derive(Clone)]
pub struct Wiring {
    pool: PgPool,
    spot: SpotAdapter,
    assets: AssetRegistry,
    jwt_secret: Vec<u8>,
    limits: Option<(LimitsConfig, FrequencyConfig)>,
    failpoints: Option<FailPoints>,
    retention: Option<Duration>,
    bulk_max: usize,
    funding_apart: bool,
}

/// What the background tasks run over: the same pool, adapter, coordinator and front door the
/// handlers' state was built from.
#[derive(Clone)]
pub struct Pieces {
    pub pool: PgPool,
    pub spot: SpotAdapter,
    pub coordinator: Coordinator,
    pub ledger: Ledger,
    /// The cell's HA view, the handlers' too: its failover recorder runs as a background task.
    pub cluster: Arc<edge::cluster::Cluster>,
}

/// The handlers' state and the background tasks' pieces.
#[derive(Clone)]
pub struct Assembled {
    pub state: AppState,
    pub pieces: Pieces,
}

impl Wiring {
    /// The core over `pool`, the spot adapter and the asset list, verifying tokens with
    /// `jwt_secret` (HS256).
    pub fn new(pool: PgPool, spot: SpotAdapter, assets: AssetRegistry, jwt_secret: &[u8]) -> Self {
        Self {
            pool,
            spot,
            assets,
            jwt_secret: jwt_secret.to_vec(),
            limits: None,
            failpoints: None,
            retention: None,
            bulk_max: application::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT,
            funding_apart: false,
        }
    }

    /// Applies rate limits (per second in this process, daily counts and amounts in
    /// PostgreSQL), with MON-004 watching at its default thresholds.
    pub fn with_limits(self, limits: LimitsConfig) -> Self {
        self.with_watched_limits(limits, FrequencyConfig::default())
    }

    /// Applies rate limits, with MON-004 (a user's abnormal request frequency) watching every
    /// request the per-second gate sees (`application::alerts::WatchedGate`).
    pub fn with_watched_limits(mut self, limits: LimitsConfig, frequency: FrequencyConfig) -> Self {
        self.limits = Some((limits, frequency));
        self
    }

    /// Arms a crash-test fail point.
    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Self {
        self.failpoints = Some(failpoints);
        self
    }

    /// The idempotency horizon's retention, for re-keying old orphan client-key claims.
    pub fn with_idempotency_retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// FUNDING's calls in transactions of their own, apart from their events (ADR 0024's
    /// "before"). With a fail point armed they are apart anyway: the crash tests' points are
    /// the separate steps' (CRA-002/003 for a FUNDING source).
    pub fn with_funding_apart(mut self, apart: bool) -> Self {
        self.funding_apart = apart;
        self
    }

    /// The most transfers one bulk request may carry.
    pub fn with_bulk_max(mut self, transfers_max: usize) -> Self {
        self.bulk_max = transfers_max;
        self
    }

    /// Builds the core once: the handlers' state and the background tasks' pieces share it.
    /// Its HA view knows no database URL ([`Assembled::with_cluster`] gives it one).
    pub fn assemble(self) -> Assembled {
        let pool = self.pool;
        let registry = Arc::new(RwLock::new(self.assets));
        let funding = Arc::new(FundingLedger::new(pool.clone()).with_assets(registry.clone()));
        let spot = Arc::new(self.spot.clone());
        let stores = adapters::pg::stores(pool.clone());
        let armed = self.failpoints.as_ref().is_some_and(FailPoints::any_armed);
        let ports = match self.funding_apart || armed {
            true => adapters::pg::ports(pool.clone()),
            // FUNDING is this cell's database: its calls are made with their events (ADR 0024).
            false => adapters::pg::ports_with_funding(pool.clone(), FundingLedger::clone(&funding)),
        };
        let mut coordinator = Coordinator::with_ports(
            ports,
            funding.clone() as Arc<dyn AccountPort>,
            spot.clone() as Arc<dyn AccountPort>,
            registry.clone(),
        );
        if let Some(retention) = self.retention {
            coordinator = coordinator.with_idempotency_retention(retention);
        }
        if let Some(failpoints) = self.failpoints {
            coordinator = coordinator.with_failpoints(failpoints);
        }
        let gate = self.limits.map(|(limits, frequency)| {
            let rate = Arc::new(RateLimiter::new(limits.requests_per_second));
            coordinator = coordinator.clone().with_daily_limits(limits.daily.clone());
            (
                WatchedGate::new(rate, frequency, stores.alerts.clone()),
                limits.daily,
            )
        });
        let mut ledger = Ledger::from_parts(
            coordinator.clone(),
            stores.clone(),
            funding.clone(),
            spot.clone(),
            registry,
        )
        .with_bulk_max(self.bulk_max);
        if let Some((gate, daily)) = gate {
            ledger = ledger.with_limits(Arc::new(gate), daily);
        }
        let queries = Queries::new(stores, funding, spot);
        let reads = read_side(&pool);
        let state = AppState::new(ledger.clone(), queries, reads, &self.jwt_secret);
        Assembled {
            pieces: Pieces {
                pool,
                spot: self.spot,
                coordinator,
                ledger,
                cluster: state.cluster.clone(),
            },
            state,
        }
    }
}

/// The read side over `pool`: each read port (`application::reads`) implemented by the crate
/// that owns its tables, so the handlers read through ports and hold no pool.
pub fn read_side(pool: &PgPool) -> ReadSide {
    ReadSide::new(application::reads::Reads {
        transfers: Arc::new(projections::TransferView::new(pool.clone())),
        admin: Arc::new(projections::admin::AdminView::new(pool.clone())),
        feed: Arc::new(projections::PgFeed::new(pool.clone())),
        log: Arc::new(tlog_follower::LogReads::new(pool.clone())),
        receipts: Arc::new(adapters::pg::receipts::Receipts::new(pool.clone())),
        recovery: Arc::new(recovery::PgRecoveryReads::new(pool.clone())),
        traces: Arc::new(adapters::pg::traces::PgTraces::new(pool.clone())),
        relay: Arc::new(relay::PgRelayReads::new(pool.clone())),
    })
}

impl Assembled {
    /// The same core with the HA view of the cell at `database_url` (its pool and spot-core
    /// client are the core's), for the handlers and the failover recorder alike.
    pub fn with_cluster(mut self, database_url: &str) -> Self {
        let cluster = Arc::new(edge::cluster::Cluster::new(
            database_url,
            Arc::new(adapters::pg::failovers::PgFailovers::new(
                self.pieces.pool.clone(),
            )),
            self.pieces.spot.tcp_client().cloned(),
        ));
        self.state.cluster = cluster.clone();
        self.pieces.cluster = cluster;
        self
    }
}
