//! The reload's decisions over stored maps kept in memory: the highest version wins, a lower or
//! equal one is never installed, a map that names a cell not served or misses a partition is
//! refused, and a cell that does not answer is passed over.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use application::cell_map::{CellMapStore, StoredMap};
use application::StoreError;
use async_trait::async_trait;
use cells::{CellId, Partition, Placement};
use domain::UserId;

use super::{LiveMap, Reload};

/// One cell's stored map, or a cell that fails to answer (`None`).
struct Stored(Mutex<Option<StoredMap>>);

#[async_trait]
impl CellMapStore for Stored {
    async fn map_version(&self) -> Result<u64, StoreError> {
        Ok(self.stored_map().await?.version)
    }

    async fn stored_map(&self) -> Result<StoredMap, StoreError> {
        self.0
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| StoreError::msg("does not answer"))
    }
}

fn cell(n: u64) -> CellId {
    CellId::new(n).unwrap()
}

/// Partitions 0-127 in cell 1, the rest in cell 2, but `moved` in `to`.
fn owners(moved: &[u8], to: u64) -> Vec<(Partition, CellId)> {
    Partition::all()
        .map(|p| {
            let owner = if moved.contains(&p.get()) {
                cell(to)
            } else if p.get() < 128 {
                cell(1)
            } else {
                cell(2)
            };
            (p, owner)
        })
        .collect()
}

fn store(version: u64, owners: Vec<(Partition, CellId)>) -> Arc<Stored> {
    Arc::new(Stored(Mutex::new(Some(StoredMap { version, owners }))))
}

fn stores(of: &[&Arc<Stored>]) -> Vec<(CellId, Arc<dyn CellMapStore>)> {
    of.iter()
        .enumerate()
        .map(|(i, s)| {
            let s: Arc<dyn CellMapStore> = (*s).clone();
            (cell(u64::try_from(i).unwrap() + 1), s)
        })
        .collect()
}

fn served() -> BTreeSet<CellId> {
    [cell(1), cell(2)].into()
}

/// A user of partition `p` (found by trying ids in order).
fn user_of(p: u8) -> UserId {
    (1..)
        .map(|raw| UserId::new(raw).unwrap())
        .find(|u| cells::partition_of(*u).get() == p)
        .unwrap()
}

fn live() -> LiveMap {
    LiveMap::new(Placement::of_stored(&owners(&[], 1)).unwrap(), 1)
}

#[tokio::test]
async fn the_highest_version_wins_and_its_assignments_are_read_from_its_cell() {
    let map = live();
    let user = user_of(7);
    assert_eq!(map.cell_of(user), cell(1));
    // The target was switched first: cell 2 holds version 2, cell 1 still version 1.
    let one = store(1, owners(&[], 1));
    let two = store(2, owners(&[7], 2));
    let answer = map.reload(&stores(&[&one, &two]), &served()).await;
    assert_eq!(answer, Reload::Installed { from: 1, to: 2 });
    assert_eq!(map.cell_of(user), cell(2));
    assert_eq!(map.version(), 2);
    // Nothing newer anywhere: nothing changes.
    let again = map.reload(&stores(&[&one, &two]), &served()).await;
    assert_eq!(
        again,
        Reload::NotNewer {
            held: 2,
            found: Some(2)
        }
    );
}

#[tokio::test]
async fn a_lower_or_equal_version_is_never_installed() {
    let map = live();
    assert_eq!(
        map.offer(3, Placement::of_stored(&owners(&[7], 2)).unwrap()),
        Some(1)
    );
    let user = user_of(7);
    // Every cell says version 2 (or 3, naming another placement): the held 3 stays.
    let older = store(2, owners(&[], 1));
    let answer = map.reload(&stores(&[&older, &older]), &served()).await;
    assert_eq!(
        answer,
        Reload::NotNewer {
            held: 3,
            found: Some(2)
        }
    );
    assert_eq!(map.cell_of(user), cell(2));
    assert_eq!(
        map.offer(3, Placement::of_stored(&owners(&[], 1)).unwrap()),
        None
    );
    assert_eq!(
        map.offer(2, Placement::of_stored(&owners(&[], 1)).unwrap()),
        None
    );
    assert_eq!(map.cell_of(user), cell(2));
    assert_eq!(map.version(), 3);
}

#[tokio::test]
async fn a_cell_that_does_not_answer_is_passed_over() {
    let map = live();
    let down = Arc::new(Stored(Mutex::new(None)));
    let two = store(2, owners(&[7], 2));
    let answer = map.reload(&stores(&[&down, &two]), &served()).await;
    assert_eq!(answer, Reload::Installed { from: 1, to: 2 });
    let nobody = map.reload(&stores(&[&down]), &served()).await;
    assert_eq!(
        nobody,
        Reload::NotNewer {
            held: 2,
            found: None
        }
    );
}

#[tokio::test]
async fn a_map_naming_a_cell_not_served_or_missing_a_partition_is_refused() {
    let map = live();
    let stranger = store(2, owners(&[7], 3));
    let answer = map.reload(&stores(&[&stranger]), &served()).await;
    assert!(
        matches!(&answer, Reload::Refused(why) if why.contains("names cell 3")),
        "{answer:?}"
    );
    let mut short = owners(&[], 1);
    short.pop();
    let missing = store(2, short);
    let answer = map.reload(&stores(&[&missing]), &served()).await;
    assert!(matches!(answer, Reload::Refused(_)), "{answer:?}");
    assert_eq!(map.version(), 1);
    assert_eq!(map.cell_of(user_of(7)), cell(1));
}
