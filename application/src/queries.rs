//! The core's reads an edge may make, in one object: a user's balances in both account systems,
//! each system's record of one req_id (an operator's timeline), the stored alerts, the
//! conservation check's health and history, the halt flag and spot-core's status. Built once by
//! the binary's start-up from the ports it made; the edge holds this object and never a store
//! or an adapter, so every read it makes is named here.

use std::sync::Arc;

use domain::{ReqId, Resolution, TransferData, UserId};
use spot_core::protocol::{CoreStatus, LookupOp};

use crate::alerts::StoredAlert;
use crate::audit::history::Run;
use crate::audit::status::AuditHealth;
use crate::books::{
    FundingBalance, FundingBook, FundingError, JournalEntry, SpotBalance, SpotBook, SpotError,
};
use crate::coordinator::CoordinatorError;
use crate::drive::Resumed;
use crate::error::StoreError;
use crate::ledger::Ledger;
use crate::ledger::Stores;
use crate::repair::{RepairDesk, RepairError, RepairOutcome};
use crate::resolve::ManualResolutionError;

/// The core's reads. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct Queries {
    stores: Stores,
    funding: Arc<dyn FundingBook>,
    spot: Arc<dyn SpotBook>,
}

impl Queries {
    /// Over the records and the two account systems the start-up made.
    pub fn new(stores: Stores, funding: Arc<dyn FundingBook>, spot: Arc<dyn SpotBook>) -> Self {
        Self {
            stores,
            funding,
            spot,
        }
    }

    /// The same reads as `ledger` is wired with.
    pub fn of(ledger: &Ledger) -> Self {
        Self::new(
            ledger.stores.clone(),
            ledger.funding.clone(),
            ledger.spot.clone(),
        )
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
        self.funding.journal_for(req_id).await
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
        self.stores.alerts.recent(limit).await
    }

    /// How many alerts of `code` were ever raised.
    pub async fn alerts_total(&self, code: &str) -> Result<i64, StoreError> {
        self.stores.alerts.total(code).await
    }

    /// The periodic conservation check's health (`ledger_audit_up` and its counters).
    pub async fn audit_health(&self) -> Result<AuditHealth, StoreError> {
        self.stores.history.health().await
    }

    /// The newest conservation checks that decided, at most `limit`.
    pub async fn check_history(&self, limit: i64) -> Result<Vec<Run>, StoreError> {
        self.stores.history.recent_runs(limit).await
    }

    /// Run `run_id`'s full report (`None`: no such run, or its report was pruned).
    pub async fn check_report(&self, run_id: i64) -> Result<Option<serde_json::Value>, StoreError> {
        self.stores.history.report(run_id).await
    }

    /// The newest conservation check that decided, if any.
    pub async fn last_check(&self) -> Result<Option<Run>, StoreError> {
        Ok(self.stores.history.recent_runs(1).await?.into_iter().next())
    }

    /// Whether new transfers are halted now (read from the store, not cached).
    pub async fn is_halted(&self) -> Result<bool, StoreError> {
        self.stores.halt.is_halted().await
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
        let desk = RepairDesk {
            records: self.stores.repairs.as_ref(),
            spot: self.spot.as_ref(),
            funding: self.funding.as_ref(),
        };
        self.coordinator
            .repair_lost(desk, req_id, operator, reason)
            .await
    }
}
