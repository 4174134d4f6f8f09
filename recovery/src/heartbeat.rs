//! What the admin routes and `/metrics` show of the worker itself: its heartbeat (the end of its
//! last pass, `recovery_heartbeat`, migration 0017), and one transfer's attempt log
//! (`recovery_attempts`) with each attempt's error category, never its raw error text.

use sqlx::PgPool;

pub use application::reads::{Attempt, Heartbeat, ATTEMPTS_READ_MAX};

/// Records the end of a pass by `worker` (one row, whichever worker passed last).
pub async fn beat(pool: &PgPool, worker: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO recovery_heartbeat (id, worker, last_pass_at, passes) VALUES (1, $1, now(), 1)
         ON CONFLICT (id) DO UPDATE
         SET worker = EXCLUDED.worker, last_pass_at = EXCLUDED.last_pass_at,
             passes = recovery_heartbeat.passes + 1",
    )
    .bind(worker)
    .execute(pool)
    .await
    .map(|_| ())
}

/// The last pass, or `None` when no worker ever finished one.
pub async fn last(pool: &PgPool) -> Result<Option<Heartbeat>, sqlx::Error> {
    sqlx::query(
        "SELECT worker, last_pass_at, EXTRACT(EPOCH FROM last_pass_at)::float8 AS last_pass_epoch_seconds,
                GREATEST((EXTRACT(EPOCH FROM (now() - last_pass_at)) * 1000)::bigint, 0) AS age_ms,
                passes
         FROM recovery_heartbeat WHERE id = 1",
    )
    .try_map(crate::rows::heartbeat_row)
    .fetch_optional(pool)
    .await
}

/// Every attempt on `req_id`, oldest first, the newest [`ATTEMPTS_READ_MAX`] at most.
pub async fn attempts(pool: &PgPool, req_id: &str) -> Result<Vec<Attempt>, sqlx::Error> {
    sqlx::query(
        "SELECT * FROM (
             SELECT id, worker, state_before, state_after, outcome, error_category, started_at,
                    finished_at
             FROM recovery_attempts WHERE req_id = $1 ORDER BY id DESC LIMIT $2) newest
         ORDER BY id",
    )
    .bind(req_id)
    .bind(ATTEMPTS_READ_MAX)
    .try_map(crate::rows::attempt_row)
    .fetch_all(pool)
    .await
}
