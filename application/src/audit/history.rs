//! The record of the fund-conservation check, the one owner of its two tables:
//!
//! - `invariant_checks` (migration 0003): each check's full report, as JSON ([`store_report`]);
//! - `invariant_runs` (migrations 0017, 0023): every run that decided, periodic or on demand,
//!   incremental or full, with its mode, result, duration, violation count, per-asset result and
//!   the id of its full report, for the operators' overview and conservation pages.
//!
//! Both are bounded: each write removes the passing rows older than the newest [`RUNS_KEPT`];
//! failing ones (each one halts the service) are all kept.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::status::AuditHealth;
use super::{InvariantReport, Mode};
use crate::error::StoreError;

/// Passing runs kept: a week of the default one-minute periodic check, and more than any
/// console page shows.
pub const RUNS_KEPT: i64 = 10_000;

/// Most runs one read returns.
pub const RUNS_READ_MAX: i64 = 1_000;

/// One asset's result in a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AssetResult {
    pub asset: String,
    pub ok: bool,
    /// funding + spot + in_flight - deposits, as exact decimal text ("0" when conserved).
    pub difference: String,
}

/// One recorded run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The run's id: [`report`] takes it.
    pub id: i64,
    pub checked_at: DateTime<Utc>,
    pub mode: Mode,
    pub ok: bool,
    pub duration_ms: i64,
    /// Assets out of balance plus transfers whose records disagree with their events.
    pub violations: i32,
    pub assets: Vec<AssetResult>,
    /// Whether its full report is still stored (see [`report`]).
    pub has_report: bool,
}

/// The check's history and health, kept where every process reads the same
/// (`adapters::pg::audit` in production, `testkit::MemRecords` in memory).
#[async_trait]
pub trait AuditHistory: Send + Sync {
    /// Stores a check's full report (bounded); its id.
    async fn store_report(&self, report: &InvariantReport) -> Result<i64, StoreError>;
    /// Records one run that decided, naming its full report (bounded).
    async fn record_run(
        &self,
        report: &InvariantReport,
        took: Duration,
        report_id: Option<i64>,
    ) -> Result<(), StoreError>;
    /// The newest runs first, at most `limit` (1 to [`RUNS_READ_MAX`]).
    async fn recent_runs(&self, limit: i64) -> Result<Vec<Run>, StoreError>;
    /// The full report of run `run_id` (`None`: no such run, or its report was pruned).
    async fn report(&self, run_id: i64) -> Result<Option<serde_json::Value>, StoreError>;
    /// The periodic check's health.
    async fn health(&self) -> Result<AuditHealth, StoreError>;
    /// Records a periodic run that decided.
    async fn record_decided(&self, took: Duration) -> Result<(), StoreError>;
    /// Records a periodic run that could not decide.
    async fn record_failed(&self, took: Duration, error: &str) -> Result<(), StoreError>;
}
