//! The run history of the fund-conservation check (`invariant_runs`, migration 0017): every run
//! that decided, periodic or on demand, incremental or full, with its mode, result, duration,
//! violation count and per-asset result, for the operators' overview and conservation pages.
//! Bounded: each record removes the passing runs older than the newest [`RUNS_KEPT`]; failing
//! runs (each one halts the service) are all kept.

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
    pub checked_at: DateTime<Utc>,
    pub mode: Mode,
    pub ok: bool,
    pub duration_ms: i64,
    /// Assets out of balance plus transfers whose records disagree with their events.
    pub violations: i32,
    pub assets: Vec<AssetResult>,
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Incremental => "incremental",
        Mode::Full => "full",
    }
}

/// Records one run that decided and prunes the history to its bound, in one transaction.
pub async fn record(
    pool: &PgPool,
    report: &InvariantReport,
    took: Duration,
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
        "INSERT INTO invariant_runs (checked_at, mode, ok, duration_ms, violations, assets)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(report.checked_at)
    .bind(mode_name(report.mode))
    .bind(report.ok)
    .bind(i64::try_from(took.as_millis()).unwrap_or(i64::MAX))
    .bind(i32::try_from(violations).unwrap_or(i32::MAX))
    .bind(sqlx::types::Json(&assets))
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
    DateTime<Utc>,
    String,
    bool,
    i64,
    i32,
    sqlx::types::Json<Vec<AssetResult>>,
);

/// The newest runs first, at most `limit` (1 to [`RUNS_READ_MAX`]).
pub async fn recent(pool: &PgPool, limit: i64) -> Result<Vec<Run>, sqlx::Error> {
    let rows: Vec<RunRow> = sqlx::query_as(
        "SELECT checked_at, mode, ok, duration_ms, violations, assets
         FROM invariant_runs ORDER BY id DESC LIMIT $1",
    )
    .bind(limit.clamp(1, RUNS_READ_MAX))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(checked_at, mode, ok, duration_ms, violations, assets)| Run {
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
            },
        )
        .collect())
}

/// The newest run, if any.
pub async fn last(pool: &PgPool) -> Result<Option<Run>, sqlx::Error> {
    Ok(recent(pool, 1).await?.into_iter().next())
}
