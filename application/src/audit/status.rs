//! The periodic check's health, cluster-wide in PostgreSQL (`audit_status`, migration 0010), so
//! that every instance's `/metrics` reports the same figures and a restart loses none: whether
//! the last periodic run decided, how many could not run, the last run's duration and when a run
//! last decided.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// What `/metrics` reports of the periodic check.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct AuditHealth {
    /// The last periodic run decided (ok or violation); false when it could not run.
    pub up: bool,
    /// Periodic runs that could not run.
    pub failures: i64,
    pub last_duration_seconds: f64,
    pub last_success_at: Option<DateTime<Utc>>,
    /// `last_success_at` as Unix seconds (0: never).
    pub last_success_epoch_seconds: f64,
    pub last_error: Option<String>,
}

/// The stored health (the migration inserts its one row).
pub async fn health(pool: &PgPool) -> Result<AuditHealth, sqlx::Error> {
    sqlx::query_as(
        "SELECT up, failures, last_duration_seconds, last_success_at,
                COALESCE(EXTRACT(EPOCH FROM last_success_at), 0)::float8
                    AS last_success_epoch_seconds,
                last_error
         FROM audit_status WHERE id = 1",
    )
    .fetch_optional(pool)
    .await
    .map(Option::unwrap_or_default)
}

/// Records a periodic run that decided.
pub async fn record_decided(pool: &PgPool, took: Duration) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE audit_status SET up = true, last_duration_seconds = $1, last_success_at = now(),
                last_error = NULL, updated_at = now()
         WHERE id = 1",
    )
    .bind(took.as_secs_f64())
    .execute(pool)
    .await
    .map(|_| ())
}

/// Records a periodic run that could not run.
pub async fn record_failed(pool: &PgPool, took: Duration, error: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE audit_status SET up = false, failures = failures + 1,
                last_duration_seconds = $1, last_error = $2, updated_at = now()
         WHERE id = 1",
    )
    .bind(took.as_secs_f64())
    .bind(error)
    .execute(pool)
    .await
    .map(|_| ())
}
