//! The core's reads an edge may make, in one object: a user's balances in both account systems,
//! each system's record of one req_id (an operator's timeline), the stored alerts, the
//! conservation check's health and history, the halt flag and spot-core's status. Built once by
//! the binary's start-up from the pool and the adapters it made; the edge holds this object and
//! never the pool or an adapter, so every read it makes is named here.

use adapters::funding::JournalEntry;
use adapters::{FundingBalance, FundingError, FundingLedger, SpotAdapter, SpotBalance, SpotError};
use domain::{ReqId, Resolution, TransferData, UserId};
use spot_core::protocol::{CoreStatus, LookupOp};
use sqlx::PgPool;

use crate::alerts::{self, StoredAlert};
use crate::audit::history::{self, Run};
use crate::audit::status::{self, AuditHealth};
use crate::coordinator::CoordinatorError;
use crate::drive::Resumed;
use crate::error::StoreError;
use crate::halt;
use crate::ledger::Ledger;
use crate::repair::{RepairError, RepairOutcome};
use crate::resolve::ManualResolutionError;

/// The core's reads. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct Queries {
    pool: PgPool,
    funding: FundingLedger,
    spot: SpotAdapter,
}

impl Queries {
    /// Over the database, the funding ledger and the spot adapter the start-up made.
    pub fn new(pool: PgPool, funding: FundingLedger, spot: SpotAdapter) -> Self {
        Self {
            pool,
            funding,
            spot,
        }
    }

    /// One user's FUNDING accounts: balance and status per asset.
    pub async fn funding_balances(
        &self,
        user: UserId,
    ) -> Result<Vec<FundingBalance>, FundingError> {
        self.funding.balances(user).await
    }

    /// One user's SPOT accounts, as spot-core answers.
    pub async fn spot_balances(&self, user: UserId) -> Result<Vec<SpotBalance>, SpotError> {
        self.spot.balances(user).await
    }

    /// The funding journal's rows of one req_id.
    pub async fn funding_records(&self, req_id: &ReqId) -> Result<Vec<JournalEntry>, FundingError> {
        self.funding.journal_for(&req_id.to_string()).await
    }

    /// What spot-core recorded under one req_id.
    pub async fn spot_records(&self, req_id: &ReqId) -> Result<Vec<LookupOp>, SpotError> {
        self.spot.lookup_records(req_id).await
    }

    /// spot-core's status (its idempotency horizon among it); an error when it does not answer.
    pub async fn spot_status(&self) -> Result<CoreStatus, SpotError> {
        self.spot.core_status().await
    }

    /// The newest stored alerts, at most `limit`.
    pub async fn alerts_recent(&self, limit: i64) -> Result<Vec<StoredAlert>, StoreError> {
        alerts::recent(&self.pool, limit)
            .await
            .map_err(StoreError::from)
    }

    /// How many alerts of `code` were ever raised.
    pub async fn alerts_total(&self, code: &str) -> Result<i64, StoreError> {
        alerts::total(&self.pool, code)
            .await
            .map_err(StoreError::from)
    }

    /// The periodic conservation check's health (`ledger_audit_up` and its counters).
    pub async fn audit_health(&self) -> Result<AuditHealth, StoreError> {
        status::health(&self.pool).await.map_err(StoreError::from)
    }

    /// The newest conservation checks that decided, at most `limit`.
    pub async fn check_history(&self, limit: i64) -> Result<Vec<Run>, StoreError> {
        history::recent(&self.pool, limit)
            .await
            .map_err(StoreError::from)
    }

    /// Run `run_id`'s full report (`None`: no such run, or its report was pruned).
    pub async fn check_report(&self, run_id: i64) -> Result<Option<serde_json::Value>, StoreError> {
        history::report(&self.pool, run_id)
            .await
            .map_err(StoreError::from)
    }

    /// The newest conservation check that decided, if any.
    pub async fn last_check(&self) -> Result<Option<Run>, StoreError> {
        history::last(&self.pool).await.map_err(StoreError::from)
    }

    /// Whether new transfers are halted now (read from the database, not cached).
    pub async fn is_halted(&self) -> Result<bool, StoreError> {
        halt::is_halted(&self.pool).await.map_err(StoreError::from)
    }
}

/// The ledger's doors on one transfer an edge names by req_id: its state now, and the operators'
/// two interventions on it (a confirmed outcome, a failover's re-record).
impl Ledger {
    /// One transfer as its events fold to now; `None` when no transfer has this req_id.
    pub async fn transfer(&self, req_id: &ReqId) -> Result<Option<TransferData>, CoordinatorError> {
        self.coordinator.load(req_id).await
    }

    /// An operator's confirmed outcome of a transfer's pending call (`resolve.rs`).
    pub async fn manually_resolve(
        &self,
        req_id: &ReqId,
        resolution: Resolution,
        operator: &str,
        reason: &str,
        force: bool,
    ) -> Result<Resumed, ManualResolutionError> {
        self.coordinator
            .manually_resolve(req_id, resolution, operator, reason, force)
            .await
    }

    /// An operator's re-record of a transfer a failover lost (`repair.rs`).
    pub async fn repair_lost(
        &self,
        req_id: &ReqId,
        operator: &str,
        reason: &str,
    ) -> Result<RepairOutcome, RepairError> {
        self.coordinator
            .repair_lost(&self.spot, req_id, operator, reason)
            .await
    }
}
