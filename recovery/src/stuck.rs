//! The stuck listing: open transfers with their retry records, as the admin routes show them
//! (`GET /api/v1/admin/transfers/stuck`). Read from `open_transfers` and `transfer_retries`, with
//! each one's creation from the event log (the query is `eventlog::transfers::stuck_transfers`,
//! since it joins the `events` table), never from the read models.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::worker::millis;

/// One open transfer as the worker and the admin routes see it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StuckTransfer {
    pub req_id: String,
    /// From the transfer's `TransferCreated` event; `None` when it cannot be read.
    pub user_id: Option<i64>,
    pub from_account: Option<String>,
    pub to_account: Option<String>,
    pub asset: Option<String>,
    pub amount: Option<Decimal>,
    pub state: String,
    /// RETRYING, or REFUND_REFUSED: COMPENSATING with a refund the source refused for good,
    /// which no retry can finish (see ARCHITECTURE.md, "Recovery and manual resolution").
    pub status: String,
    pub updated_at: DateTime<Utc>,
    pub age_ms: i64,
    pub attempts: i32,
    pub refund_failures: i32,
    /// The kind of the last error (TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET, MISMATCH,
    /// UNKNOWN); the detail is kept out of this struct so it never reaches a client.
    pub last_error_category: Option<String>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
}

/// Open transfers unchanged for at least `older_than`, oldest first, with their retry records.
pub async fn stuck_transfers(
    pool: &PgPool,
    older_than: Duration,
    limit: i64,
) -> Result<Vec<StuckTransfer>, sqlx::Error> {
    eventlog::transfers::stuck_transfers(pool, millis(older_than), limit).await
}
