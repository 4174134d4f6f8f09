//! A cell added to the map while every cell serves (ADR 0023 §1, §6; `ledger cells add`): under
//! the switches' lock (no partition switches meanwhile), the new cell is given the newest
//! assignments, then every cell, the new one included, stores the cell (`cell_cells`, migration
//! 0032), appends `CellAdded` to its log and takes the map's next version (above every cell's),
//! each in one transaction. The new cell owns no partition: moves give it some. A cell added here
//! is in the moves' stores from then on, so every later switch flips its map row too.

use cells::{CellId, Partition};
use serde_json::json;
use sqlx::PgPool;

use application::{FailPoint, FailPoints, StoreError};

use super::driver::store;
use super::move_stores::{MoveCell, PgPartitionStores};

/// What every cell stores of a cell added while they serve (`cell_cells`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedCell {
    pub id: CellId,
    /// `None`: `ledger up`'s database beside the others' (no password written anywhere).
    pub database_url: Option<String>,
    /// `HOST:PORT`, or `start` for a child of `ledger up`.
    pub spot: String,
    pub spot_token_file: Option<String>,
}

impl PgPartitionStores {
    /// Adds `added` (reached as `cell`) to the map every cell of these stores keeps, and to the
    /// stores; answers the map version that names it. Idempotent: an addition cut short is
    /// finished by the next call, which takes a version above every cell's again.
    pub async fn add_cell(
        &self,
        added: &AddedCell,
        cell: MoveCell,
        failpoints: FailPoints,
    ) -> Result<u64, StoreError> {
        let _one = self.switching.lock().await;
        if self.cells.get(added.id).is_some() {
            return Err(StoreError::new(format!(
                "cell {} is already in the map",
                added.id
            )));
        }
        let version = self.next_version(1).await?;
        let version = version.max(held_version(cell.pool()).await? + 1);
        let owners = self.newest_owners().await?;
        give_assignments(cell.pool(), added.id, &owners).await?;
        let mut every = self.cells.all();
        every.push((added.id, cell.clone()));
        for (id, each) in every {
            store_added(each.pool(), added, version)
                .await
                .map_err(|e| StoreError::new(format!("cell {id}: store cell {}: {e}", added.id)))?;
            failpoints.hit(FailPoint::CellAddOneStored);
        }
        // From now on every switch flips the new cell's map row too (it takes this lock first).
        self.cells.insert(added.id, cell);
        u64::try_from(version).map_err(StoreError::new)
    }

    /// Finishes additions a crash cut short (ADR 0023 §1): every cell of these stores gets each
    /// of `stored` (an added cell with the map version that named it, as some cell stored it):
    /// its row, its `CellAdded` entry and at least that version; what a cell has is left as it
    /// is. Answers how many (cell, addition) pairs were written.
    pub async fn complete_additions(&self, stored: &[(AddedCell, u64)]) -> Result<u64, StoreError> {
        let _one = self.switching.lock().await;
        let mut written = 0;
        for (id, cell) in self.cells.all() {
            for (added, version) in stored {
                let version = i64::try_from(*version).map_err(StoreError::new)?;
                let new = store_added(cell.pool(), added, version)
                    .await
                    .map_err(|e| {
                        StoreError::new(format!("cell {id}: store cell {}: {e}", added.id))
                    })?;
                written += u64::from(new);
            }
        }
        Ok(written)
    }

    /// The assignments of the cell whose stored map is the newest (the cells', under the lock
    /// no switch holds meanwhile).
    async fn newest_owners(&self) -> Result<Vec<(i16, i32)>, StoreError> {
        let mut newest: Option<(i64, Vec<(i16, i32)>)> = None;
        for (_, cell) in self.cells.all() {
            let version = held_version(cell.pool()).await?;
            if newest.as_ref().is_some_and(|(v, _)| *v >= version) {
                continue;
            }
            let owners: Vec<(i16, i32)> =
                sqlx::query_as("SELECT partition, cell_id FROM cell_partitions ORDER BY partition")
                    .fetch_all(cell.pool())
                    .await
                    .map_err(store)?;
            newest = Some((version, owners));
        }
        let (_, owners) = newest.ok_or_else(|| StoreError::new("no cell to read the map from"))?;
        if owners.len() != usize::from(cells::PARTITIONS) {
            return Err(StoreError::new(format!(
                "the newest stored map names {} partitions, not {}",
                owners.len(),
                cells::PARTITIONS
            )));
        }
        Ok(owners)
    }
}

async fn held_version(pool: &PgPool) -> Result<i64, StoreError> {
    sqlx::query_scalar("SELECT map_version FROM cell_identity")
        .fetch_one(pool)
        .await
        .map_err(store)
}

/// The new cell's identity checked and its map replaced by `owners`, in one transaction. Only
/// a cell that owns nothing and holds no user's event may take them: a new database, or one
/// that an addition cut short left behind.
async fn give_assignments(
    pool: &PgPool,
    cell: CellId,
    owners: &[(i16, i32)],
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(store)?;
    let stored: Option<i32> = sqlx::query_scalar("SELECT cell_id FROM cell_identity FOR UPDATE")
        .fetch_optional(&mut *tx)
        .await
        .map_err(store)?;
    if stored != Some(i32::from(cell.get())) {
        return Err(StoreError::new(format!(
            "the new cell's database is {}, not cell {cell}'s",
            stored.map_or("no cell".to_owned(), |c| format!("cell {c}'s"))
        )));
    }
    let busy: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM cell_partitions WHERE cell_id = $1 OR state <> 'STEADY')
             OR EXISTS (SELECT 1 FROM funding_accounts)",
    )
    .bind(i32::from(cell.get()))
    .fetch_one(&mut *tx)
    .await
    .map_err(store)?;
    if busy {
        return Err(StoreError::new(format!(
            "cell {cell}'s database already owns partitions or holds accounts: it is not a new cell"
        )));
    }
    let (partitions, cells): (Vec<i16>, Vec<i32>) = owners.iter().copied().unzip();
    debug_assert!(partitions
        .iter()
        .all(|p| u64::try_from(*p).ok().and_then(Partition::new).is_some()));
    sqlx::query("DELETE FROM cell_partitions")
        .execute(&mut *tx)
        .await
        .map_err(store)?;
    sqlx::query(
        "INSERT INTO cell_partitions (partition, cell_id) \
         SELECT * FROM unnest($1::smallint[], $2::integer[])",
    )
    .bind(partitions)
    .bind(cells)
    .execute(&mut *tx)
    .await
    .map_err(store)?;
    tx.commit().await.map_err(store)
}

/// In one cell: the added cell's row, its `CellAdded` entry and the map's `version`; whether
/// the row was new there.
async fn store_added(pool: &PgPool, added: &AddedCell, version: i64) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await.map_err(store)?;
    let payload = json!({"CellAdded": {"cell": added.id.get(), "map_version": version}});
    eventlog::copies::append_cell_added(&mut tx, added.id.get(), &payload)
        .await
        .map_err(store)?;
    let new = sqlx::query(
        "INSERT INTO cell_cells (id, database_url, spot, spot_token_file, map_version)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
    )
    .bind(i32::from(added.id.get()))
    .bind(&added.database_url)
    .bind(&added.spot)
    .bind(&added.spot_token_file)
    .bind(version)
    .execute(&mut *tx)
    .await
    .map_err(store)?
    .rows_affected()
        == 1;
    sqlx::query("UPDATE cell_identity SET map_version = greatest(map_version, $1)")
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(store)?;
    tx.commit().await.map_err(store)?;
    Ok(new)
}
