//! The stuck listing: open transfers with their retry records, as the admin routes show them
//! (`GET /api/v1/admin/transfers/stuck`). Read from `open_transfers` and `transfer_retries`,
//! never from the read models.

use std::time::Duration;

use sqlx::PgPool;

use crate::worker::millis;

pub use application::reads::StuckTransfer;

/// Open transfers unchanged for at least `older_than`, oldest first, with their retry records.
pub async fn stuck_transfers(
    pool: &PgPool,
    older_than: Duration,
    limit: i64,
) -> Result<Vec<StuckTransfer>, sqlx::Error> {
    sqlx::query(
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
    .try_map(crate::rows::stuck_row)
    .fetch_all(pool)
    .await
}
