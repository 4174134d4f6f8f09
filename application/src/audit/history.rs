//! The record of the fund-conservation check, the one owner of its two tables:
//!
//! - `invariant_checks` (migration 0003): each check's full report, as JSON ([`store_report`]);
//! - `invariant_runs` (migrations 0017, 0023): every run that decided, periodic or on demand,
//!   incremental or full, with its mode, result, duration, violation count, per-asset result and
//!   the id of its full report, for the operators' overview and conservation pages ([`record`],
//!   [`recent`], [`report`]).
//!
//! Both are bounded: each write removes the passing rows older than the newest [`RUNS_KEPT`];
//! failing ones (each one halts the service) are all kept.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::Mode;

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
