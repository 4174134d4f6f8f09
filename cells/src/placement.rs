//! Where a user lives: each partition's cell, from a cell map or, without one, the one cell of
//! today's deployment. Also the comparison of a stored partition map (a cell's database) with the
//! file's, naming the first partition that differs.

use std::sync::Arc;

use domain::UserId;

use crate::map::CellMap;
use crate::partition::{partition_of, Partition, PARTITIONS};
use crate::CellId;

/// Each partition's cell. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    owners: Arc<[CellId]>,
}

/// The first partition on which a stored map and the file's disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe(self))]
pub struct PartitionMismatch {
    pub partition: Partition,
    /// The stored map's cell for it (`None`: the stored map does not name it).
    pub stored: Option<CellId>,
    /// The file's cell for it.
    pub expected: CellId,
}

fn describe(m: &PartitionMismatch) -> String {
    match m.stored {
        Some(stored) => format!(
            "partition {}: the cell's database says cell {stored}, the cell map says cell {}",
            m.partition, m.expected
        ),
        None => format!(
            "partition {}: the cell's database names no cell, the cell map says cell {}",
            m.partition, m.expected
        ),
    }
}

impl Placement {
    /// No cell map: every user is in [`CellId::ONE`].
    pub fn single() -> Self {
        Self {
            owners: vec![CellId::ONE; usize::from(PARTITIONS)].into(),
        }
    }

    /// The placement a validated map gives.
    pub fn of_map(map: &CellMap) -> Self {
        Self {
            owners: map.assignments().map(|(_, cell)| cell).collect(),
        }
    }

    /// The placement a cell's stored map gives (ADR 0023 §1): `None` unless it names every
    /// partition exactly once.
    pub fn of_stored(stored: &[(Partition, CellId)]) -> Option<Self> {
        let mut owners: Vec<Option<CellId>> = vec![None; usize::from(PARTITIONS)];
        for (partition, cell) in stored {
            let slot = &mut owners[usize::from(partition.get())];
            if slot.replace(*cell).is_some() {
                return None;
            }
        }
        let owners: Option<Vec<CellId>> = owners.into_iter().collect();
        owners.map(|owners| Self {
            owners: owners.into(),
        })
    }

    /// The cell `user` lives in.
    pub fn cell_of(&self, user: UserId) -> CellId {
        self.owner(partition_of(user))
    }

    /// The cell that owns `partition`.
    pub fn owner(&self, partition: Partition) -> CellId {
        self.owners[usize::from(partition.get())]
    }

    /// Every cell that owns a partition, ascending.
    pub fn cells(&self) -> Vec<CellId> {
        let mut cells: Vec<CellId> = self.owners.to_vec();
        cells.sort();
        cells.dedup();
        cells
    }

    /// Compares `stored` (partition, cell rows, as a cell's database keeps them) with this
    /// placement: the first partition, in order, whose cell differs or is missing. A stored row
    /// for a partition out of range cannot be built ([`Partition`] bounds it).
    pub fn first_difference(&self, stored: &[(Partition, CellId)]) -> Option<PartitionMismatch> {
        let mut kept: Vec<Option<CellId>> = vec![None; usize::from(PARTITIONS)];
        for (partition, cell) in stored {
            kept[usize::from(partition.get())] = Some(*cell);
        }
        Partition::all().find_map(|partition| {
            let expected = self.owner(partition);
            let stored = kept[usize::from(partition.get())];
            (stored != Some(expected)).then_some(PartitionMismatch {
                partition,
                stored,
                expected,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::MapFormat;

    fn three_cells() -> CellMap {
        let text = r#"
            partitions = 256
            [[cells]]
            id = 1
            database_url = "postgres://a/one"
            spot = "127.0.0.1:7401"
            partitions = ["0-84"]
            [[cells]]
            id = 2
            database_url = "postgres://a/two"
            spot = "127.0.0.1:7402"
            partitions = ["85-169"]
            [[cells]]
            id = 3
            database_url = "postgres://a/three"
            spot = "127.0.0.1:7403"
            partitions = ["170-255"]
        "#;
        CellMap::parse(text, MapFormat::Toml).unwrap()
    }

    fn user(raw: u64) -> UserId {
        UserId::new(raw).unwrap()
    }

    #[test]
    fn without_a_map_every_user_is_in_cell_one() {
        let single = Placement::single();
        for raw in [1, 2, 3, 42, 1000] {
            assert_eq!(single.cell_of(user(raw)), CellId::ONE);
        }
        assert_eq!(single.cells(), vec![CellId::ONE]);
    }

    #[test]
    fn a_user_lives_in_the_cell_of_its_partition() {
        let placement = Placement::of_map(&three_cells());
        let cell = |n| CellId::new(n).unwrap();
        // Partitions from the ADR's vectors: 1 → 225, 5 → 43, 3 → 139.
        assert_eq!(placement.cell_of(user(1)), cell(3));
        assert_eq!(placement.cell_of(user(5)), cell(1));
        assert_eq!(placement.cell_of(user(3)), cell(2));
        assert_eq!(placement.cells(), vec![cell(1), cell(2), cell(3)]);
    }

    #[test]
    fn the_same_map_stored_has_no_difference() {
        let map = three_cells();
        let stored: Vec<_> = map.assignments().collect();
        assert_eq!(Placement::of_map(&map).first_difference(&stored), None);
    }

    #[test]
    fn a_stored_map_that_differs_names_the_first_partition() {
        let map = three_cells();
        let mut stored: Vec<_> = map.assignments().collect();
        stored[17].1 = CellId::new(2).unwrap();
        stored[200].1 = CellId::new(1).unwrap();
        let mismatch = Placement::of_map(&map).first_difference(&stored).unwrap();
        assert_eq!(mismatch.partition.get(), 17);
        assert_eq!(mismatch.stored, CellId::new(2));
        assert_eq!(mismatch.expected, CellId::ONE);
        assert_eq!(
            mismatch.to_string(),
            "partition 17: the cell's database says cell 2, the cell map says cell 1"
        );
    }

    #[test]
    fn a_stored_map_is_a_placement_only_when_it_names_each_partition_once() {
        let map = three_cells();
        let mut stored: Vec<_> = map.assignments().collect();
        assert_eq!(Placement::of_stored(&stored), Some(Placement::of_map(&map)));
        stored[17].1 = CellId::new(2).unwrap();
        let moved = Placement::of_stored(&stored).unwrap();
        assert_eq!(moved.owner(Partition::new(17).unwrap()).get(), 2);
        stored.push(stored[3]);
        assert_eq!(Placement::of_stored(&stored), None, "a partition twice");
        stored.truncate(255);
        assert_eq!(Placement::of_stored(&stored), None, "a partition missing");
    }

    #[test]
    fn a_stored_map_missing_a_partition_names_it() {
        let map = three_cells();
        let stored: Vec<_> = map.assignments().filter(|(p, _)| p.get() != 99).collect();
        let mismatch = Placement::of_map(&map).first_difference(&stored).unwrap();
        assert_eq!(mismatch.partition.get(), 99);
        assert_eq!(mismatch.stored, None);
    }
}
