//! The application's front door: one value holding the coordinator, the account systems, the
//! asset settings and the gates, with every command an edge calls. Built once from explicit
//! arguments (the edge's settings); it starts no background task (the edge's start-up runs the
//! periodic ones). The commands are grouped in its modules: transfer requests (`requests.rs`),
//! the conservation check (`checks.rs`), the admin's account commands (`accounts.rs`); the halt
//! and the event log's reads are here.

pub mod accounts;
pub mod checks;
pub mod requests;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use domain::{AccountPort, AssetRegistry, ErrorCode, ReqId, UserId};

use crate::assets::AssetSettings;
use crate::audit;
use crate::audit::history::AuditHistory;
use crate::books::{FundingBook, SpotBook};
use crate::coordinator::{Coordinator, Ports};
use crate::daily::DailyLimits;
use crate::error::StoreError;
use crate::failpoint::FailPoints;
use crate::halt::HaltCache;
use crate::stores::{
    AlertLog, AssetStore, EventReads, HaltFlag, LogError, LoggedEvent, OpenTransfers, RepairRecords,
};

/// The per-second limit on transfer requests, kept by the edge (in this process's memory).
pub trait RateGate: Send + Sync {
    /// Counts one request of `user` now; RATE_LIMIT_EXCEEDED past the limit.
    fn admit(&self, user: UserId) -> Result<(), ErrorCode>;
}

/// No per-second limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unlimited;

impl RateGate for Unlimited {
    fn admit(&self, _user: UserId) -> Result<(), ErrorCode> {
        Ok(())
    }
}

/// One of each record port (`stores.rs`, and the conservation check's own): what `Ledger` and
/// `Queries` are wired with. `adapters::pg::stores(pool)` makes PostgreSQL's,
/// `testkit::MemRecords::stores` the in-memory ones.
#[derive(Clone)]
pub struct Stores {
    pub halt: Arc<dyn HaltFlag>,
    pub alerts: Arc<dyn AlertLog>,
    pub assets: Arc<dyn AssetStore>,
    pub events: Arc<dyn EventReads>,
    pub checkpoints: Arc<dyn audit::Checkpoints>,
    pub history: Arc<dyn AuditHistory>,
    pub open: Arc<dyn OpenTransfers>,
    pub repairs: Arc<dyn RepairRecords>,
}

/// The application. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct Ledger {
    pub(crate) coordinator: Coordinator,
    pub(crate) funding: Arc<dyn FundingBook>,
    pub(crate) spot: Arc<dyn SpotBook>,
    pub(crate) stores: Stores,
    assets: AssetSettings,
    halt: Arc<HaltCache>,
    rate: Arc<dyn RateGate>,
    /// The most transfers one bulk request may carry.
    bulk_max: usize,
}

impl Ledger {
    /// Wires a coordinator over `ports` and the two account systems, with the core's records
    /// in `stores` and the asset list (every check's registry). No limits until
    /// [`Ledger::with_limits`]. `adapters::pg::ledger` wires PostgreSQL's.
    pub fn new(
        ports: Ports,
        stores: Stores,
        funding: Arc<dyn FundingBook>,
        spot: Arc<dyn SpotBook>,
        registry: Arc<RwLock<AssetRegistry>>,
    ) -> Self {
        let coordinator = Coordinator::with_ports(
            ports,
            funding.clone() as Arc<dyn AccountPort>,
            spot.clone() as Arc<dyn AccountPort>,
            registry.clone(),
        );
        Self::from_parts(coordinator, stores, funding, spot, registry)
    }

    /// Over a coordinator the caller wired itself over `funding` and `spot` and `registry`, so
    /// the start-up's background work runs over the same.
    pub fn from_parts(
        coordinator: Coordinator,
        stores: Stores,
        funding: Arc<dyn FundingBook>,
        spot: Arc<dyn SpotBook>,
        registry: Arc<RwLock<AssetRegistry>>,
    ) -> Self {
        Self {
            coordinator,
            funding,
            spot,
            assets: AssetSettings::new(stores.assets.clone(), registry),
            stores,
            halt: Arc::new(HaltCache::default()),
            rate: Arc::new(Unlimited),
            bulk_max: crate::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT,
        }
    }

    /// The most transfers one bulk request may carry (at least 1).
    pub fn with_bulk_max(mut self, transfers_max: usize) -> Self {
        self.bulk_max = transfers_max.max(1);
        self
    }

    /// The most transfers one bulk request may carry; the edge refuses a larger batch whole.
    pub fn bulk_max(&self) -> usize {
        self.bulk_max
    }

    /// The rounds of single requests this process's coordinator ran so far (ADR 0019): how
    /// well concurrent single requests share each durable step. This process's own counts,
    /// from its start.
    pub fn round_stats(&self) -> crate::round::RoundStats {
        self.coordinator.round_stats()
    }

    /// Applies the per-second gate and the daily limits to new transfer requests.
    pub fn with_limits(mut self, rate: Arc<dyn RateGate>, daily: DailyLimits) -> Self {
        self.rate = rate;
        self.coordinator = self.coordinator.with_daily_limits(daily);
        self
    }

    /// Arms a fail point (crash tests only).
    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Self {
        self.coordinator = self.coordinator.with_failpoints(failpoints);
        self
    }

    /// The idempotency horizon's retention, for re-keying old orphan client-key claims.
    pub fn with_idempotency_retention(mut self, retention: Duration) -> Self {
        self.coordinator = self.coordinator.with_idempotency_retention(retention);
        self
    }

    pub fn assets(&self) -> &AssetSettings {
        &self.assets
    }

    /// The core's records this ledger was wired with.
    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// The coordinator every command runs on.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Whether new transfers are halted now, and why (read from the store, not cached).
    pub async fn halt_status(&self) -> Result<(bool, Option<String>), StoreError> {
        self.stores.halt.status().await
    }

    /// An admin lifts the halt (after looking into the cause).
    pub async fn clear_halt(&self, admin: UserId) -> Result<(), StoreError> {
        let cleared = self.stores.halt.clear(admin).await;
        self.halt.invalidate();
        cleared?;
        tracing::warn!(%admin, "transfer halt cleared by an admin");
        Ok(())
    }

    /// One transfer's events, in order, from the event log itself.
    pub async fn transfer_events(&self, req_id: &ReqId) -> Result<Vec<LoggedEvent>, LogError> {
        self.stores.events.transfer_events(req_id).await
    }
}
