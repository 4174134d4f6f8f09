//! What a move needs of the world, as ports. `adapters` implements them over the cells'
//! PostgreSQL databases and their spot-cores; `testkit::moves::MemMoves` in memory. Every call is
//! idempotent: the runner repeats a call whose answer it did not get, and a call repeated after
//! it took effect answers as the first did.

use std::collections::BTreeMap;

use async_trait::async_trait;
use cells::{CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;

use super::record::{Marks, MoveId, MoveRecord, MoveStep};
use crate::error::StoreError;

/// What `MoveRecords::start` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// The move is recorded at `Planned`.
    Recorded,
    /// The partition has a move that has not ended: this one is not recorded.
    Busy(MoveId),
    /// The source does not own the partition under the map the move was planned on (why):
    /// nothing is recorded.
    NotOwned(String),
}

/// The moves' records, kept in the source cell (`partition_moves`).
#[async_trait]
pub trait MoveRecords: Send + Sync {
    /// Records `record` (at `Planned`) unless `record.partition` has a move that has not ended:
    /// two moves of one partition never run at once.
    async fn start(&self, record: &MoveRecord) -> Result<Started, StoreError>;

    /// The move `id`, if recorded.
    async fn load(&self, id: &MoveId) -> Result<Option<MoveRecord>, StoreError>;

    /// Every move that has not ended (what a runner resumes at start).
    async fn unfinished(&self) -> Result<Vec<MoveRecord>, StoreError>;

    /// The latest moves, ended or not, newest first, at most `limit`.
    async fn recent(&self, limit: usize) -> Result<Vec<MoveRecord>, StoreError>;

    /// Replaces the record of `record.id` if it is still at `expected`, and answers whether it
    /// did: `false` when another runner (or a cancel) recorded another step first.
    async fn save(&self, expected: MoveStep, record: &MoveRecord) -> Result<bool, StoreError>;
}

/// What one copy batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Rows written into the target by this batch (rows already there are skipped, not counted).
    pub rows: u64,
    /// The marks after the batch: where the next batch starts.
    pub marks: Marks,
    /// Whether the batch reached the source's end: nothing after `marks` exists now.
    pub at_end: bool,
}

/// Where a freeze left the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freeze {
    /// Nothing of the partition is written in its source from now on.
    Frozen,
    /// Nothing new starts; `open` transfers of the partition have not ended yet.
    Draining { open: u64 },
}

/// One cell's book of one partition, as the check before the switch compares it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionBook {
    /// FUNDING balances per user and asset (available and frozen summed).
    pub funding: BTreeMap<(UserId, String), Decimal>,
    /// Money in flight per user and asset: what open transfers have taken and not yet given.
    pub in_flight: BTreeMap<(UserId, String), Decimal>,
    /// Per user, a fingerprint of their history read in feed order (each transfer's req_id and
    /// state): equal fingerprints mean the same transfers, in the same states, in the same order.
    /// Only the events after the position `book` was asked for (all of them after 0).
    pub history: BTreeMap<UserId, String>,
}

/// One cell's history of one partition's users up to a feed position, as fingerprints: what the
/// pause compares while the partition is still live, so that the check before the switch
/// fingerprints only the events after `upto` (events are immutable and a position at or below
/// the head is never handed out again, so nothing at or below `upto` changes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryPrefix {
    /// The feed position the prefix ends at (included).
    pub upto: i64,
    /// Per user, a fingerprint of their events at positions up to `upto`, as in
    /// [`PartitionBook::history`].
    pub history: BTreeMap<UserId, String>,
}

