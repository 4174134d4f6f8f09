//! The conservation check's records in PostgreSQL: `application::audit::Checkpoints` and
//! `application::audit::history::AuditHistory`.
//!
//! - the incremental audit's checkpoint (`audit_checkpoint`, `audit_checkpoint_assets`,
//!   `audit_checkpoint_open`; migration 0010), stored in one transaction under a version;
//! - each check's full report (`invariant_checks`, migration 0003) and every run that decided
//!   (`invariant_runs`, migrations 0017 and 0023), both bounded to `RUNS_KEPT` passing rows;
//! - the periodic check's health (`audit_status`, migration 0010), cluster-wide so every
//!   instance's `/metrics` reports the same figures.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use application::audit::history::{AssetResult, AuditHistory, Run, RUNS_KEPT, RUNS_READ_MAX};
use application::audit::status::AuditHealth;
use application::audit::{Checkpoint, CheckpointError, Checkpoints, InvariantReport, Mode};
use application::books::AppliedMovement;
use application::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use domain::{AccountType, Operation};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::driver::store;

/// The conservation check's records in PostgreSQL.
#[derive(Clone)]
pub struct PgAudit {
    pool: PgPool,
}

impl PgAudit {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl Checkpoints for PgAudit {
    async fn load_checkpoint(&self) -> Result<Checkpoint, CheckpointError> {
        load(&self.pool).await
    }

    async fn store_checkpoint(
        &self,
        read: i64,
        next: &Checkpoint,
    ) -> Result<bool, CheckpointError> {
        store_checkpoint(&self.pool, read, next).await
    }
}

#[async_trait]
impl AuditHistory for PgAudit {
    async fn store_report(&self, report: &InvariantReport) -> Result<i64, StoreError> {
        store_report(&self.pool, report).await.map_err(store)
    }

    async fn record_run(
        &self,
        report: &InvariantReport,
        took: Duration,
        report_id: Option<i64>,
    ) -> Result<(), StoreError> {
        record(&self.pool, report, took, report_id)
            .await
            .map_err(store)
    }

    async fn recent_runs(&self, limit: i64) -> Result<Vec<Run>, StoreError> {
        recent(&self.pool, limit).await.map_err(store)
    }

    async fn report(&self, run_id: i64) -> Result<Option<serde_json::Value>, StoreError> {
        report(&self.pool, run_id).await.map_err(store)
    }

    async fn health(&self) -> Result<AuditHealth, StoreError> {
        health(&self.pool).await.map_err(store)
    }

    async fn record_decided(&self, took: Duration) -> Result<(), StoreError> {
        record_decided(&self.pool, took).await.map_err(store)
    }

    async fn record_failed(&self, took: Duration, error: &str) -> Result<(), StoreError> {
        record_failed(&self.pool, took, error).await.map_err(store)
    }
}

/// A checkpoint read or write failed in the database.
fn db(e: sqlx::Error) -> CheckpointError {
    CheckpointError::Store(store(e))
}

/// One applied movement as stored in `audit_checkpoint_open.applied` (its req_id is the row's).
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    system: AccountType,
    op: String,
    user_id: i64,
    asset: String,
    #[serde(with = "rust_decimal::serde::str")]
    amount: Decimal,
}

fn op_from(name: &str) -> Result<Operation, CheckpointError> {
    match name {
        "withdraw" => Ok(Operation::Withdraw),
        "deposit" => Ok(Operation::Deposit),
        "refund" => Ok(Operation::Refund),
        other => Err(CheckpointError::Unreadable(format!(
            "unknown operation {other:?}"
        ))),
    }
}

/// An operation's name in the stored form (`op_from` reads it back).
fn op_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Withdraw => "withdraw",
        Operation::Deposit => "deposit",
        Operation::Refund => "refund",
    }
}

fn position(value: i64, name: &str) -> Result<u64, CheckpointError> {
    u64::try_from(value).map_err(|_| CheckpointError::Unreadable(format!("{name} is {value}")))
}

