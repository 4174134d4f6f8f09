//! The incremental audit's durable checkpoint (migration 0010): the positions below which
//! everything was consumed, the per-asset sums of what was consumed, and the consumed applied
//! movements of every req_id not yet settled. Stored in one transaction, guarded by a version so
//! that of two runs started from the same checkpoint only one stores its result (the other's
//! report is still exact; it is simply not kept).

use std::collections::BTreeMap;

use adapters::applied::AppliedMovement;
use domain::{AccountType, Operation};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// Everything consumed so far. `Checkpoint::default()` is the start of history (a full check).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The version read (0: none stored yet).
    pub version: i64,
    /// Every event whose transaction id is below this is consumed.
    pub events_horizon: u64,
    /// Every funding journal row and external deposit whose transaction id is below this is
    /// consumed.
    pub funding_horizon: u64,
    /// spot-core's journal is consumed up to this seq.
    pub spot_seq: u64,
    /// Transfers created below `events_horizon`.
    pub transfers: u64,
    /// Per asset: (external deposits, in-flight reconciled from applied movements).
    pub assets: BTreeMap<String, (Decimal, Decimal)>,
    /// The consumed applied movements of every req_id not settled (possibly none yet).
    pub open: BTreeMap<String, Vec<AppliedMovement>>,
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

/// Why a stored checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("reading or storing the audit checkpoint")]
    Database(#[from] sqlx::Error),
    #[error("the stored audit checkpoint is unreadable: {0}")]
    Unreadable(String),
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
pub async fn load(pool: &PgPool) -> Result<Checkpoint, CheckpointError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let checkpoint = load_in(&mut tx).await;
    tx.rollback().await?;
    checkpoint
}

async fn load_in(tx: &mut sqlx::PgConnection) -> Result<Checkpoint, CheckpointError> {
    let row: Option<(i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT version, events_horizon::text::bigint, funding_horizon::text::bigint, spot_seq,
                transfers
         FROM audit_checkpoint WHERE id = 1",
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some((version, events, funding, spot, transfers)) = row else {
        return Ok(Checkpoint::default());
    };
    let assets: Vec<(String, Decimal, Decimal)> =
        sqlx::query_as("SELECT asset, deposits, in_flight FROM audit_checkpoint_assets")
            .fetch_all(&mut *tx)
            .await?;
    let open: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT req_id, applied FROM audit_checkpoint_open")
            .fetch_all(&mut *tx)
            .await?;
    let mut checkpoint = Checkpoint {
        version,
        events_horizon: position(events, "events_horizon")?,
        funding_horizon: position(funding, "funding_horizon")?,
        spot_seq: position(spot, "spot_seq")?,
        transfers: position(transfers, "transfers")?,
        assets: assets
            .into_iter()
            .map(|(asset, deposits, in_flight)| (asset, (deposits, in_flight)))
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
pub async fn store(pool: &PgPool, read: i64, next: &Checkpoint) -> Result<bool, CheckpointError> {
    let mut tx = pool.begin().await?;
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
    .await?
    .rows_affected()
        == 1;
    if !claimed {
        tx.rollback().await?;
        return Ok(false);
    }
    store_assets(&mut tx, next).await?;
    store_open(&mut tx, next).await?;
    tx.commit().await?;
    Ok(true)
}

/// The per-asset sums, rewritten whole.
async fn store_assets(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    next: &Checkpoint,
) -> Result<(), CheckpointError> {
    sqlx::query("DELETE FROM audit_checkpoint_assets")
        .execute(&mut **tx)
        .await?;
    let (names, sums): (Vec<&str>, Vec<(Decimal, Decimal)>) = next
        .assets
        .iter()
        .map(|(asset, sums)| (asset.as_str(), *sums))
        .unzip();
    let (deposits, in_flight): (Vec<Decimal>, Vec<Decimal>) = sums.into_iter().unzip();
    sqlx::query(
        "INSERT INTO audit_checkpoint_assets (asset, deposits, in_flight)
         SELECT * FROM UNNEST($1::text[], $2::numeric[], $3::numeric[])",
    )
    .bind(&names)
    .bind(&deposits)
    .bind(&in_flight)
    .execute(&mut **tx)
    .await?;
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
        .await?;
    let mut ids = Vec::with_capacity(next.open.len());
    let mut applied = Vec::with_capacity(next.open.len());
    for (req_id, movements) in &next.open {
        let stored: Vec<Stored> = movements
            .iter()
            .map(|m| Stored {
                system: m.system,
                op: super::reconcile::op_name(m.operation).to_owned(),
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
    .await?;
    Ok(())
}
