//! What the fund-conservation audit reads from each account system: its totals and every movement
//! it applied, keyed by req_id. The funding ledger answers from one consistent PostgreSQL
//! snapshot (`FundingLedger::audit_snapshot`), spot-core from its journal and totals
//! (`SpotAdapter::audit_snapshot`); the audit itself is the application's
//! (`application::audit`).

use std::collections::BTreeMap;

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

/// FUNDING's side in one consistent snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FundingSnapshot {
    /// Sum of balances per asset.
    pub balances: BTreeMap<String, Decimal>,
    /// Sum of external deposits per asset.
    pub deposits: BTreeMap<String, Decimal>,
    pub applied: Vec<AppliedMovement>,
}

/// SPOT's side: totals per asset and the journal's applied movements that produced exactly them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpotSnapshot {
    pub totals: BTreeMap<String, Decimal>,
    pub applied: Vec<AppliedMovement>,
}
