//! `MemMoves`: the move's ports (`moves::ports`) over cells kept in memory, with the fence, the
//! copy by marks, the spot-cores' journaled move-out and move-in, and a `Script` of faults per
//! call: fail before the effect, lose the answer after it, or crash the process before or after.
//! The fast tests (`application/tests/fast/moves.rs`) drive moves over it; the money that is
//! exact is checked by `MemMoves::total` and `MemMoves::book`, not by the ports' own answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use cells::{partition_of, CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;

use crate::error::StoreError;
use crate::moves::{
    Copied, Freeze, HistoryPrefix, MoveId, MoveRecord, MoveRecords, MoveStep, PartitionBook,
    PartitionStores, SpotPayload, Started,
};
use crate::testkit::faults::{crash, Script};

/// A call of the move's ports, where a fault can be armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveCall {
    Save,
    MarkIncoming,
    CopyBatch,
    Freeze,
    Unfreeze,
    VoidIncoming,
    Book,
    Switch,
    MoveOut,
    MoveIn,
    Balances,
}

/// What an armed call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveFault {
    /// Fails before any effect.
    Fail,
    /// Takes effect, then the answer is lost.
    LoseAnswer,
    /// The process crashes before the call reaches the store.
    CrashBefore,
    /// The call takes effect, then the process crashes.
    CrashAfter,
}

/// A partition's state in one cell's database (ADR 0023 §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartState {
    Owned,
    /// Nothing new starts; open transfers go on.
    Draining,
    Frozen,
    Moved,
    Incoming(MoveId),
}

/// One FUNDING movement of a user's history in a cell, as the move copies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub pos: u64,
    /// The event's id, the same in every cell it is copied to.
    pub key: String,
    pub user: UserId,
    pub asset: String,
    pub amount: Decimal,
    /// For a copy: the move that wrote it, the source cell and the source's position.
    pub copied_by: Option<(MoveId, CellId, u64)>,
}

/// One cell: its database's rows and partition states, and its spot-core.
#[derive(Debug, Clone, Default)]
pub struct MemCell {
    pub rows: Vec<Row>,
    pub parts: BTreeMap<Partition, PartState>,
    pub void: BTreeSet<MoveId>,
    pub map_version: u64,
    pub moved_logged: Vec<MoveId>,
    pub spot: BTreeMap<(UserId, String), Decimal>,
    pub spot_moved_out: BTreeSet<Partition>,
    pub spot_outs: BTreeMap<String, SpotPayload>,
    pub spot_ins: BTreeSet<String>,
    /// Open transfers per partition: the drain waits for them.
    pub open: BTreeMap<Partition, u64>,
    /// Positions of the rows of partitions switched away: never counted again, also once the
    /// partition moves back (that move's copy brings them anew).
    pub retired: BTreeSet<u64>,
}

