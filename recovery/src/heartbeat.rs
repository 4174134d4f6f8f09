//! What the admin routes and `/metrics` show of the worker itself: its heartbeat (the end of its
//! last pass, `recovery_heartbeat`, migration 0017), and one transfer's attempt log
//! (`recovery_attempts`) with each attempt's error category, never its raw error text.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

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

/// The last pass of any worker.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Heartbeat {
    pub worker: String,
    pub last_pass_at: DateTime<Utc>,
    /// `last_pass_at` as Unix seconds.
    pub last_pass_epoch_seconds: f64,
    /// Milliseconds since then (database time).
    pub age_ms: i64,
    pub passes: i64,
}

/// The last pass, or `None` when no worker ever finished one.
pub async fn last(pool: &PgPool) -> Result<Option<Heartbeat>, sqlx::Error> {
    sqlx::query_as(
        "SELECT worker, last_pass_at, EXTRACT(EPOCH FROM last_pass_at)::float8 AS last_pass_epoch_seconds,
                GREATEST((EXTRACT(EPOCH FROM (now() - last_pass_at)) * 1000)::bigint, 0) AS age_ms,
                passes
         FROM recovery_heartbeat WHERE id = 1",
    )
    .fetch_optional(pool)
    .await
}

/// One recovery attempt, as an operator may see it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Attempt {
    pub worker: String,
    pub state_before: String,
    pub state_after: Option<String>,
    /// TERMINAL, UNKNOWN, CONFLICT or ERROR; `None` while it runs (or when its worker died).
    pub outcome: Option<String>,
    /// TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET, MISMATCH or UNKNOWN; `None` without an error.
    pub error_category: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Most attempts one read returns (the oldest are left out past it).
pub const ATTEMPTS_READ_MAX: i64 = 1_000;

/// Every attempt on `req_id`, oldest first, the newest [`ATTEMPTS_READ_MAX`] at most.
pub async fn attempts(pool: &PgPool, req_id: &str) -> Result<Vec<Attempt>, sqlx::Error> {
    sqlx::query_as(
        "SELECT * FROM (
             SELECT id, worker, state_before, state_after, outcome, error_category, started_at,
                    finished_at
             FROM recovery_attempts WHERE req_id = $1 ORDER BY id DESC LIMIT $2) newest
         ORDER BY id",
    )
    .bind(req_id)
    .bind(ATTEMPTS_READ_MAX)
    .fetch_all(pool)
    .await
}
