//! The one way to claim a transfer in `transfer_retries`: a lease that is free or expired, so no
//! two workers (nor a worker and an operator's manual resolution) drive one transfer at once.

use sqlx::PgPool;

/// Takes the lease on `req_id` for `lease_ms` if nobody holds a live one. A recovery worker also
/// waits for the transfer's retry time (`respect_retry_time`); an operator does not. Returns the
/// transfer's attempts so far when taken, `None` when someone else holds it (or it is not due).
pub async fn take(
    pool: &PgPool,
    req_id: &str,
    state: &str,
    owner: &str,
    lease_ms: i64,
    respect_retry_time: bool,
) -> Result<Option<i32>, sqlx::Error> {
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
    .bind(req_id)
    .bind(state)
    .bind(owner)
    .bind(lease_ms)
    .bind(respect_retry_time)
    .fetch_optional(pool)
    .await
}