/// The stored checkpoint, or the start of history when none is stored.
///
/// Its three tables are read in one snapshot (a repeatable-read transaction): read one statement
/// at a time, a checkpoint stored by a concurrent run between two of them would pair this run's
/// positions with that run's open set. A req_id that run settled would then be missing from the
/// open set while its consumed movements lie below these positions, and a run reading its
/// terminal event again would report "COMMITTED, but no deposit was applied": a false violation
/// that halts transfers (seen with two ledgers' periodic checks overlapping under network
/// faults, ADR 0010).
async fn load(pool: &PgPool) -> Result<Checkpoint, CheckpointError> {
    let mut tx = pool.begin().await.map_err(db)?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    let checkpoint = load_in(&mut tx).await;
    tx.rollback().await.map_err(db)?;
    checkpoint
}

async fn load_in(tx: &mut sqlx::PgConnection) -> Result<Checkpoint, CheckpointError> {
    let row: Option<(i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT version, events_horizon::text::bigint, funding_horizon::text::bigint, spot_seq,
                transfers
         FROM audit_checkpoint WHERE id = 1",
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?;
    let Some((version, events, funding, spot, transfers)) = row else {
        return Ok(Checkpoint::default());
    };
    let assets: Vec<(String, Decimal, Decimal, Decimal)> =
        sqlx::query_as("SELECT asset, deposits, in_flight, moved FROM audit_checkpoint_assets")
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
    let open: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT req_id, applied FROM audit_checkpoint_open")
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
    let mut checkpoint = Checkpoint {
        version,
        events_horizon: position(events, "events_horizon")?,
        funding_horizon: position(funding, "funding_horizon")?,
        spot_seq: position(spot, "spot_seq")?,
        transfers: position(transfers, "transfers")?,
        assets: assets
            .iter()
            .map(|(asset, deposits, in_flight, _)| (asset.clone(), (*deposits, *in_flight)))
            .collect(),
        moved: assets
            .into_iter()
            .filter(|(_, _, _, moved)| !moved.is_zero())
            .map(|(asset, _, _, moved)| (asset, moved))
            .collect(),
        open: BTreeMap::new(),
    };
    for (req_id, applied) in open {
        let stored: Vec<Stored> = serde_json::from_value(applied)
            .map_err(|e| CheckpointError::Unreadable(format!("req_id {req_id}: {e}")))?;
        let movements = stored
            .into_iter()
            .map(|s| {
                Ok(AppliedMovement {
                    req_id: req_id.clone(),
                    system: s.system,
                    operation: op_from(&s.op)?,
                    user_id: s.user_id,
                    asset: s.asset,
                    amount: s.amount,
                })
            })
            .collect::<Result<_, CheckpointError>>()?;
        checkpoint.open.insert(req_id, movements);
    }
    Ok(checkpoint)
}

fn bigint(value: u64) -> i64 {
    // Transaction ids and seqs stay far below 2^63 (a counter at a billion a second needs three
    // centuries to get there).
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Stores `next` in place of the checkpoint `read` was loaded as. `false` when another run
/// stored one since (nothing is written then).
async fn store_checkpoint(
    pool: &PgPool,
    read: i64,
    next: &Checkpoint,
) -> Result<bool, CheckpointError> {
    let started = std::time::Instant::now();
    let mut tx = pool.begin().await.map_err(db)?;
    let claimed = if read == 0 {
        sqlx::query(
            "INSERT INTO audit_checkpoint
                 (id, version, events_horizon, funding_horizon, spot_seq, transfers)
             SELECT 1, 1, $1::text::xid8, $2::text::xid8, $3, $4 WHERE $5::bigint = 0
             ON CONFLICT (id) DO NOTHING",
        )
    } else {
        sqlx::query(
            "UPDATE audit_checkpoint
             SET version = version + 1, events_horizon = $1::text::xid8,
                 funding_horizon = $2::text::xid8, spot_seq = $3, transfers = $4,
                 updated_at = now()
             WHERE id = 1 AND version = $5",
        )
    }
    .bind(next.events_horizon.to_string())
    .bind(next.funding_horizon.to_string())
    .bind(bigint(next.spot_seq))
    .bind(bigint(next.transfers))
    .bind(read)
    .execute(&mut *tx)
    .await
    .map_err(db)?
    .rows_affected()
        == 1;
    if !claimed {
        tx.rollback().await.map_err(db)?;
        return Ok(false);
    }
    store_assets(&mut tx, next).await?;
    store_open(&mut tx, next).await?;
    tx.commit().await.map_err(db)?;
    tracing::debug!(
        open = next.open.len(),
        took_ms = started.elapsed().as_millis(),
        "the conservation check's checkpoint stored"
    );
    Ok(true)
}

/// The per-asset sums, rewritten whole.
async fn store_assets(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    next: &Checkpoint,
) -> Result<(), CheckpointError> {
    sqlx::query("DELETE FROM audit_checkpoint_assets")
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    let names: BTreeSet<&str> = next
        .assets
        .keys()
        .chain(next.moved.keys())
        .map(String::as_str)
        .collect();
    let names: Vec<&str> = names.into_iter().collect();
    let sums = |asset: &str| next.assets.get(asset).copied().unwrap_or_default();
    let deposits: Vec<Decimal> = names.iter().map(|a| sums(a).0).collect();
    let in_flight: Vec<Decimal> = names.iter().map(|a| sums(a).1).collect();
    let moved: Vec<Decimal> = names
        .iter()
        .map(|a| next.moved.get(*a).copied().unwrap_or_default())
        .collect();
    sqlx::query(
        "INSERT INTO audit_checkpoint_assets (asset, deposits, in_flight, moved)
         SELECT * FROM UNNEST($1::text[], $2::numeric[], $3::numeric[], $4::numeric[])",
    )
    .bind(&names)
    .bind(&deposits)
    .bind(&in_flight)
    .bind(&moved)
    .execute(&mut **tx)
    .await
    .map_err(db)?;
    Ok(())
}

/// The open req_ids and their applied movements.
async fn store_open(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    next: &Checkpoint,
) -> Result<(), CheckpointError> {
    // The open set is what is live (open transfers and open disagreements): rewriting it whole
    // costs what is live, not history.
    sqlx::query("DELETE FROM audit_checkpoint_open")
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    let mut ids = Vec::with_capacity(next.open.len());
    let mut applied = Vec::with_capacity(next.open.len());
    for (req_id, movements) in &next.open {
        let stored: Vec<Stored> = movements
            .iter()
            .map(|m| Stored {
                system: m.system,
                op: op_name(m.operation).to_owned(),
                user_id: m.user_id,
                asset: m.asset.clone(),
                amount: m.amount,
            })
            .collect();
        ids.push(req_id.as_str());
        applied.push(serde_json::to_value(stored).map_err(|e| {
            CheckpointError::Unreadable(format!("req_id {req_id} does not encode: {e}"))
        })?);
    }
    sqlx::query(
        "INSERT INTO audit_checkpoint_open (req_id, applied)
         SELECT * FROM UNNEST($1::text[], $2::jsonb[])",
    )
    .bind(&ids)
    .bind(&applied)
    .execute(&mut **tx)
    .await
    .map_err(db)?;
    Ok(())
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
async fn store_report(pool: &PgPool, report: &InvariantReport) -> Result<i64, sqlx::Error> {
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
async fn record(
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
async fn recent(pool: &PgPool, limit: i64) -> Result<Vec<Run>, sqlx::Error> {
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

/// The full report of run `run_id`, as the check returned it (`None` when the run or its
/// report has been pruned, or the run predates the link).
async fn report(pool: &PgPool, run_id: i64) -> Result<Option<serde_json::Value>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT c.report FROM invariant_runs r JOIN invariant_checks c ON c.id = r.report_id
         WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await
}

/// The stored health (the migration inserts its one row).
async fn health(pool: &PgPool) -> Result<AuditHealth, sqlx::Error> {
    let row: Option<HealthRow> = sqlx::query_as(
        "SELECT up, failures, last_duration_seconds, last_success_at,
                COALESCE(EXTRACT(EPOCH FROM last_success_at), 0)::float8
                    AS last_success_epoch_seconds,
                last_error
         FROM audit_status WHERE id = 1",
    )
    .fetch_optional(pool)
    .await?;
    Ok(row
        .map(
            |(up, failures, last_duration_seconds, last_success_at, epoch, last_error)| {
                AuditHealth {
                    up,
                    failures,
                    last_duration_seconds,
                    last_success_at,
                    last_success_epoch_seconds: epoch,
                    last_error,
                }
            },
        )
        .unwrap_or_default())
}

type HealthRow = (bool, i64, f64, Option<DateTime<Utc>>, f64, Option<String>);

/// Records a periodic run that decided.
async fn record_decided(pool: &PgPool, took: Duration) -> Result<(), sqlx::Error> {
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
async fn record_failed(pool: &PgPool, took: Duration, error: &str) -> Result<(), sqlx::Error> {
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
