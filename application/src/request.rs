//! A transfer request as an edge received it, and its checks in contract §5.5's order
//! (the checks themselves are §5.2's): account types, asset, amount. The edge checks the body's shape first
//! (authorization, known fields, strings where strings belong); everything that depends on the
//! ledger's settings is checked here, once, into a typed `NewTransfer`.

use domain::{AccountType, Amount, AssetRegistry, AssetSymbol, ErrorCode, UserId};

use crate::coordinator::NewTransfer;

/// The values of a transfer request, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    /// The authenticated caller.
    pub user_id: UserId,
    pub from: String,
    pub to: String,
    pub asset: String,
    /// The amount's text; `None` when it did not arrive as text (a number has already passed
    /// through a float in many clients), refused INVALID_AMOUNT in its turn.
    pub amount: Option<String>,
    pub cid: Option<String>,
}

impl TransferRequest {
    /// Checks the values in contract §5.5's order against `assets`: account types, asset, amount.
    /// Idempotency and balance are the coordinator's and the adapters' to check.
    pub fn parse(&self, assets: &AssetRegistry) -> Result<NewTransfer, ErrorCode> {
        let from = AccountType::parse(&self.from)?;
        let to = AccountType::parse(&self.to)?;
        if from == to {
            return Err(ErrorCode::SameAccount);
        }
        if !from.is_supported() || !to.is_supported() {
            return Err(ErrorCode::UnsupportedAccountType);
        }
        let config = assets.get(&self.asset)?;
        config.check_transferable()?;
        let amount = Amount::parse(self.amount.as_deref().ok_or(ErrorCode::InvalidAmount)?)?;
        config.check_amount(amount)?;
        Ok(NewTransfer {
            user_id: self.user_id,
            from,
            to,
            asset: config.symbol.clone(),
            amount,
            cid: self.cid.clone(),
        })
    }

    /// The request as it would have been created, without the checks that depend on settings
    /// (asset status and permission, amount bounds); `None` when it is malformed regardless or
    /// carries no cid. Used to find the original transfer of a cid repeat.
    pub(crate) fn as_repeat(&self) -> Option<NewTransfer> {
        Some(NewTransfer {
            user_id: self.user_id,
            from: AccountType::parse(&self.from).ok()?,
            to: AccountType::parse(&self.to).ok()?,
            asset: AssetSymbol::parse(&self.asset).ok()?,
            amount: Amount::parse(self.amount.as_deref()?).ok()?,
            cid: Some(self.cid.clone()?),
        })
    }
}

/// Refusals that depend on asset settings an admin may have changed since a request was first
/// made: a cid repeat refused only for one of these still gets its original transfer.
pub(crate) fn depends_on_settings(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::AssetSuspended
            | ErrorCode::TransferNotAllowed
            | ErrorCode::AmountTooSmall
            | ErrorCode::AmountTooLarge
    )
}
