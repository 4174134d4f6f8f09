//! The account systems' ports beyond movements (`application::books`): `FundingBook` for the
//! funding ledger, `SpotBook` for spot-core's adapter. Each call is the adapter's own method;
//! the funding ledger's database errors become the core's `StoreError` here.

use application::books::{
    AccountStatus, AppliedMovement, DepositReceipt, FundingBalance, FundingBook, FundingError,
    FundingItem, FundingRead, JournalEntry, SpotBalance, SpotBook, SpotError, SpotRead,
    SpotReadError, SpotRecord,
};
use async_trait::async_trait;
use domain::{Amount, AssetSymbol, ReqId, UserId};
use rust_decimal::Decimal;
use spot_core::protocol::{CoreStatus, LookupOp};

use crate::funding::FundingError as DbFundingError;
use crate::pg::store;
use crate::{FundingLedger, SpotAdapter};

/// The funding ledger's error as the core's.
fn core(e: DbFundingError) -> FundingError {
    match e {
        DbFundingError::ExternalIdReused => FundingError::ExternalIdReused,
        DbFundingError::AccountNotFound => FundingError::AccountNotFound,
        DbFundingError::Overflow => FundingError::Overflow,
        DbFundingError::Database(e) => FundingError::Store(store(e)),
    }
}

#[async_trait]
impl FundingBook for FundingLedger {
    async fn balances(&self, user: UserId) -> Result<Vec<FundingBalance>, FundingError> {
        FundingLedger::balances(self, user).await.map_err(core)
    }

    async fn balance(
        &self,
        user: UserId,
        asset: &AssetSymbol,
    ) -> Result<Option<Decimal>, FundingError> {
        FundingLedger::balance(self, user, asset)
            .await
            .map_err(core)
    }

    async fn account_exists(
        &self,
        user: UserId,
        asset: &AssetSymbol,
    ) -> Result<bool, FundingError> {
        FundingLedger::account_exists(self, user, asset)
            .await
            .map_err(core)
    }

    async fn journal_for(&self, req_id: &ReqId) -> Result<Vec<JournalEntry>, FundingError> {
        FundingLedger::journal_for(self, &req_id.to_string())
            .await
            .map_err(core)
    }

    async fn external_deposit(
        &self,
        external_id: &str,
        user: UserId,
        asset: &AssetSymbol,
        amount: Amount,
    ) -> Result<DepositReceipt, FundingError> {
        FundingLedger::external_deposit(self, external_id, user, asset, amount)
            .await
            .map_err(core)
    }

    async fn set_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), FundingError> {
        FundingLedger::set_status(self, user, asset, status)
            .await
            .map_err(core)
    }

    async fn audit_read(
        &self,
        since: u64,
        sink: &mut (dyn FnMut(FundingItem) + Send),
    ) -> Result<FundingRead, FundingError> {
        FundingLedger::audit_read(self, since, sink)
            .await
            .map_err(core)
    }
}

#[async_trait]
impl SpotBook for SpotAdapter {
    async fn balances(&self, user: UserId) -> Result<Vec<SpotBalance>, SpotError> {
        SpotAdapter::balances(self, user).await
    }

    async fn lookup_records(&self, req_id: &ReqId) -> Result<Vec<LookupOp>, SpotError> {
        SpotAdapter::lookup_records(self, req_id).await
    }

    async fn record_of(&self, req_id: &str) -> Result<SpotRecord, SpotError> {
        SpotAdapter::record_of(self, req_id).await
    }

    async fn core_status(&self) -> Result<CoreStatus, SpotError> {
        SpotAdapter::core_status(self).await
    }

    async fn set_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), SpotError> {
        SpotAdapter::set_status(self, user, asset, status).await
    }

    async fn advance_horizon(&self, before_ms: u64) -> Result<CoreStatus, SpotError> {
        SpotAdapter::advance_horizon(self, before_ms).await
    }

    async fn audit_read(
        &self,
        after_seq: u64,
        sink: &mut (dyn FnMut(AppliedMovement) + Send),
    ) -> Result<SpotRead, SpotReadError> {
        SpotAdapter::audit_read(self, after_seq, sink).await
    }

    async fn retain(&self, after_seq: u64) -> Result<Option<CoreStatus>, SpotError> {
        SpotAdapter::retain(self, after_seq).await
    }
}
