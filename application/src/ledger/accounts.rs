//! The admin's commands on accounts, and a user's own transfer: set an account's status (in
//! FUNDING or SPOT, whichever the account type names), credit FUNDING from outside, and one
//! transfer as its owner may see it. Each decides here what the edge only parses and renders:
//! which account system, whether the account type and the asset take the command, whether the
//! values fit.

use domain::{
    AccountType, Amount, AssetStatus, AssetSymbol, ErrorCode, ReqId, TransferData, UserId,
};

use super::Ledger;
use crate::books::{AccountStatus, DepositReceipt, FundingError, SpotError};
use crate::coordinator::CoordinatorError;

/// Longest external deposit id.
pub const EXTERNAL_ID_CHARS_MAX: usize = 128;

/// Why an account command did nothing (or may have done something: `Spot`).
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// Refused with this contract code; nothing changed.
    #[error("refused: {0}")]
    Refused(ErrorCode),
    /// The external id is not 1 to [`EXTERNAL_ID_CHARS_MAX`] characters of `[A-Za-z0-9_.:-]`.
    #[error("external_id must be 1 to {EXTERNAL_ID_CHARS_MAX} characters of [A-Za-z0-9_.:-]")]
    ExternalId,
    /// FUNDING refused or failed (a missing account, a reused external id, its store).
    #[error("funding ledger")]
    Funding(#[source] FundingError),
    /// spot-core refused or did not answer; `SpotError::outcome_unknown` says whether the status
    /// may have been set.
    #[error("spot-core")]
    Spot(#[source] SpotError),
}

impl From<ErrorCode> for AccountError {
    fn from(code: ErrorCode) -> Self {
        Self::Refused(code)
    }
}

/// An account's status as set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSet {
    pub user_id: UserId,
    pub account_type: AccountType,
    pub asset: AssetSymbol,
    pub status: AccountStatus,
}

/// A credit into FUNDING from outside, as the admin asks for it: the values as given, checked by
/// [`Ledger::external_deposit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepositRequest {
    /// The deposit's id outside; one credit per id, ever.
    pub external_id: String,
    pub user_id: UserId,
    pub asset: String,
    /// The amount as text; `None` when it was not given as a string (refused, INVALID_AMOUNT).
    pub amount: Option<String>,
}

/// An external deposit as applied (or as applied before: `receipt.applied_now` false).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deposited {
    pub asset: AssetSymbol,
    pub amount: Amount,
    pub receipt: DepositReceipt,
}

impl Ledger {
    /// Sets one account's status: the account type must be one this ledger keeps (FUNDING or
    /// SPOT, else UNSUPPORTED_ACCOUNT_TYPE), the asset one it knows (INVALID_ASSET); then FUNDING's
    /// existing account, or spot-core's, takes the status.
    pub async fn set_status(
        &self,
        user_id: UserId,
        account_type: AccountType,
        asset: &str,
        status: AccountStatus,
    ) -> Result<StatusSet, AccountError> {
        if !account_type.is_supported() {
            return Err(ErrorCode::UnsupportedAccountType.into());
        }
        let asset = self.assets.get(asset)?.symbol;
        match account_type {
            AccountType::Funding => self
                .funding
                .set_status(user_id, &asset, status)
                .await
                .map_err(AccountError::Funding)?,
            AccountType::Spot => self
                .spot
                .set_status(user_id, &asset, status)
                .await
                .map_err(AccountError::Spot)?,
            AccountType::Future | AccountType::Margin => {
                return Err(ErrorCode::UnsupportedAccountType.into())
            }
        }
        tracing::info!(%user_id, %account_type, %asset, status = status.as_str(), "account status set");
        Ok(StatusSet {
            user_id,
            account_type,
            asset,
            status,
        })
    }

    /// Credits FUNDING from outside, once per `external_id`. Checked in this order: the asset
    /// (known, INVALID_ASSET; active, ASSET_SUSPENDED: a delisted asset takes no new money in,
    /// whatever `internal_transfer_enabled` says), the amount (INVALID_AMOUNT and the amount's
    /// other codes, then the asset's precision), the external id's shape.
    pub async fn external_deposit(
        &self,
        request: DepositRequest,
    ) -> Result<Deposited, AccountError> {
        let config = self.assets.get(&request.asset)?;
        if config.status != AssetStatus::Active {
            return Err(ErrorCode::AssetSuspended.into());
        }
        let amount = Amount::parse(request.amount.as_deref().ok_or(ErrorCode::InvalidAmount)?)?;
        config.check_precision(amount)?;
        if !external_id_ok(&request.external_id) {
            return Err(AccountError::ExternalId);
        }
        let receipt = self
            .funding
            .external_deposit(
                &request.external_id,
                request.user_id,
                &config.symbol,
                amount,
            )
            .await
            .map_err(AccountError::Funding)?;
        tracing::info!(external_id = %request.external_id, user_id = %request.user_id,
            asset = %config.symbol, %amount, applied = receipt.applied_now, "external deposit");
        Ok(Deposited {
            asset: config.symbol,
            amount,
            receipt,
        })
    }

    /// One transfer as `user` may see it: `None` when no transfer has this req_id, and also when
    /// another user's has (indistinguishable from a missing one, so req_ids reveal nothing).
    pub async fn users_transfer(
        &self,
        user: UserId,
        req_id: &ReqId,
    ) -> Result<Option<TransferData>, CoordinatorError> {
        Ok(self
            .coordinator
            .load(req_id)
            .await?
            .filter(|data| data.user_id == user))
    }
}

/// An external id: 1 to [`EXTERNAL_ID_CHARS_MAX`] characters of `[A-Za-z0-9_.:-]`.
fn external_id_ok(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= EXTERNAL_ID_CHARS_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_ids_are_bounded_and_plain() {
        assert!(external_id_ok("chain:tx-0x1.2_3"));
        assert!(!external_id_ok(""));
        assert!(!external_id_ok(&"a".repeat(EXTERNAL_ID_CHARS_MAX + 1)));
        assert!(!external_id_ok("a b"));
        assert!(!external_id_ok("a/b"));
    }
}