/// The cells' databases, as a move sees them.
#[async_trait]
pub trait PartitionStores: Send + Sync {
    /// `cell` expects `partition` from move `id`: its copies are written there and counted
    /// nowhere until the switch.
    async fn mark_incoming(
        &self,
        cell: CellId,
        partition: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError>;

    /// Copies the next batch of the move's partition from its source into its target, from
    /// `record.marks`. Events keep their ids and carry their origin (source cell and position).
    /// A batch writes nothing once the target's incoming mark of this move is void: a late
    /// batch of a superseded runner cannot revive a cancelled move.
    async fn copy_batch(&self, record: &MoveRecord) -> Result<Copied, StoreError>;

    /// Drains, then freezes, the move's partition in its source under the fence. The drain
    /// refuses anything new of the partition's users (a transfer, a deposit) while the
    /// transfers already open go on to their end; once none is open the freeze refuses every
    /// write. Each waits for every write that already passed the fence. Answers `Draining`
    /// while transfers are open (call again). Only while the move's record is at `Pausing`: a
    /// late freeze of a cancelled move does nothing.
    async fn freeze(&self, record: &MoveRecord) -> Result<Freeze, StoreError>;

    /// `cell` owns `partition` again (a cancel), if it was frozen.
    async fn unfreeze(&self, cell: CellId, partition: Partition) -> Result<(), StoreError>;

    /// `cell`'s copies from move `id` are void: never read, never counted.
    async fn void_incoming(
        &self,
        cell: CellId,
        partition: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError>;

    /// `cell`'s book of `partition`: its own rows in the source, the move's copies in the target;
    /// its history covers the events at feed positions after `after` (0: the whole history).
    async fn book(
        &self,
        cell: CellId,
        partition: Partition,
        after: i64,
    ) -> Result<PartitionBook, StoreError>;

    /// Both cells' histories of the move's partition's users (the users `book` reads) so far:
    /// the source's up to the position the copy has read to (`record.marks`), the target's up
    /// to its head (the copy is the target's only writer of the partition, and the runner runs
    /// no copy meanwhile). Answers (source, target).
    async fn history_prefixes(
        &self,
        record: &MoveRecord,
    ) -> Result<(HistoryPrefix, HistoryPrefix), StoreError>;

    /// Whether `cell`'s conservation check is exact now (`Err` when it could not be run).
    async fn conservation_exact(&self, cell: CellId) -> Result<bool, StoreError>;

    /// The switch: the map's `record.map_version` written into the target, then the source, then
    /// every other cell; the source's rows of the partition marked moved and the target's
    /// copies owned; `PartitionMoved` appended to both cells' logs. Idempotent as a whole.
    async fn switch(&self, record: &MoveRecord) -> Result<(), StoreError>;
}

/// What a spot-core's move-out answered: the partition's balances, and the records it hands to
/// the target as they are (balances and the movements' journal, in the engine's own format).
#[derive(Debug, Clone, PartialEq)]
pub struct SpotPayload {
    pub balances: BTreeMap<(UserId, String), Decimal>,
    pub wire: serde_json::Value,
}

/// A spot-core's explicit refusal of a move-out (`MOVE_REFUSED`: the partition's state does not
/// fit one journal record, say), reported as a [`StoreError`]'s cause: nothing left the engine,
/// and a repeat under the same id is refused again until the engine's state changes (a move-out
/// that was applied answers its payload to every repeat), so the move is rolled back, never
/// retried while its partition is frozen.
#[derive(Debug, Clone, thiserror::Error)]
#[error("spot-core refused the move-out: {0}")]
pub struct MoveOutRefused(pub String);

/// The cells' spot-cores, as a move sees them. Both calls are journaled by the engine under the
/// id they name, so each takes effect once; a move-out answers the same payload every time.
#[async_trait]
pub trait SpotMoves: Send + Sync {
    /// `cell`'s engine gives up `partition`: its balances and journal leave it, and its
    /// movements for the partition's users are answered `MOVED` from then on.
    async fn move_out(
        &self,
        cell: CellId,
        id: &str,
        partition: Partition,
    ) -> Result<SpotPayload, StoreError>;

    /// `cell`'s engine takes what a move-out gave.
    async fn move_in(
        &self,
        cell: CellId,
        id: &str,
        partition: Partition,
        payload: &SpotPayload,
    ) -> Result<(), StoreError>;

    /// `cell`'s engine's balances of `users` (of `partition`), per user and asset. A user the
    /// engine answers `MOVED` for holds nothing there.
    async fn balances(
        &self,
        cell: CellId,
        partition: Partition,
        users: &[UserId],
    ) -> Result<BTreeMap<(UserId, String), Decimal>, StoreError>;
}

/// The front's hold (ADR 0023 §3): while a partition is held, its users' writes wait in the
/// front instead of reaching a cell, and go on under the map once released. Not a guarantee
/// (the fence is): a shorter pause for the moving users.
#[async_trait]
pub trait PartitionHold: Send + Sync {
    async fn hold(&self, partition: Partition);
    async fn release(&self, partition: Partition);
}

/// No hold (ADR 0023 §3 as built): a write of the moving partition's users meets the fence and
/// is answered 503 with `Retry-After: 1`; nothing waits in the front.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHold;

#[async_trait]
impl PartitionHold for NoHold {
    async fn hold(&self, _partition: Partition) {}
    async fn release(&self, _partition: Partition) {}
}
