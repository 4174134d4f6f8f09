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

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::{InvariantReport, Mode};

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

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Incremental => "incremental",
        Mode::Full => "full",
    }
}

/// Stores a check's full report in `invariant_checks` and prunes that table to its bound (a
/// check every minute would otherwise keep half a million reports a year); returns the
/// report's id, which [`record`] gives its run.
pub async fn store_report(pool: &PgPool, report: &InvariantReport) -> Result<i64, sqlx::Error> {
    let json = serde_json::to_value(report)
        .unwrap_or_else(|_| serde_json::Value::Object(serde_json::Map::new()));
    let mut tx = pool.begin().await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO invariant_checks (ok, report) VALUES ($1, $2) RETURNING id",
    )
    .bind(report.ok)
    .bind(&json)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM invariant_checks WHERE ok AND id <= $1 - $2")
        .bind(id)
        .bind(RUNS_KEPT)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(id)
}

/// Records one run that decided, naming its full report (`report_id`, from [`store_report`]),
/// and prunes the history to its bound, in one transaction.
pub async fn record(
    pool: &PgPool,
    report: &InvariantReport,
    took: Duration,
    report_id: Option<i64>,
) -> Result<(), sqlx::Error> {
    let assets: Vec<AssetResult> = report
        .assets
        .iter()
        .map(|a| AssetResult {
            asset: a.asset.clone(),
            ok: a.ok,
            difference: a.difference.normalize().to_string(),
        })
        .collect();
    let violations = report.assets.iter().filter(|a| !a.ok).count() + report.disagreements.len();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO invariant_runs
           (checked_at, mode, ok, duration_ms, violations, assets, report_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(report.checked_at)
    .bind(mode_name(report.mode))
    .bind(report.ok)
    .bind(i64::try_from(took.as_millis()).unwrap_or(i64::MAX))
    .bind(i32::try_from(violations).unwrap_or(i32::MAX))
    .bind(sqlx::types::Json(&assets))
    .bind(report_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "DELETE FROM invariant_runs
         WHERE ok AND id <= (SELECT max(id) FROM invariant_runs) - $1",
    )
    .bind(RUNS_KEPT)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

type RunRow = (
    i64,
    DateTime<Utc>,
    String,
    bool,
    i64,
    i32,
    sqlx::types::Json<Vec<AssetResult>>,
    bool,
);

/// The newest runs first, at most `limit` (1 to [`RUNS_READ_MAX`]).
pub async fn recent(pool: &PgPool, limit: i64) -> Result<Vec<Run>, sqlx::Error> {
    let rows: Vec<RunRow> = sqlx::query_as(
        "SELECT r.id, r.checked_at, r.mode, r.ok, r.duration_ms, r.violations, r.assets,
                c.id IS NOT NULL
         FROM invariant_runs r LEFT JOIN invariant_checks c ON c.id = r.report_id
         ORDER BY r.id DESC LIMIT $1",
    )
    .bind(limit.clamp(1, RUNS_READ_MAX))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, checked_at, mode, ok, duration_ms, violations, assets, has_report)| Run {
                id,
                checked_at,
                mode: if mode == "full" {
                    Mode::Full
                } else {
                    Mode::Incremental
                },
                ok,
                duration_ms,
                violations,
                assets: assets.0,
                has_report,
            },
        )
        .collect())
}

/// The newest run, if any.
pub async fn last(pool: &PgPool) -> Result<Option<Run>, sqlx::Error> {
    Ok(recent(pool, 1).await?.into_iter().next())
}

/// The full report of run `run_id`, as the check returned it (`None` when the run or its
/// report has been pruned, or the run predates the link).
pub async fn report(pool: &PgPool, run_id: i64) -> Result<Option<serde_json::Value>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT c.report FROM invariant_runs r JOIN invariant_checks c ON c.id = r.report_id
         WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await
}
