//! The stuck listing: open transfers with their retry records, as the admin routes show them
//! (`GET /api/v1/admin/transfers/stuck`). Read from `open_transfers` and `transfer_retries`,
//! never from the read models.

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
    sqlx::query_as(
        "SELECT o.req_id,
                (c.payload -> 'TransferCreated' ->> 'user_id')::bigint AS user_id,
                c.payload -> 'TransferCreated' ->> 'from' AS from_account,
                c.payload -> 'TransferCreated' ->> 'to' AS to_account,
                c.payload -> 'TransferCreated' ->> 'asset' AS asset,
                (c.payload -> 'TransferCreated' ->> 'amount')::numeric AS amount,
                o.state,
                CASE WHEN o.state = 'COMPENSATING' AND r.last_error_category = 'REFUSED_BY_TARGET'
                     THEN 'REFUND_REFUSED' ELSE 'RETRYING' END AS status,
                o.recorded_at AS updated_at,
                (EXTRACT(EPOCH FROM (now() - o.recorded_at)) * 1000)::bigint AS age_ms,
                COALESCE(r.attempts, 0) AS attempts,
                COALESCE(r.refund_failures, 0) AS refund_failures,
                r.last_error_category, r.last_attempt_at, r.next_retry_at, r.lease_owner,
                r.lease_until
         FROM open_transfers o
         LEFT JOIN transfer_retries r USING (req_id)
         LEFT JOIN events c ON c.aggregate_type = 'Transfer' AND c.aggregate_id = o.req_id
                           AND c.event_type = 'TransferCreated'
         WHERE o.recorded_at <= now() - $1 * interval '1 millisecond'
         ORDER BY o.recorded_at LIMIT $2",
    )
    .bind(millis(older_than))
    .bind(limit)
    .fetch_all(pool)
    .await
}
