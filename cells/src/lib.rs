//! Cells (ADR 0017): users are placed by a stable hash onto a fixed number of partitions, and a
//! cell map names each partition's cell, a full stack of its own (a PostgreSQL, a spot-core).
//! This crate is the pure part: the map's file format and its validation (`map.rs`), the
//! partition function (`partition.rs`), the placement of a user in a cell, and the moves that
//! would even out the cells (`plan.rs`, ADR 0023). It does no I/O:
//! the binary reads the file, the `schema` crate stores the map in each cell's database.

pub mod cursor;
pub mod map;
pub mod partition;
mod placement;
pub mod plan;

use std::num::NonZeroU16;

pub use cursor::{CursorError, FeedCursor};
pub use map::{CellMap, CellSpec, MapError, MapFormat, MemberKind, MemberSpec, SpotAddress};
pub use partition::{partition_of, partition_of_bytes, Partition, PARTITIONS};
pub use placement::{PartitionMismatch, Placement};
pub use plan::{plan, Plan, PlannedMove};

/// A cell's id: 1 to 65,535, never reused for another stack. Without a cell map the one cell is
/// [`CellId::ONE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CellId(NonZeroU16);

impl CellId {
    /// The one cell of a deployment without a cell map.
    pub const ONE: CellId = CellId(NonZeroU16::MIN);

    /// The cell numbered `raw`; `None` for 0 or anything above 65,535.
    pub fn new(raw: u64) -> Option<Self> {
        u16::try_from(raw).ok().and_then(NonZeroU16::new).map(Self)
    }

    pub fn get(self) -> u16 {
        self.0.get()
    }
}

impl std::fmt::Display for CellId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_id_is_one_to_65535() {
        assert_eq!(CellId::new(0), None);
        assert_eq!(CellId::new(1), Some(CellId::ONE));
        assert_eq!(CellId::new(65_535).map(CellId::get), Some(65_535));
        assert_eq!(CellId::new(65_536), None);
        assert_eq!(CellId::new(7).unwrap().to_string(), "7");
    }
}
