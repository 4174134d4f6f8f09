//! The rows of the transfer read models, as the fold produces them, the writers store them and
//! `TransferView` reads them back. No I/O here.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

/// One row of `transfers_view`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TransferRow {
    pub req_id: String,
    pub user_id: i64,
    pub from_account: String,
    pub to_account: String,
    pub asset: String,
    pub amount: Decimal,
    pub cid: Option<String>,
    pub state: String,
    pub state_id: i16,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_sequence: i64,
}

/// One user's per-asset totals from `transfer_balances`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BalanceRow {
    pub user_id: i64,
    pub asset: String,
    pub funding_net: Decimal,
    pub spot_net: Decimal,
    pub in_flight: Decimal,
}
