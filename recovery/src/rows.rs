//! The stuck listing's, the heartbeat's and the attempt log's rows, read by hand into the core's
//! values (`application::reads`, which name no database type).

use application::reads::{Attempt, Heartbeat, StuckTransfer};
use sqlx::postgres::PgRow;
use sqlx::Row;

/// A stuck listing's row (`eventlog::transfers::stuck_transfers`) as a [`StuckTransfer`].
pub(crate) struct StuckRow(pub StuckTransfer);

impl<'r> sqlx::FromRow<'r, PgRow> for StuckRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self(StuckTransfer {
            req_id: row.try_get("req_id")?,
            user_id: row.try_get("user_id")?,
            from_account: row.try_get("from_account")?,
            to_account: row.try_get("to_account")?,
            asset: row.try_get("asset")?,
            amount: row.try_get("amount")?,
            state: row.try_get("state")?,
            status: row.try_get("status")?,
            updated_at: row.try_get("updated_at")?,
            age_ms: row.try_get("age_ms")?,
            attempts: row.try_get("attempts")?,
            refund_failures: row.try_get("refund_failures")?,
            last_error_category: row.try_get("last_error_category")?,
            last_attempt_at: row.try_get("last_attempt_at")?,
            next_retry_at: row.try_get("next_retry_at")?,
            lease_owner: row.try_get("lease_owner")?,
            lease_until: row.try_get("lease_until")?,
        }))
    }
}

/// The heartbeat's row as a [`Heartbeat`].
pub(crate) fn heartbeat_row(row: PgRow) -> Result<Heartbeat, sqlx::Error> {
    Ok(Heartbeat {
        worker: row.try_get("worker")?,
        last_pass_at: row.try_get("last_pass_at")?,
        last_pass_epoch_seconds: row.try_get("last_pass_epoch_seconds")?,
        age_ms: row.try_get("age_ms")?,
        passes: row.try_get("passes")?,
    })
}

/// An attempt's row as an [`Attempt`].
pub(crate) fn attempt_row(row: PgRow) -> Result<Attempt, sqlx::Error> {
    Ok(Attempt {
        worker: row.try_get("worker")?,
        state_before: row.try_get("state_before")?,
        state_after: row.try_get("state_after")?,
        outcome: row.try_get("outcome")?,
        error_category: row.try_get("error_category")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}
