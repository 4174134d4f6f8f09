//! The one way to claim a transfer in `transfer_retries`: a lease that is free or expired, so no
//! two workers (nor a worker and an operator's manual resolution) drive one transfer at once.

use std::time::Duration;

use sqlx::PgPool;

use application::ports::LeaseRequest;

/// A lease's length in whole milliseconds, as the SQL takes it.
pub(crate) fn millis(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Takes the lease `request` asks for if nobody holds a live one. A recovery worker also waits
/// for the transfer's retry time (`wait_for_retry_time`); an operator does not. Returns the
/// transfer's attempts so far when taken, `None` when someone else holds it (or it is not due).
pub async fn take(pool: &PgPool, request: &LeaseRequest<'_>) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO transfer_retries (req_id, state, lease_owner, lease_until)
         VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond')
         ON CONFLICT (req_id) DO UPDATE
           SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until,
               updated_at = now()
           WHERE (transfer_retries.lease_until IS NULL
                  OR transfer_retries.lease_until < clock_timestamp())
             AND (NOT $5 OR transfer_retries.next_retry_at <= clock_timestamp())
         RETURNING attempts",
    )
    .bind(request.req_id.to_string())
    .bind(request.state.as_str())
    .bind(request.owner)
    .bind(millis(request.lease))
    .bind(request.wait_for_retry_time)
    .fetch_optional(pool)
    .await
}
