//! The cell map as a cell stores it (ADR 0023 §1): every cell keeps the whole map and the
//! version it last accepted (`cell_partitions`, `cell_identity.map_version`, migrations 0022,
//! 0028, 0029). A partition's switch writes version N+1 into every cell; the front, which routes
//! by the map, reads it through this port (each cell's own, in its `front::slot::Served`) and
//! routes by the highest version it finds (`front::map`). `adapters::pg::cell_map` implements
//! it over the cell's pool.

use async_trait::async_trait;
use cells::{CellId, Partition};

use crate::error::StoreError;

/// One cell's stored map: its version and each partition's cell, read in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMap {
    pub version: u64,
    /// `(partition, cell)` as the cell's `cell_partitions` names them.
    pub owners: Vec<(Partition, CellId)>,
}

/// The map one cell stores.
#[async_trait]
pub trait CellMapStore: Send + Sync {
    /// The version of the map the cell last accepted (1: the file's). Cheap: one row.
    async fn map_version(&self) -> Result<u64, StoreError>;

    /// The whole stored map, its version and assignments read together.
    async fn stored_map(&self) -> Result<StoredMap, StoreError>;
}
