//! The incremental audit's durable checkpoint (migration 0010): the positions below which
//! everything was consumed, the per-asset sums of what was consumed, and the consumed applied
//! movements of every req_id not yet settled. Stored in one transaction, guarded by a version so
//! that of two runs started from the same checkpoint only one stores its result (the other's
//! report is still exact; it is simply not kept). Kept by a [`Checkpoints`] port
//! (`adapters::pg::audit` in production).

use std::collections::BTreeMap;

use async_trait::async_trait;
use rust_decimal::Decimal;

use crate::books::AppliedMovement;
use crate::error::StoreError;

/// Everything consumed so far. `Checkpoint::default()` is the start of history (a full check).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The version read (0: none stored yet).
    pub version: i64,
    /// Every event whose transaction id is below this is consumed.
    pub events_horizon: u64,
    /// Every funding journal row and external deposit whose transaction id is below this is
    /// consumed.
    pub funding_horizon: u64,
    /// spot-core's journal is consumed up to this seq.
    pub spot_seq: u64,
    /// Transfers created below `events_horizon`.
    pub transfers: u64,
    /// Per asset: (external deposits, in-flight reconciled from applied movements).
    pub assets: BTreeMap<String, (Decimal, Decimal)>,
    /// Per asset: SPOT balances moved in with partitions minus moved out, from spot-core's
    /// `move_in`/`move_out` records consumed (ADR 0023 §5).
    pub moved: BTreeMap<String, Decimal>,
    /// The consumed applied movements of every req_id not settled (possibly none yet).
    pub open: BTreeMap<String, Vec<AppliedMovement>>,
}

/// Why a stored checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("reading or storing the audit checkpoint")]
    Store(#[from] StoreError),
    #[error("the stored audit checkpoint is unreadable: {0}")]
    Unreadable(String),
}

/// Where the checkpoint is kept (`adapters::pg::audit` in production, `testkit::MemRecords` in
/// memory).
#[async_trait]
pub trait Checkpoints: Send + Sync {
    /// The stored checkpoint, or the start of history when none is stored; read in one
    /// snapshot.
    async fn load_checkpoint(&self) -> Result<Checkpoint, CheckpointError>;
    /// Stores `next` in place of the checkpoint loaded at version `read`; `false` (nothing
    /// written) when another run stored one since.
    async fn store_checkpoint(&self, read: i64, next: &Checkpoint)
        -> Result<bool, CheckpointError>;
}
