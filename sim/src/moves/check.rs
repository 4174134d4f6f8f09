//! The checks after a moves seed, once the faults have stopped and every move was driven to its
//! end: no move left unended and nothing held at the front; every asset's total across the cells
//! unchanged; each users' partition owned by exactly one cell (none left draining, frozen or
//! incoming), whose book holds every write the fence accepted, in order, and whose engine holds
//! the users' SPOT balances, with nothing of the partition counted in any other cell and every
//! other cell's fence refusing it; one map version in every cell.

use std::collections::{BTreeMap, BTreeSet};

use application::moves::{MoveId, PartitionBook};
use application::testkit::moves::{MemMoves, PartState};
use cells::{partition_of, CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;

use super::scene::{cell_id, Scene, ASSETS};

/// Every violation found, in a fixed order.
pub fn after_seed(
    scene: &mut Scene,
    moves: &[MoveId],
    total: &BTreeMap<String, Decimal>,
) -> Vec<String> {
    let world = scene.world.clone();
    let mut found = Vec::new();
    for id in moves {
        match world.record(id) {
            Some(r) if r.step.is_end() => {}
            Some(r) => found.push(format!("move {id} left unended at {}", r.step.as_str())),
            None => found.push(format!("move {id} has no record")),
        }
    }
    if !world.held().0.is_empty() {
        found.push(format!(
            "the front still holds {:?}",
            world.held().0.iter().map(|p| p.get()).collect::<Vec<_>>()
        ));
    }
    let now = scene.total();
    if now != *total {
        found.push(format!(
            "totals across the cells changed: {total:?} became {now:?}"
        ));
    }
    let cells: Vec<CellId> = (1..=u64::from(scene.cells)).map(cell_id).collect();
    let versions: BTreeSet<u64> = cells.iter().map(|c| world.cell(*c).map_version).collect();
    if versions.len() != 1 {
        found.push(format!("the cells hold map versions {versions:?}"));
    }
    let parts: BTreeSet<Partition> = scene.users.iter().map(|u| partition_of(*u)).collect();
    for p in parts {
        found.extend(partition_whole(scene, &world, &cells, p));
    }
    found
}

/// Partition `p` is owned by one cell, whose book and engine hold what its users expect, and
/// counted nowhere else.
fn partition_whole(scene: &Scene, world: &MemMoves, cells: &[CellId], p: Partition) -> Vec<String> {
    let mut found = Vec::new();
    let mut owners = Vec::new();
    for cell in cells {
        match world.cell(*cell).parts.get(&p) {
            Some(PartState::Owned) => owners.push(*cell),
            Some(PartState::Moved) | None => {}
            Some(other) => found.push(format!(
                "partition {} left {other:?} in cell {cell}",
                p.get()
            )),
        }
    }
    let [owner] = owners[..] else {
        found.push(format!(
            "partition {} is owned by cells {owners:?}",
            p.get()
        ));
        return found;
    };
    let users: Vec<UserId> = scene
        .users
        .iter()
        .copied()
        .filter(|u| partition_of(*u) == p)
        .collect();
    let book = world.book(owner, p);
    for user in &users {
        found.extend(book_whole(scene, &book, owner, *user));
        found.extend(spot_whole(scene, cells, owner, *user));
    }
    for cell in cells.iter().filter(|c| **c != owner) {
        if world.book(*cell, p) != Default::default() {
            found.push(format!("partition {} also counted in cell {cell}", p.get()));
        }
        if let Some(user) = users.first() {
            if world.write(*cell, "probe", *user, "USDT", 0) {
                found.push(format!(
                    "cell {cell} accepts a write of moved partition {}",
                    p.get()
                ));
            }
        }
    }
    found
}

/// `owner`'s book holds every write of `user` the fence accepted, in order, and nothing else.
fn book_whole(scene: &Scene, book: &PartitionBook, owner: CellId, user: UserId) -> Vec<String> {
    let mut found = Vec::new();
    let p = partition_of(user);
    let writes = scene.expected.get(&user).cloned().unwrap_or_default();
    let mut funding: BTreeMap<(UserId, String), Decimal> = BTreeMap::new();
    let mut history = String::new();
    for (key, asset, amount) in &writes {
        *funding.entry((user, (*asset).to_owned())).or_default() += Decimal::from(*amount);
        history.push_str(key);
        history.push(';');
    }
    let held: BTreeMap<_, _> = book
        .funding
        .iter()
        .filter(|((u, _), v)| *u == user && !v.is_zero())
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    funding.retain(|_, v| !v.is_zero());
    if held != funding {
        found.push(format!(
            "user {user} (p{}) in cell {owner}: FUNDING {held:?}, expected {funding:?}",
            p.get()
        ));
    }
    if book.history.get(&user).cloned().unwrap_or_default() != history {
        found.push(format!(
            "user {user} (p{}) in cell {owner}: history differs from the writes accepted",
            p.get()
        ));
    }
    found
}

/// `user`'s SPOT balances are in `owner`'s engine, as expected, and nothing of theirs anywhere
/// else.
fn spot_whole(scene: &Scene, cells: &[CellId], owner: CellId, user: UserId) -> Vec<String> {
    let mut found = Vec::new();
    for cell in cells {
        for asset in ASSETS {
            let held = scene.engines.available(*cell, user, asset);
            let want = if *cell == owner {
                Decimal::from(scene.spot.get(&(user, asset)).copied().unwrap_or(0))
            } else {
                Decimal::ZERO
            };
            if held != want {
                found.push(format!(
                    "user {user} SPOT {asset} in cell {cell}: {held}, expected {want}"
                ));
            }
        }
    }
    found
}
