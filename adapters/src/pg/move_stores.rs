//! `application::moves::PartitionStores` over the cells' PostgreSQL databases (ADR 0023 §4-§6):
//! the partition states (`PgMoves`), the copies (`move_copy`), the books the check before the
//! switch compares, each cell's conservation check, and the switch itself, which flips every
//! cell's map row in one transaction per cell (`partition_switch`, migration 0030: the target
//! first, then the source, then the others) and appends `PartitionMoved` to the target's and the
//! source's logs.

use std::collections::BTreeMap;
use std::str::FromStr;

use application::moves::{
    Copied, Freeze, HistoryPrefix, MoveId, MoveRecord, PartitionBook, PartitionStores,
};
use application::StoreError;
use async_trait::async_trait;
use cells::{CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;
use serde_json::json;
use sqlx::PgPool;

use super::driver::store;
use super::move_copy::{copy_events, copy_state};
use super::moves::PgMoves;
use crate::cell_set::CellSet;
use crate::funding::FundingLedger;
use crate::spot::SpotAdapter;

/// Source feed positions one copy batch reads at most.
const EVENTS_WINDOW: i64 = 20_000;

/// One cell as a move reaches it: its database (through its FUNDING ledger) and its
/// spot-core's adapter, for the cell's conservation check.
#[derive(Clone)]
pub struct MoveCell {
    pub funding: FundingLedger,
    pub spot: SpotAdapter,
}

impl MoveCell {
    pub(super) fn pool(&self) -> &PgPool {
        self.funding.pool()
    }
}

/// The cells of a map, as a move's stores.
#[derive(Clone)]
pub struct PgPartitionStores {
    pub(super) cells: CellSet<MoveCell>,
    /// One switch at a time in this process: each takes a map version above every cell's.
    pub(super) switching: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl PgPartitionStores {
    pub fn new(cells: BTreeMap<CellId, MoveCell>) -> Self {
        Self {
            cells: CellSet::new(cells),
            switching: std::sync::Arc::default(),
        }
    }

    /// The version a switch writes: above every cell's, and at least the one the move planned.
    /// Two moves planned on one map would otherwise switch to the same version, and a process
    /// that reloaded after the first would never take the second (ADR 0023 §1).
    pub(super) async fn next_version(&self, planned: u64) -> Result<i64, StoreError> {
        let mut version = i64::try_from(planned).map_err(StoreError::new)?;
        for (_, cell) in self.cells.all() {
            let held: i64 = sqlx::query_scalar("SELECT map_version FROM cell_identity")
                .fetch_one(cell.pool())
                .await
                .map_err(store)?;
            version = version.max(held + 1);
        }
        Ok(version)
    }

    /// Refuses unless this process reaches every cell the map names (the cells owning a
    /// partition in `cell`'s map). A process that did not reach a cell at start-up must not
    /// freeze or switch: its switch would leave that cell on the older map, under a version
    /// computed without it that another switch may already have written there (two maps under
    /// one version: found by `chaos --cells 3 --net-faults 3`). The step is retried, and a
    /// process that reaches every cell drives the move meanwhile.
    async fn every_cell_reached(&self, cell: CellId) -> Result<(), StoreError> {
        let named: Vec<i32> =
            sqlx::query_scalar("SELECT DISTINCT cell_id FROM cell_partitions ORDER BY cell_id")
                .fetch_all(self.cell(cell)?.pool())
                .await
                .map_err(store)?;
        let ids = self.cells.ids();
        let reached = |c: &i32| ids.iter().any(|k| i32::from(k.get()) == *c);
        match named.iter().find(|c| !reached(c)) {
            Some(missing) => Err(StoreError::new(format!(
                "cell {missing} of the map is not reached by this process: a move pauses and \
                 switches only in a process that reaches every cell"
            ))),
            None => Ok(()),
        }
    }

    fn cell(&self, id: CellId) -> Result<MoveCell, StoreError> {
        self.cells
            .get(id)
            .ok_or_else(|| StoreError::new(format!("cell {id} is not in this process's map")))
    }

    fn moves(&self, id: CellId) -> Result<PgMoves, StoreError> {
        Ok(PgMoves::new(self.cell(id)?.pool().clone()))
    }

    /// The latest signed checkpoint of `cell`'s log (size and base64 root), if it has one.
    async fn checkpoint(&self, cell: CellId) -> Result<serde_json::Value, StoreError> {
        let row: Option<(i64, String)> = sqlx::query_as(
            "SELECT size, encode(root, 'base64') FROM tlog_checkpoints ORDER BY size DESC LIMIT 1",
        )
        .fetch_optional(self.cell(cell)?.pool())
        .await
        .map_err(store)?;
        Ok(row.map_or(
            serde_json::Value::Null,
            |(size, root)| json!({"size": size, "root": root}),
        ))
    }
}

/// A partition's FUNDING accounts in one cell: (user, asset, balance).
async fn funding_rows(pool: &PgPool, p: i16) -> Result<Vec<(i64, String, Decimal)>, StoreError> {
    sqlx::query_as("SELECT user_id, asset, balance FROM funding_accounts WHERE partition = $1")
        .bind(p)
        .fetch_all(pool)
        .await
        .map_err(store)
}

fn user_of(n: i64) -> Result<UserId, StoreError> {
    u64::try_from(n)
        .ok()
        .and_then(|n| UserId::new(n).ok())
        .ok_or_else(|| StoreError::new(format!("user id {n}")))
}

/// A cell's history of partition `p`'s users (those with FUNDING accounts, as `book` reads
/// them) up to position `upto`.
async fn prefix(pool: &PgPool, p: i16, upto: i64) -> Result<HistoryPrefix, StoreError> {
    let mut users: Vec<i64> = funding_rows(pool, p)
        .await?
        .into_iter()
        .map(|r| r.0)
        .collect();
    users.sort_unstable();
    users.dedup();
    Ok(HistoryPrefix {
        upto,
        history: fingerprints(pool, &users, 0, upto).await?,
    })
}

/// Per user of `users`, the fingerprint of their events at positions in `(after, upto]`.
async fn fingerprints(
    pool: &PgPool,
    users: &[i64],
    after: i64,
    upto: i64,
) -> Result<BTreeMap<UserId, String>, StoreError> {
    let mut history = BTreeMap::new();
    for (u, print) in eventlog::copies::history_fingerprints(pool, users, after, upto)
        .await
        .map_err(store)?
    {
        history.insert(user_of(u)?, print);
    }
    Ok(history)
}

/// The marks' names in a move's record.
const EVENTS_MARK: &str = "events";
const JOURNAL_MARK: &str = "funding_journal";

#[async_trait]
impl PartitionStores for PgPartitionStores {
    async fn mark_incoming(
        &self,
        cell: CellId,
        partition: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError> {
        let state = self.moves(cell)?.mark_incoming(partition, id).await?;
        let marked: Option<String> =
            sqlx::query_scalar("SELECT move_id FROM cell_partitions WHERE partition = $1")
                .bind(i16::from(partition.get()))
                .fetch_one(self.cell(cell)?.pool())
                .await
                .map_err(store)?;
        if state == "INCOMING" && marked.as_deref() == Some(id.0.as_str()) {
            Ok(())
        } else {
            Err(StoreError::new(format!(
                "cell {cell} cannot take partition {partition} for move {id}: it is {state} there"
            )))
        }
    }

    async fn copy_batch(&self, record: &MoveRecord) -> Result<Copied, StoreError> {
        let (source, target) = (self.cell(record.from)?, self.cell(record.to)?);
        let mark = |name: &str| record.marks.get(name).copied().unwrap_or(0);
        let events = copy_events(
            source.pool(),
            target.pool(),
            &record.id,
            record.partition,
            record.from,
            mark(EVENTS_MARK),
            EVENTS_WINDOW,
        )
        .await?;
        let mut marks = record.marks.clone();
        marks.insert(EVENTS_MARK.to_owned(), events.mark);
        let mut rows = events.rows;
        let mut at_end = events.at_end;
        if at_end {
            // The state rows once the events reached the head: each pass copies them as they
            // are then (the one under the freeze is exact).
            let state = copy_state(
                source.pool(),
                target.pool(),
                &record.id,
                record.partition,
                mark(JOURNAL_MARK),
            )
            .await?;
            rows += state.rows;
            marks.insert(JOURNAL_MARK.to_owned(), state.journal_mark);
            // At the end as of this batch's reads: a pass under steady writes ends too, and the
            // next pass (or the one under the freeze) takes what came meanwhile.
            at_end = !state.journal_more;
        }
        Ok(Copied {
            rows,
            marks,
            at_end,
        })
    }

    async fn freeze(&self, record: &MoveRecord) -> Result<Freeze, StoreError> {
        self.every_cell_reached(record.from).await?;
        let (state, open) = self
            .moves(record.from)?
            .freeze(record.partition, &record.id)
            .await?;
        match state.as_str() {
            "FROZEN" => Ok(Freeze::Frozen),
            "DRAINING" => Ok(Freeze::Draining { open }),
            other => Err(StoreError::new(format!(
                "partition {} is {other} in cell {}: not this move's to freeze",
                record.partition, record.from
            ))),
        }
    }

    async fn unfreeze(&self, cell: CellId, partition: Partition) -> Result<(), StoreError> {
        self.moves(cell)?.unfreeze(partition).await
    }

    async fn void_incoming(
        &self,
        cell: CellId,
        partition: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError> {
        self.moves(cell)?.release(partition, id).await?;
        let forgot = eventlog::copies::forget_open_copies(self.cell(cell)?.pool(), &id.0)
            .await
            .map_err(store)?;
        if forgot > 0 {
            tracing::info!(cell = %cell, move_id = %id, forgot, "a void move's open copies are no longer tracked");
        }
        Ok(())
    }

    async fn book(
        &self,
        cell: CellId,
        partition: Partition,
        after: i64,
    ) -> Result<PartitionBook, StoreError> {
        let reached = self.cell(cell)?;
        let pool = reached.pool();
        let p = i16::from(partition.get());
        let mut book = PartitionBook::default();
        let mut users: Vec<i64> = Vec::new();
        for (u, asset, balance) in funding_rows(pool, p).await? {
            users.push(u);
            book.funding.insert((user_of(u)?, asset), balance);
        }
        users.sort_unstable();
        users.dedup();
        for (u, asset, amount) in eventlog::copies::partition_in_flight(pool, i32::from(p))
            .await
            .map_err(store)?
        {
            let amount = Decimal::from_str(&amount).map_err(StoreError::new)?;
            book.in_flight.insert((user_of(u)?, asset), amount);
        }
        book.history = fingerprints(pool, &users, after, i64::MAX).await?;
        Ok(book)
    }

    async fn history_prefixes(
        &self,
        record: &MoveRecord,
    ) -> Result<(HistoryPrefix, HistoryPrefix), StoreError> {
        let p = i16::from(record.partition.get());
        let source_upto = record.marks.get(EVENTS_MARK).copied().unwrap_or(0);
        let (source, target) = (self.cell(record.from)?, self.cell(record.to)?);
        let (source, target) = (source.pool(), target.pool());
        let target_upto = eventlog::feed::head(target).await.map_err(store)?;
        // The two cells' reads are independent: side by side.
        let (source, target) = futures_util::future::join(
            prefix(source, p, source_upto),
            prefix(target, p, target_upto),
        )
        .await;
        let (source, target) = (source?, target?);
        Ok((source, target))
    }

    async fn conservation_exact(&self, cell: CellId) -> Result<bool, StoreError> {
        let c = self.cell(cell)?;
        let started = std::time::Instant::now();
        let report = super::check_incremental(&c.funding, &c.spot)
            .await
            .map_err(|e| StoreError::new(format!("cell {cell}'s conservation check: {e}")))?;
        tracing::debug!(cell = %cell, took_ms = started.elapsed().as_millis(), "a cell's conservation check for a move");
        if !report.ok {
            tracing::error!(cell = %cell, ?report, "a cell's conservation check is not exact during a move");
        }
        Ok(report.ok)
    }

    async fn switch(&self, record: &MoveRecord) -> Result<(), StoreError> {
        // The lock first: a cell added meanwhile (`cell_add.rs`) is in the order below.
        let _one = self.switching.lock().await;
        let mut order = vec![record.to, record.from];
        order.extend(
            self.cells
                .ids()
                .into_iter()
                .filter(|c| *c != record.to && *c != record.from),
        );
        self.every_cell_reached(record.to).await?;
        let to = i32::from(record.to.get());
        let version = self.next_version(record.map_version).await?;
        let source_checkpoint = self.checkpoint(record.from).await?;
        for cell in order {
            let mut tx = self.cell(cell)?.pool().begin().await.map_err(store)?;
            // `PartitionMoved` first: its append takes the feed's lock, and every appender takes
            // the feed's lock before the fence's (its events' trigger); the flip takes the
            // fence's lock, so taking them in the appenders' order cannot deadlock with them.
            if cell == record.to || cell == record.from {
                let payload = json!({"PartitionMoved": {
                    "partition": record.partition.get(),
                    "from_cell": record.from.get(),
                    "to_cell": record.to.get(),
                    "map_version": version,
                    "move_id": record.id.0,
                    "source_checkpoint": source_checkpoint,
                    "events": {
                        "through": record.marks.get(EVENTS_MARK).copied().unwrap_or(0),
                        "copied": record.copied,
                    },
                }});
                eventlog::copies::append_partition_moved(&mut tx, &record.id.0, &payload)
                    .await
                    .map_err(store)?;
            }
            sqlx::query("SELECT partition_switch($1, $2, $3, $4)")
                .bind(i32::from(record.partition.get()))
                .bind(&record.id.0)
                .bind(to)
                .bind(version)
                .execute(&mut *tx)
                .await
                .map_err(store)?;
            tx.commit().await.map_err(store)?;
        }
        Ok(())
    }
}
