//! Moving a partition from one cell to another while every other partition keeps committing
//! (issue 51, ADR 0023 §4): a durable process of its own, like a transfer. Its steps are recorded
//! before they run, every step is idempotent, and a runner resumes any move from its record
//! after a crash, or rolls it back when it is cancelled.
//!
//! - `record.rs`: the move's record and its steps, with the one table of steps it may take.
//! - `ports.rs`: what the move needs of the world, as ports: its records, the cells' databases
//!   (`PartitionStores`: mark, copy, freeze, read a partition's book, switch), the two
//!   spot-cores (`SpotMoves`: a journaled move-out and move-in) and the front's hold.
//! - `verify.rs`: the check before the switch: per user and asset the target's book equals the
//!   source's, the SPOT balances that left the source arrived, both cells' conservation is exact.
//! - `run.rs`: `MoveRunner`, which starts, cancels and drives moves over the ports.
//!
//! The core names no database here either: `adapters` implements the ports, and the fast tests
//! (`application/tests/fast/moves.rs`) run every step, crash and cancel over
//! `testkit::moves::MemMoves`.

mod ports;
mod record;
mod run;
mod verify;
mod worker;

pub use ports::{
    Copied, Freeze, HistoryPrefix, MoveOutRefused, MoveRecords, NoHold, PartitionBook,
    PartitionHold, PartitionStores, SpotMoves, SpotPayload, Started,
};
pub use record::{HistoryCut, Marks, MoveId, MoveRecord, MoveStep};
pub use run::{MoveError, MoveRunner, MoveSettings};
pub use verify::{verify, Mismatch};
pub use worker::{run_worker, MoveDesk};
