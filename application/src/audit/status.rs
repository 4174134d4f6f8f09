//! The periodic check's health, cluster-wide in PostgreSQL (`audit_status`, migration 0010), so
//! that every instance's `/metrics` reports the same figures and a restart loses none: whether
//! the last periodic run decided, how many could not run, the last run's duration and when a run
//! last decided.

use chrono::{DateTime, Utc};

/// What `/metrics` reports of the periodic check.
#[derive(Debug, Clone, Default, PartialEq)]
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