impl MemCell {
    /// Whether `row` counts in this cell: its own row of a partition it holds, or a copy of a
    /// move that is not void into a partition it owns or is receiving.
    fn live(&self, row: &Row) -> bool {
        match self.parts.get(&partition_of(row.user)) {
            _ if self.retired.contains(&row.pos) => false,
            Some(PartState::Owned | PartState::Draining | PartState::Frozen) => {
                match &row.copied_by {
                    None => true,
                    Some((id, _, _)) => !self.void.contains(id),
                }
            }
            Some(PartState::Incoming(id)) => {
                matches!(&row.copied_by, Some((by, _, _)) if by == id && !self.void.contains(id))
            }
            Some(PartState::Moved) | None => false,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    cells: BTreeMap<CellId, MemCell>,
    moves: BTreeMap<MoveId, MoveRecord>,
    held: BTreeSet<Partition>,
    hold_log: Vec<(Partition, bool)>,
}

/// The world a move runs in. Cheap to clone; every clone is the same world.
#[derive(Debug, Clone)]
pub struct MemMoves {
    state: Arc<Mutex<State>>,
    pub faults: Script<MoveCall, MoveFault>,
    /// Rows per copy batch.
    pub batch: usize,
    /// Planted bug: the fence does not refuse a write to a frozen partition (also when the
    /// thread's planted bug is `write-after-pause`, `ledger-sim --moves`).
    pub plant_write_after_freeze: bool,
    /// The engines refuse every move-out not yet applied (`MOVE_REFUSED`: too large a state).
    pub refuse_move_out: bool,
}

impl MemMoves {
    /// Cells `1..=cells`, each owning the partitions `owner` gives it.
    pub fn new(cells: u16, owner: impl Fn(Partition) -> u16) -> Self {
        let mut state = State::default();
        for n in 1..=cells {
            let id = CellId::new(u64::from(n)).expect("a cell id");
            let mut cell = MemCell {
                map_version: 1,
                ..MemCell::default()
            };
            for p in Partition::all().filter(|p| owner(*p) == n) {
                cell.parts.insert(p, PartState::Owned);
            }
            state.cells.insert(id, cell);
        }
        Self {
            state: Arc::new(Mutex::new(state)),
            faults: Script::default(),
            batch: 3,
            plant_write_after_freeze: false,
            refuse_move_out: false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("the world's lock")
    }

    /// A copy of cell `id` as it is now.
    pub fn cell(&self, id: CellId) -> MemCell {
        self.lock().cells[&id].clone()
    }

    /// The cell that owns `user`'s partition now (the map every cell holds).
    pub fn owner(&self, user: UserId) -> Option<CellId> {
        let p = partition_of(user);
        let state = self.lock();
        state.cells.iter().find_map(|(id, c)| {
            matches!(
                c.parts.get(&p),
                Some(PartState::Owned | PartState::Draining | PartState::Frozen)
            )
            .then_some(*id)
        })
    }

    /// A write of `amount` FUNDING to `user` in `cell`, with `key`, through the fence: refused
    /// (false) unless the cell owns the user's partition.
    pub fn write(&self, cell: CellId, key: &str, user: UserId, asset: &str, amount: i64) -> bool {
        let plant = self.plant_write_after_freeze || planted!(WriteAfterPause);
        let mut state = self.lock();
        let c = state.cells.get_mut(&cell).expect("a cell");
        let allowed = match c.parts.get(&partition_of(user)) {
            Some(PartState::Owned) => true,
            Some(PartState::Draining | PartState::Frozen) => plant,
            _ => false,
        };
        if allowed {
            let pos = c.rows.len() as u64 + 1;
            c.rows.push(Row {
                pos,
                key: key.to_owned(),
                user,
                asset: asset.to_owned(),
                amount: Decimal::from(amount),
                copied_by: None,
            });
        }
        allowed
    }

    /// Opens (`delta` 1) or ends (-1) a transfer of `user` in `cell`: the drain waits while
    /// any of its partition's is open.
    pub fn open_transfers(&self, cell: CellId, user: UserId, delta: i64) {
        let mut state = self.lock();
        let c = state.cells.get_mut(&cell).expect("a cell");
        let open = c.open.entry(partition_of(user)).or_default();
        *open = open.saturating_add_signed(delta);
    }

    /// SPOT money of `user` in `cell`'s engine (a deposit).
    pub fn spot_credit(&self, cell: CellId, user: UserId, asset: &str, amount: i64) {
        let mut state = self.lock();
        let c = state.cells.get_mut(&cell).expect("a cell");
        *c.spot.entry((user, asset.to_owned())).or_default() += Decimal::from(amount);
    }

    /// Every cell's counted money, FUNDING and SPOT, per asset: what no move may change.
    pub fn total(&self) -> BTreeMap<String, Decimal> {
        let state = self.lock();
        let mut total = BTreeMap::<String, Decimal>::new();
        for cell in state.cells.values() {
            for row in cell.rows.iter().filter(|r| cell.live(r)) {
                *total.entry(row.asset.clone()).or_default() += row.amount;
            }
            for ((_, asset), amount) in &cell.spot {
                *total.entry(asset.clone()).or_default() += *amount;
            }
        }
        total
    }

    /// `cell`'s book of `p` as the move's check reads it, with the whole history.
    pub fn book(&self, cell: CellId, p: Partition) -> PartitionBook {
        self.book_after(cell, p, 0)
    }

    /// `cell`'s book of `p`, its history only of the rows at positions after `after`.
    pub fn book_after(&self, cell: CellId, p: Partition, after: i64) -> PartitionBook {
        let state = self.lock();
        let c = &state.cells[&cell];
        let mut book = PartitionBook::default();
        for row in c
            .rows
            .iter()
            .filter(|r| partition_of(r.user) == p && c.live(r))
        {
            *book
                .funding
                .entry((row.user, row.asset.clone()))
                .or_default() += row.amount;
        }
        book.history = history(c, p, after, i64::MAX);
        book
    }

    /// Rewrites the key of the row at `pos` in `cell`: a planted difference, for the tests of
    /// the check before the switch (a copy that went wrong, say).
    pub fn rewrite_key(&self, cell: CellId, pos: u64, key: &str) {
        let mut state = self.lock();
        let c = state.cells.get_mut(&cell).expect("a cell");
        let row = c.rows.iter_mut().find(|r| r.pos == pos).expect("a row");
        row.key = key.to_owned();
    }

    /// The front's hold: the partitions held now, and every hold and release in order.
    pub fn held(&self) -> (BTreeSet<Partition>, Vec<(Partition, bool)>) {
        let state = self.lock();
        (state.held.clone(), state.hold_log.clone())
    }

    /// The record of move `id`.
    pub fn record(&self, id: &MoveId) -> Option<MoveRecord> {
        self.lock().moves.get(id).cloned()
    }

    /// Runs `effect` under `call`'s armed fault, if any.
    async fn call<T>(
        &self,
        call: MoveCall,
        effect: impl FnOnce(&mut State) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let fault = self.faults.take(call);
        match fault {
            Some(MoveFault::Fail) => return Err(lost(call, "failed")),
            Some(MoveFault::CrashBefore) => return crash().await,
            _ => {}
        }
        let answer = effect(&mut self.lock());
        match fault {
            Some(MoveFault::LoseAnswer) => Err(lost(call, "answer lost")),
            Some(MoveFault::CrashAfter) => crash().await,
            _ => answer,
        }
    }
}

fn lost(call: MoveCall, what: &str) -> StoreError {
    StoreError::new(format!("{call:?}: {what}"))
}

fn cell_of(state: &mut State, id: CellId) -> Result<&mut MemCell, StoreError> {
    state
        .cells
        .get_mut(&id)
        .ok_or_else(|| StoreError::new(format!("no cell {id}")))
}

#[async_trait]
impl MoveRecords for MemMoves {
    async fn start(&self, record: &MoveRecord) -> Result<Started, StoreError> {
        let mut state = self.lock();
        let busy = state
            .moves
            .values()
            .find(|m| m.partition == record.partition && !m.step.is_end());
        if let Some(other) = busy {
            return Ok(Started::Busy(other.id.clone()));
        }
        state.moves.insert(record.id.clone(), record.clone());
        Ok(Started::Recorded)
    }

    async fn load(&self, id: &MoveId) -> Result<Option<MoveRecord>, StoreError> {
        Ok(self.lock().moves.get(id).cloned())
    }

    async fn unfinished(&self) -> Result<Vec<MoveRecord>, StoreError> {
        let state = self.lock();
        Ok(state
            .moves
            .values()
            .filter(|m| !m.step.is_end())
            .cloned()
            .collect())
    }

    async fn recent(&self, limit: usize) -> Result<Vec<MoveRecord>, StoreError> {
        let state = self.lock();
        Ok(state.moves.values().rev().take(limit).cloned().collect())
    }

    async fn save(&self, expected: MoveStep, record: &MoveRecord) -> Result<bool, StoreError> {
        self.call(MoveCall::Save, |state| {
            let slot = state.moves.get_mut(&record.id);
            Ok(match slot {
                Some(stored) if stored.step == expected => {
                    *stored = record.clone();
                    true
                }
                _ => false,
            })
        })
        .await
    }
}

#[async_trait]
impl PartitionStores for MemMoves {
    async fn mark_incoming(
        &self,
        cell: CellId,
        p: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError> {
        self.call(MoveCall::MarkIncoming, |state| {
            let c = cell_of(state, cell)?;
            if !c.void.contains(id) && !matches!(c.parts.get(&p), Some(PartState::Owned)) {
                c.parts.insert(p, PartState::Incoming(id.clone()));
            }
            Ok(())
        })
        .await
    }

    async fn copy_batch(&self, record: &MoveRecord) -> Result<Copied, StoreError> {
        let batch = self.batch;
        self.call(MoveCall::CopyBatch, |state| copy(state, record, batch))
            .await
    }

    async fn freeze(&self, record: &MoveRecord) -> Result<Freeze, StoreError> {
        self.call(MoveCall::Freeze, |state| {
            let at_pausing = state.moves.get(&record.id).map(|m| m.step) == Some(MoveStep::Pausing);
            let c = cell_of(state, record.from)?;
            let p = record.partition;
            if at_pausing && c.parts.get(&p) == Some(&PartState::Owned) {
                c.parts.insert(p, PartState::Draining);
            }
            let open = c.open.get(&p).copied().unwrap_or(0);
            if at_pausing && open == 0 && c.parts.get(&p) == Some(&PartState::Draining) {
                c.parts.insert(p, PartState::Frozen);
            }
            Ok(match c.parts.get(&p) {
                Some(PartState::Draining) => Freeze::Draining { open },
                _ => Freeze::Frozen,
            })
        })
        .await
    }

    async fn unfreeze(&self, cell: CellId, p: Partition) -> Result<(), StoreError> {
        self.call(MoveCall::Unfreeze, |state| {
            let c = cell_of(state, cell)?;
            if matches!(
                c.parts.get(&p),
                Some(PartState::Frozen | PartState::Draining)
            ) {
                c.parts.insert(p, PartState::Owned);
            }
            Ok(())
        })
        .await
    }

    async fn void_incoming(
        &self,
        cell: CellId,
        p: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError> {
        self.call(MoveCall::VoidIncoming, |state| {
            let c = cell_of(state, cell)?;
            c.void.insert(id.clone());
            if c.parts.get(&p) == Some(&PartState::Incoming(id.clone())) {
                c.parts.remove(&p);
            }
            Ok(())
        })
        .await
    }

    async fn book(
        &self,
        cell: CellId,
        p: Partition,
        after: i64,
    ) -> Result<PartitionBook, StoreError> {
        let book = self.book_after(cell, p, after);
        self.call(MoveCall::Book, move |_| Ok(book)).await
    }

    async fn history_prefixes(
        &self,
        record: &MoveRecord,
    ) -> Result<(HistoryPrefix, HistoryPrefix), StoreError> {
        self.call(MoveCall::Book, |state| {
            let p = record.partition;
            let source = &state.cells[&record.from];
            let target = &state.cells[&record.to];
            let upto = record.marks.get("events").copied().unwrap_or(0);
            let head = target.rows.len() as i64;
            Ok((
                HistoryPrefix {
                    upto,
                    history: history(source, p, 0, upto),
                },
                HistoryPrefix {
                    upto: head,
                    history: history(target, p, 0, head),
                },
            ))
        })
        .await
    }

    async fn conservation_exact(&self, _cell: CellId) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn switch(&self, record: &MoveRecord) -> Result<(), StoreError> {
        self.call(MoveCall::Switch, |state| {
            let at = state.moves.get(&record.id).map(|m| m.step);
            if at != Some(MoveStep::Switching) {
                return Ok(());
            }
            let (p, id) = (record.partition, record.id.clone());
            let order: Vec<CellId> = [record.to, record.from]
                .into_iter()
                .chain(
                    state
                        .cells
                        .keys()
                        .copied()
                        .filter(|c| *c != record.to && *c != record.from),
                )
                .collect();
            for cell in order {
                let c = cell_of(state, cell)?;
                c.map_version = c.map_version.max(record.map_version);
                if cell == record.to && c.parts.get(&p) == Some(&PartState::Incoming(id.clone())) {
                    c.parts.insert(p, PartState::Owned);
                }
                if cell == record.from && c.parts.get(&p) == Some(&PartState::Frozen) {
                    c.parts.insert(p, PartState::Moved);
                    let gone = c.rows.iter().filter(|r| partition_of(r.user) == p);
                    c.retired.extend(gone.map(|r| r.pos));
                }
                if (cell == record.to || cell == record.from) && !c.moved_logged.contains(&id) {
                    c.moved_logged.push(id.clone());
                }
            }
            Ok(())
        })
        .await
    }
}

/// Per user of `p`, the keys of their rows counted in `c` at positions in `(after, upto]`.
fn history(c: &MemCell, p: Partition, after: i64, upto: i64) -> BTreeMap<UserId, String> {
    let mut found: BTreeMap<UserId, String> = BTreeMap::new();
    for row in c.rows.iter().filter(|r| {
        let pos = r.pos as i64;
        partition_of(r.user) == p && c.live(r) && pos > after && pos <= upto
    }) {
        let history = found.entry(row.user).or_default();
        history.push_str(&row.key);
        history.push(';');
    }
    found
}

/// One copy batch of `record`'s partition, from its marks.
fn copy(state: &mut State, record: &MoveRecord, batch: usize) -> Result<Copied, StoreError> {
    let mark = record.marks.get("events").copied().unwrap_or(0);
    let source = state.cells[&record.from].clone();
    let target = cell_of(state, record.to)?;
    let incoming =
        target.parts.get(&record.partition) == Some(&PartState::Incoming(record.id.clone()));
    if !incoming || target.void.contains(&record.id) {
        return Ok(Copied {
            rows: 0,
            marks: record.marks.clone(),
            at_end: true,
        });
    }
    let todo: Vec<&Row> = source
        .rows
        .iter()
        .filter(|r| {
            r.pos as i64 > mark && partition_of(r.user) == record.partition && source.live(r)
        })
        .collect();
    let mut rows = 0;
    let mut last = mark;
    for row in todo.iter().take(batch) {
        last = row.pos as i64;
        let mine = |t: &Row| matches!(&t.copied_by, Some((by, _, _)) if *by == record.id);
        if target.rows.iter().any(|t| mine(t) && t.key == row.key) {
            continue;
        }
        let pos = target.rows.len() as u64 + 1;
        target.rows.push(Row {
            pos,
            copied_by: Some((record.id.clone(), record.from, row.pos)),
            ..(*row).clone()
        });
        rows += 1;
    }
    let mut marks = record.marks.clone();
    marks.insert("events".to_owned(), last);
    Ok(Copied {
        rows,
        marks,
        at_end: todo.len() <= batch,
    })
}

mod engines;
