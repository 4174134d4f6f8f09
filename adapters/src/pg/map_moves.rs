//! The moves' records of a whole map (ADR 0023 §4): each move is recorded in its source cell's
//! `partition_moves` (`PgMoves`), so a process that serves every cell reads and writes them
//! through the cell each move names. A move starts only when its source owns the partition,
//! STEADY, under the map version the move was planned on: a move planned on an old map is
//! refused, never left to retry a freeze that cannot happen.

use std::collections::BTreeMap;

use application::moves::{MoveId, MoveRecord, MoveRecords, MoveStep, Started};
use application::StoreError;
use async_trait::async_trait;
use cells::CellId;

use super::driver::store;
use super::moves::PgMoves;
use crate::cell_set::CellSet;

/// Every cell's moves' records.
#[derive(Clone)]
pub struct PgMapMoves {
    cells: CellSet<PgMoves>,
}

/// Why a move cannot start from the map it was planned on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("partition {partition} is not cell {cell}'s to move under map version {version}: {found}")]
pub struct NotOwned {
    pub partition: u8,
    pub cell: CellId,
    pub version: u64,
    pub found: String,
}

impl PgMapMoves {
    pub fn new(cells: BTreeMap<CellId, PgMoves>) -> Self {
        Self {
            cells: CellSet::new(cells),
        }
    }

    /// Cell `id`'s records too, from now on (a cell added while the process serves).
    pub fn add_cell(&self, id: CellId, moves: PgMoves) {
        self.cells.insert(id, moves);
    }

    fn cell(&self, id: CellId) -> Result<PgMoves, StoreError> {
        self.cells
            .get(id)
            .ok_or_else(|| StoreError::new(format!("cell {id} is not in this process's map")))
    }

    /// Whether `record.from` owns its partition, STEADY, at the version the move was planned
    /// on (`record.map_version - 1`); `Err(NotOwned)` says what it found instead.
    pub async fn check_owner(
        &self,
        record: &MoveRecord,
    ) -> Result<Result<(), NotOwned>, StoreError> {
        let row: Option<(i32, String, i64)> = sqlx::query_as(
            "SELECT cp.cell_id, cp.state, ci.map_version
             FROM cell_partitions cp, cell_identity ci WHERE cp.partition = $1",
        )
        .bind(i16::from(record.partition.get()))
        .fetch_optional(self.cell(record.from)?.pool())
        .await
        .map_err(store)?;
        let planned = record.map_version.saturating_sub(1);
        let found = match row {
            None => "no cell map there".to_owned(),
            Some((owner, state, version))
                if i64::from(record.from.get()) == i64::from(owner)
                    && state == "STEADY"
                    && u64::try_from(version).ok() == Some(planned) =>
            {
                return Ok(Ok(()));
            }
            Some((owner, state, version)) => {
                format!("its map (version {version}) names cell {owner}, {state}")
            }
        };
        Ok(Err(NotOwned {
            partition: record.partition.get(),
            cell: record.from,
            version: planned,
            found,
        }))
    }
}

#[async_trait]
impl MoveRecords for PgMapMoves {
    async fn start(&self, record: &MoveRecord) -> Result<Started, StoreError> {
        if let Err(not) = self.check_owner(record).await? {
            return Ok(Started::NotOwned(not.to_string()));
        }
        self.cell(record.from)?.start(record).await
    }

    async fn load(&self, id: &MoveId) -> Result<Option<MoveRecord>, StoreError> {
        for (_, moves) in self.cells.all() {
            if let Some(record) = moves.load(id).await? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    async fn unfinished(&self) -> Result<Vec<MoveRecord>, StoreError> {
        let mut all = Vec::new();
        for (_, moves) in self.cells.all() {
            all.extend(moves.unfinished().await?);
        }
        Ok(all)
    }

    async fn recent(&self, limit: usize) -> Result<Vec<MoveRecord>, StoreError> {
        let mut all = Vec::new();
        for (_, moves) in self.cells.all() {
            all.extend(moves.recent(limit).await?);
        }
        all.sort_by(|a, b| b.id.cmp(&a.id));
        all.truncate(limit);
        Ok(all)
    }

    async fn save(&self, expected: MoveStep, record: &MoveRecord) -> Result<bool, StoreError> {
        self.cell(record.from)?.save(expected, record).await
    }
}
