//! The move's ports for the simulation: `MemMoves` (the in-memory cells with their fence, copy,
//! spot-cores and faults) behind a hook that the seed's schedule runs before every call of the
//! move's ports, so users' writes, transfers that open and end, and cancels land between any two
//! calls of a step (between two copy batches, between the freeze and the last copy, between the
//! move-out and the move-in, between the two books of the check). The spot-cores are the cells'
//! real engines (`engines.rs`), their calls faulted by the same script as `MemMoves`'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use application::error::StoreError;
use application::moves::{
    Copied, Freeze, HistoryPrefix, MoveId, MoveRecord, MoveRecords, MoveStep, PartitionBook,
    PartitionHold, PartitionStores, SpotMoves, SpotPayload, Started,
};
use application::testkit::faults::crash;
use application::testkit::moves::{MemMoves, MoveCall, MoveFault};
use async_trait::async_trait;
use cells::{CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;

use super::engines::Engines;

/// What runs before a call of the move's ports.
pub type Hook = Arc<dyn Fn(MoveCall) + Send + Sync>;

/// `MemMoves` with the schedule's hook before each call.
#[derive(Clone)]
pub struct Interleaved {
    pub inner: MemMoves,
    pub engines: Engines,
    pub hook: Hook,
}

impl Interleaved {
    fn before(&self, call: MoveCall) {
        (self.hook)(call);
    }

    /// An engine's call under `call`'s armed fault, as `MemMoves` runs its own.
    async fn engine<T>(
        &self,
        call: MoveCall,
        effect: impl FnOnce(&Engines) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.before(call);
        let fault = self.inner.faults.take(call);
        match fault {
            Some(MoveFault::Fail) => return Err(StoreError::new(format!("{call:?}: failed"))),
            Some(MoveFault::CrashBefore) => return crash().await,
            _ => {}
        }
        let answer = effect(&self.engines);
        match fault {
            Some(MoveFault::LoseAnswer) => Err(StoreError::new(format!("{call:?}: answer lost"))),
            Some(MoveFault::CrashAfter) => crash().await,
            _ => answer,
        }
    }
}

#[async_trait]
impl MoveRecords for Interleaved {
    async fn start(&self, record: &MoveRecord) -> Result<Started, StoreError> {
        self.inner.start(record).await
    }

    async fn load(&self, id: &MoveId) -> Result<Option<MoveRecord>, StoreError> {
        self.inner.load(id).await
    }

    async fn unfinished(&self) -> Result<Vec<MoveRecord>, StoreError> {
        self.inner.unfinished().await
    }

    async fn recent(&self, limit: usize) -> Result<Vec<MoveRecord>, StoreError> {
        self.inner.recent(limit).await
    }

    async fn save(&self, expected: MoveStep, record: &MoveRecord) -> Result<bool, StoreError> {
        self.before(MoveCall::Save);
        self.inner.save(expected, record).await
    }
}

#[async_trait]
impl PartitionStores for Interleaved {
    async fn mark_incoming(
        &self,
        cell: CellId,
        partition: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError> {
        self.before(MoveCall::MarkIncoming);
        self.inner.mark_incoming(cell, partition, id).await
    }

    async fn copy_batch(&self, record: &MoveRecord) -> Result<Copied, StoreError> {
        self.before(MoveCall::CopyBatch);
        self.inner.copy_batch(record).await
    }

    async fn freeze(&self, record: &MoveRecord) -> Result<Freeze, StoreError> {
        self.before(MoveCall::Freeze);
        self.inner.freeze(record).await
    }

    async fn unfreeze(&self, cell: CellId, partition: Partition) -> Result<(), StoreError> {
        self.before(MoveCall::Unfreeze);
        self.inner.unfreeze(cell, partition).await
    }

    async fn void_incoming(
        &self,
        cell: CellId,
        partition: Partition,
        id: &MoveId,
    ) -> Result<(), StoreError> {
        self.before(MoveCall::VoidIncoming);
        self.inner.void_incoming(cell, partition, id).await
    }

    async fn book(
        &self,
        cell: CellId,
        partition: Partition,
        after: i64,
    ) -> Result<PartitionBook, StoreError> {
        self.before(MoveCall::Book);
        PartitionStores::book(&self.inner, cell, partition, after).await
    }

    async fn history_prefixes(
        &self,
        record: &MoveRecord,
    ) -> Result<(HistoryPrefix, HistoryPrefix), StoreError> {
        self.before(MoveCall::Book);
        self.inner.history_prefixes(record).await
    }

    async fn conservation_exact(&self, cell: CellId) -> Result<bool, StoreError> {
        self.inner.conservation_exact(cell).await
    }

    async fn switch(&self, record: &MoveRecord) -> Result<(), StoreError> {
        self.before(MoveCall::Switch);
        self.inner.switch(record).await
    }
}

#[async_trait]
impl SpotMoves for Interleaved {
    async fn move_out(
        &self,
        cell: CellId,
        id: &str,
        partition: Partition,
    ) -> Result<SpotPayload, StoreError> {
        self.engine(MoveCall::MoveOut, |e| e.move_out(cell, id, partition))
            .await
    }

    async fn move_in(
        &self,
        cell: CellId,
        id: &str,
        partition: Partition,
        payload: &SpotPayload,
    ) -> Result<(), StoreError> {
        self.engine(MoveCall::MoveIn, |e| {
            e.move_in(cell, id, partition, payload)
        })
        .await
    }

    async fn balances(
        &self,
        cell: CellId,
        partition: Partition,
        users: &[UserId],
    ) -> Result<BTreeMap<(UserId, String), Decimal>, StoreError> {
        let asked: Vec<UserId> = users
            .iter()
            .copied()
            .filter(|u| cells::partition_of(*u) == partition)
            .collect();
        self.engine(MoveCall::Balances, |e| e.balances(cell, &asked))
            .await
    }
}

#[async_trait]
impl PartitionHold for Interleaved {
    async fn hold(&self, partition: Partition) {
        self.inner.hold(partition).await;
    }

    async fn release(&self, partition: Partition) {
        self.inner.release(partition).await;
    }
}
