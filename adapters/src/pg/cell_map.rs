//! A cell's stored cell map (`cell_identity.map_version`, `cell_partitions`; migrations 0022,
//! 0028, 0029, written by `schema` and a move's switch): `application::cell_map::CellMapStore`,
//! read only, for the front's reload (ADR 0023 §1).

use application::cell_map::{CellMapStore, StoredMap};
use application::StoreError;
use async_trait::async_trait;
use cells::{CellId, Partition};
use sqlx::PgPool;

use super::driver::store;

/// The stored map of the cell behind one pool.
#[derive(Clone)]
pub struct PgCellMap {
    pool: PgPool,
}

impl PgCellMap {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

fn version_of(raw: i64) -> Result<u64, StoreError> {
    u64::try_from(raw)
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| StoreError::msg(format!("stored map_version {raw} is not a version")))
}

#[async_trait]
impl CellMapStore for PgCellMap {
    async fn map_version(&self) -> Result<u64, StoreError> {
        let raw: Option<i64> = sqlx::query_scalar("SELECT map_version FROM cell_identity")
            .fetch_optional(&self.pool)
            .await
            .map_err(store)?;
        version_of(raw.ok_or_else(|| StoreError::msg("the database is no cell of a map"))?)
    }

    async fn stored_map(&self) -> Result<StoredMap, StoreError> {
        // One statement: the version and the rows from one snapshot (a switch writes both in
        // one transaction of each cell).
        let rows: Vec<(i64, i16, i32)> = sqlx::query_as(
            "SELECT i.map_version, p.partition, p.cell_id \
             FROM cell_identity i CROSS JOIN cell_partitions p ORDER BY p.partition",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(store)?;
        let version = version_of(
            rows.first()
                .map(|r| r.0)
                .ok_or_else(|| StoreError::msg("the database stores no cell map"))?,
        )?;
        let owners = rows
            .into_iter()
            .map(|(_, partition, cell)| {
                let p = u64::try_from(partition).ok().and_then(Partition::new);
                let c = u64::try_from(cell).ok().and_then(CellId::new);
                p.zip(c).ok_or_else(|| {
                    StoreError::msg(format!("stored partition {partition} → cell {cell}"))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(StoredMap { version, owners })
    }
}
