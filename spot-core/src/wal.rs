//! The write-ahead log: segments, start-up (newest valid snapshot plus the WAL after it, with
//! torn-tail repair), and the group-commit thread that owns the engine and the active segment,
//! with the snapshot thread beside it. Framing, names and fail points are in `storage.rs`.
//!
//! Segments: `<data-dir>/wal-<first seq, 20 digits>.seg`, a new one started once the active one
//! reaches `--segment-bytes` (after a synced batch, so a segment never ends with a torn record
//! unless it is the last one).
//!
//! Its parts, in `wal/`: `writer.rs` (the active segment and `StorageOptions`), `recovery.rs`
//! (start-up, with `base.rs`, the snapshot it begins from, and `scan.rs`, the frame reader),
//! `commit.rs` (the engine thread's group commit and `EngineHandle`) and `compact.rs` (the
//! snapshot thread: write, then compact). This file names what the rest of spot-core and the
//! other crates use.

mod base;
mod commit;
mod compact;
mod follow;
mod recovery;
mod scan;
mod writer;

pub use commit::{spawn_committer, EngineHandle, Replicate, MAX_BATCH};
pub use follow::{spawn_replica_committer, FollowJob, JoinAnswer, Progress, ReplicaParts};
pub use recovery::{open, ReplayReport};
pub use scan::{later_valid_frame, scan_frames};
pub use writer::{StorageOptions, Wal};

#[cfg(test)]
mod tests;
