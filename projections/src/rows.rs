//! The rows of the transfer read models, as the fold produces them, the writers store them and
//! `TransferView` reads them back: the core's own values (`application::reads`), read from a
//! row here. No other I/O here.

use sqlx::postgres::PgRow;
use sqlx::Row;

pub use application::reads::{BalanceRow, TransferRow};

/// A `transfers_view` row (`SELECT *`) as a [`TransferRow`].
pub(crate) fn transfer_row(row: PgRow) -> Result<TransferRow, sqlx::Error> {
    Ok(TransferRow {
        req_id: row.try_get("req_id")?,
        user_id: row.try_get("user_id")?,
        from_account: row.try_get("from_account")?,
        to_account: row.try_get("to_account")?,
        asset: row.try_get("asset")?,
        amount: row.try_get("amount")?,
        cid: row.try_get("cid")?,
        state: row.try_get("state")?,
        state_id: row.try_get("state_id")?,
        failure_code: row.try_get("failure_code")?,
        failure_message: row.try_get("failure_message")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        last_sequence: row.try_get("last_sequence")?,
    })
}

/// A `transfer_balances` row as a [`BalanceRow`].
pub(crate) fn balance_row(row: PgRow) -> Result<BalanceRow, sqlx::Error> {
    Ok(BalanceRow {
        user_id: row.try_get("user_id")?,
        asset: row.try_get("asset")?,
        funding_net: row.try_get("funding_net")?,
        spot_net: row.try_get("spot_net")?,
        in_flight: row.try_get("in_flight")?,
    })
}
