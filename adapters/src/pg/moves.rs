//! A cell's side of a partition move (ADR 0023, migration 0029, written only here): the moves'
//! records (`application::moves::MoveRecords` over `partition_moves`) and the partition's states
//! in `cell_partitions` that the fence reads: INCOMING in the target while it copies, FROZEN in
//! the source under the fence's exclusive lock, back to STEADY on a cancel. The fence itself is
//! the database's (`partition_fence`, a statement trigger on every table a user's money or
//! events land in), so no writer can forget it; [`is_fenced`] tells its refusal apart.

use std::collections::BTreeMap;

use application::moves::{HistoryCut, MoveId, MoveRecord, MoveRecords, MoveStep, Started};
use application::StoreError;
use async_trait::async_trait;
use cells::{CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::driver::store;

/// Whether `e` is the fence's refusal: nothing of the statement was written; the request is
/// routed again under the current map.
pub use eventlog::append::is_fenced;

/// The moves' records and the partition states of one cell's PostgreSQL.
#[derive(Clone)]
pub struct PgMoves {
    pool: PgPool,
}

/// What `partition_moves.record` keeps besides the columns.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Progress {
    marks: BTreeMap<String, i64>,
    copied: u64,
    last_pass: u64,
    passes: u32,
    spot: Option<Vec<(u64, String, Decimal)>>,
    /// The pause's history cut: (source position, target position).
    #[serde(default)]
    history_cut: Option<(i64, i64)>,
    cancelled_at: Option<String>,
    reason: Option<String>,
}

impl PgMoves {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Marks `partition` INCOMING for move `id` in this (the target) cell, unless it is already
    /// this cell's or marked for this move. Answers the state it leaves.
    pub async fn mark_incoming(
        &self,
        partition: Partition,
        id: &MoveId,
    ) -> Result<String, StoreError> {
        sqlx::query(
            "UPDATE cell_partitions cp SET state = 'INCOMING', move_id = $2
             FROM cell_identity ci
             WHERE cp.partition = $1 AND cp.cell_id <> ci.cell_id AND cp.state = 'STEADY'",
        )
        .bind(i16::from(partition.get()))
        .bind(&id.0)
        .execute(&self.pool)
        .await
        .map_err(store)?;
        self.state(partition).await
    }

    /// Drains, then freezes, `partition` for move `id` in this (the source) cell, each under
    /// the fence's exclusive lock, only while the move's record here is at `PAUSING`: DRAINING
    /// refuses anything new of the partition's users, FROZEN (once none of its transfers is
    /// open) every write. Answers the state it leaves and the partition's open transfers.
    pub async fn freeze(
        &self,
        partition: Partition,
        id: &MoveId,
    ) -> Result<(String, u64), StoreError> {
        for step_sql in [
            "SELECT partition_drain($1, $2)",
            "SELECT partition_freeze($1, $2)",
        ] {
            let mut tx = self.pool.begin().await.map_err(store)?;
            let step: Option<String> =
                sqlx::query_scalar("SELECT step FROM partition_moves WHERE id = $1 FOR UPDATE")
                    .bind(&id.0)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(store)?;
            if step.as_deref() == Some(MoveStep::Pausing.as_str()) {
                sqlx::query(step_sql)
                    .bind(i32::from(partition.get()))
                    .bind(&id.0)
                    .execute(&mut *tx)
                    .await
                    .map_err(store)?;
            }
            tx.commit().await.map_err(store)?;
        }
        let open: i64 = sqlx::query_scalar("SELECT partition_open_transfers($1)")
            .bind(i32::from(partition.get()))
            .fetch_one(&self.pool)
            .await
            .map_err(store)?;
        Ok((
            self.state(partition).await?,
            u64::try_from(open).unwrap_or(0),
        ))
    }

    /// This cell's partition is STEADY again if move `id` drained, froze or marked it (a
    /// cancel).
    pub async fn release(&self, partition: Partition, id: &MoveId) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE cell_partitions SET state = 'STEADY', move_id = NULL
             WHERE partition = $1 AND move_id = $2",
        )
        .bind(i16::from(partition.get()))
        .bind(&id.0)
        .execute(&self.pool)
        .await
        .map_err(store)?;
        Ok(())
    }

    /// This cell's partition is STEADY again if a move drained or froze it here (a cancel of
    /// the move that did: only one move of a partition is ever open).
    pub async fn unfreeze(&self, partition: Partition) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE cell_partitions cp SET state = 'STEADY', move_id = NULL
             FROM cell_identity ci
             WHERE cp.partition = $1 AND cp.cell_id = ci.cell_id
               AND cp.state IN ('DRAINING', 'FROZEN')",
        )
        .bind(i16::from(partition.get()))
        .execute(&self.pool)
        .await
        .map_err(store)?;
        Ok(())
    }

    /// The partition's state here: STEADY, DRAINING, FROZEN or INCOMING, and `MOVED` when another cell
    /// owns it and this one is not receiving it.
    pub async fn state(&self, partition: Partition) -> Result<String, StoreError> {
        let (owner, state, me): (i32, String, i32) = sqlx::query_as(
            "SELECT cp.cell_id, cp.state, ci.cell_id FROM cell_partitions cp, cell_identity ci
             WHERE cp.partition = $1",
        )
        .bind(i16::from(partition.get()))
        .fetch_one(&self.pool)
        .await
        .map_err(store)?;
        Ok(if owner != me && state == "STEADY" {
            "MOVED".to_owned()
        } else {
            state
        })
    }
}

