//! The stable error codes of the outside contract (contract §3 and §5).

use serde::{Deserialize, Serialize};

/// One code per refusal. The wire form is the SCREAMING_SNAKE_CASE name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    Unauthorized,
    Forbidden,
    NotFound,
    RateLimitExceeded,
    DailyLimitExceeded,
    DailyAmountExceeded,
    SystemError,
    BadRequest,
    SameAccount,
    InvalidAccountType,
    UnsupportedAccountType,
    InvalidAmount,
    PrecisionOverflow,
    AmountTooSmall,
    AmountTooLarge,
    Overflow,
    InvalidAsset,
    AssetSuspended,
    TransferNotAllowed,
    InvalidUserId,
    InvalidStatus,
    SourceAccountNotFound,
    TargetAccountNotFound,
    AccountFrozen,
    AccountDisabled,
    InsufficientBalance,
    DuplicateRequest,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
    ServiceHalted,
    Conflict,
    /// An operator's resolution met a transfer whose lease a recovery worker or another operator
    /// holds (`POST /api/v1/admin/transfers/{req_id}/resolve`).
    TransferBusy,
    /// The account system holds the transfer's req_id for a different movement (user, asset or
    /// amount): no resolution can be recorded.
    ReqIdMismatch,
    /// The account system could not confirm (or durably cancel) what an operator's resolution or
    /// repair needs; nothing was recorded.
    AccountSystemUnavailable,
    /// A failover repair of a transfer the ledger still knows (`POST /api/v1/admin/repairs/{req_id}`).
    TransferKnown,
    /// A failover repair where spot-core applied nothing under the req_id.
    NothingToRepair,
    /// A failover repair whose spot-core record is not one transfer's movement.
    NotRepairable,
    /// A FUNDING → SPOT failover repair the FUNDING account cannot pay now.
    InsufficientFunding,
}

impl ErrorCode {
    /// The wire name, e.g. `INSUFFICIENT_BALANCE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthorized => "UNAUTHORIZED",
            Self::Forbidden => "FORBIDDEN",
            Self::NotFound => "NOT_FOUND",
            Self::RateLimitExceeded => "RATE_LIMIT_EXCEEDED",
            Self::DailyLimitExceeded => "DAILY_LIMIT_EXCEEDED",
            Self::DailyAmountExceeded => "DAILY_AMOUNT_EXCEEDED",
            Self::SystemError => "SYSTEM_ERROR",
            Self::BadRequest => "BAD_REQUEST",
            Self::SameAccount => "SAME_ACCOUNT",
            Self::InvalidAccountType => "INVALID_ACCOUNT_TYPE",
            Self::UnsupportedAccountType => "UNSUPPORTED_ACCOUNT_TYPE",
            Self::InvalidAmount => "INVALID_AMOUNT",
            Self::PrecisionOverflow => "PRECISION_OVERFLOW",
            Self::AmountTooSmall => "AMOUNT_TOO_SMALL",
            Self::AmountTooLarge => "AMOUNT_TOO_LARGE",
            Self::Overflow => "OVERFLOW",
            Self::InvalidAsset => "INVALID_ASSET",
            Self::AssetSuspended => "ASSET_SUSPENDED",
            Self::TransferNotAllowed => "TRANSFER_NOT_ALLOWED",
            Self::InvalidUserId => "INVALID_USER_ID",
            Self::InvalidStatus => "INVALID_STATUS",
            Self::SourceAccountNotFound => "SOURCE_ACCOUNT_NOT_FOUND",
            Self::TargetAccountNotFound => "TARGET_ACCOUNT_NOT_FOUND",
            Self::AccountFrozen => "ACCOUNT_FROZEN",
            Self::AccountDisabled => "ACCOUNT_DISABLED",
            Self::InsufficientBalance => "INSUFFICIENT_BALANCE",
            Self::DuplicateRequest => "DUPLICATE_REQUEST",
            Self::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            Self::InvalidIdempotencyKey => "INVALID_IDEMPOTENCY_KEY",
            Self::ServiceHalted => "SERVICE_HALTED",
            Self::Conflict => "CONFLICT",
            Self::TransferBusy => "TRANSFER_BUSY",
            Self::ReqIdMismatch => "REQ_ID_MISMATCH",
            Self::AccountSystemUnavailable => "ACCOUNT_SYSTEM_UNAVAILABLE",
            Self::TransferKnown => "TRANSFER_KNOWN",
            Self::NothingToRepair => "NOTHING_TO_REPAIR",
            Self::NotRepairable => "NOT_REPAIRABLE",
            Self::InsufficientFunding => "INSUFFICIENT_FUNDING",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    /// The wire name and the serde name are one name: the admin routes' codes among them.
    #[test]
    fn the_wire_name_is_the_serde_name() {
        for code in [
            ErrorCode::Conflict,
            ErrorCode::InsufficientBalance,
            ErrorCode::TransferBusy,
            ErrorCode::ReqIdMismatch,
            ErrorCode::AccountSystemUnavailable,
            ErrorCode::TransferKnown,
            ErrorCode::NothingToRepair,
            ErrorCode::NotRepairable,
            ErrorCode::InsufficientFunding,
        ] {
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                serde_json::json!(code.as_str())
            );
        }
    }
}
