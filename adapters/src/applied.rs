//! One movement an account system applied, as the conservation check's reads (`audit.rs`) and
//! the failover repair's lookup (`spot/repair.rs`) both report it. Below both, so neither
//! imports the other for it.

use domain::{AccountType, Operation};
use rust_decimal::Decimal;

/// One movement an account system applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMovement {
    pub req_id: String,
    pub system: AccountType,
    pub operation: Operation,
    pub user_id: i64,
    pub asset: String,
    pub amount: Decimal,
}