fn record_of(
    row: (String, i16, i32, i32, String, i64, serde_json::Value),
) -> Result<MoveRecord, StoreError> {
    let (id, partition, from, to, step, version, record) = row;
    let bad = |what: &str| StoreError::new(format!("partition_moves {id}: {what}"));
    let progress: Progress = serde_json::from_value(record).map_err(|e| bad(&e.to_string()))?;
    let cell = |n: i32| {
        u64::try_from(n)
            .ok()
            .and_then(CellId::new)
            .ok_or_else(|| bad("cell"))
    };
    let spot = match progress.spot {
        None => None,
        Some(rows) => {
            let mut map = BTreeMap::new();
            for (user, asset, amount) in rows {
                map.insert((UserId::new(user).map_err(|_| bad("user"))?, asset), amount);
            }
            Some(map)
        }
    };
    Ok(MoveRecord {
        partition: u64::try_from(partition)
            .ok()
            .and_then(Partition::new)
            .ok_or_else(|| bad("partition"))?,
        from: cell(from)?,
        to: cell(to)?,
        step: MoveStep::parse(&step).ok_or_else(|| bad("step"))?,
        map_version: u64::try_from(version).map_err(|_| bad("map_version"))?,
        marks: progress.marks,
        copied: progress.copied,
        last_pass: progress.last_pass,
        passes: progress.passes,
        spot,
        history_cut: progress
            .history_cut
            .map(|(source, target)| HistoryCut { source, target }),
        cancelled_at: match progress.cancelled_at {
            None => None,
            Some(s) => Some(MoveStep::parse(&s).ok_or_else(|| bad("cancelled_at"))?),
        },
        reason: progress.reason,
        id: MoveId(id),
    })
}

fn progress_of(record: &MoveRecord) -> serde_json::Value {
    let progress = Progress {
        marks: record.marks.clone(),
        copied: record.copied,
        last_pass: record.last_pass,
        passes: record.passes,
        spot: record.spot.as_ref().map(|m| {
            m.iter()
                .map(|((u, a), v)| (u.get(), a.clone(), *v))
                .collect()
        }),
        history_cut: record.history_cut.map(|c| (c.source, c.target)),
        cancelled_at: record.cancelled_at.map(|s| s.as_str().to_owned()),
        reason: record.reason.clone(),
    };
    serde_json::to_value(progress).expect("a move's progress is plain data")
}

const COLUMNS: &str = "id, partition, from_cell, to_cell, step, map_version, record";

#[async_trait]
impl MoveRecords for PgMoves {
    async fn start(&self, record: &MoveRecord) -> Result<Started, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO partition_moves (id, partition, from_cell, to_cell, step, map_version, record)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT DO NOTHING",
        )
        .bind(&record.id.0)
        .bind(i16::from(record.partition.get()))
        .bind(i32::from(record.from.get()))
        .bind(i32::from(record.to.get()))
        .bind(record.step.as_str())
        .bind(i64::try_from(record.map_version).map_err(StoreError::new)?)
        .bind(progress_of(record))
        .execute(&self.pool)
        .await
        .map_err(store)?
        .rows_affected();
        if inserted == 1 {
            return Ok(Started::Recorded);
        }
        let other: Option<String> = sqlx::query_scalar(
            "SELECT id FROM partition_moves
             WHERE (partition = $1 AND step NOT IN ('DONE', 'CANCELLED')) OR id = $2
             ORDER BY id = $2 DESC LIMIT 1",
        )
        .bind(i16::from(record.partition.get()))
        .bind(&record.id.0)
        .fetch_optional(&self.pool)
        .await
        .map_err(store)?;
        match other {
            Some(id) if id == record.id.0 => Ok(Started::Recorded),
            Some(id) => Ok(Started::Busy(MoveId(id))),
            None => Err(StoreError::new(
                "the move was neither recorded nor refused; retry",
            )),
        }
    }

    async fn load(&self, id: &MoveId) -> Result<Option<MoveRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM partition_moves WHERE id = $1");
        let row = sqlx::query_as(&sql)
            .bind(&id.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(store)?;
        row.map(record_of).transpose()
    }

    async fn unfinished(&self) -> Result<Vec<MoveRecord>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM partition_moves WHERE step NOT IN ('DONE', 'CANCELLED') ORDER BY created_at"
        );
        let rows = sqlx::query_as(&sql)
            .fetch_all(&self.pool)
            .await
            .map_err(store)?;
        rows.into_iter().map(record_of).collect()
    }

    async fn recent(&self, limit: usize) -> Result<Vec<MoveRecord>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM partition_moves ORDER BY created_at DESC LIMIT $1");
        let rows = sqlx::query_as(&sql)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(store)?;
        rows.into_iter().map(record_of).collect()
    }

    async fn save(&self, expected: MoveStep, record: &MoveRecord) -> Result<bool, StoreError> {
        let saved = sqlx::query(
            "UPDATE partition_moves SET step = $3, record = $4, updated_at = now()
             WHERE id = $1 AND step = $2",
        )
        .bind(&record.id.0)
        .bind(expected.as_str())
        .bind(record.step.as_str())
        .bind(progress_of(record))
        .execute(&self.pool)
        .await
        .map_err(store)?
        .rows_affected();
        Ok(saved == 1)
    }
}
