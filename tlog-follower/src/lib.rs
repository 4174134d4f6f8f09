//! The tamper-evident log's storage and its one writer: the follower extends the RFC 6962 tree
//! (`tlog`) from the committed feed, in feed order, storing every perfect subtree, the right
//! edge and the signed checkpoints (migration 0021); the readers answer proofs from what is
//! stored, never re-hashing history; `verify` re-reads the whole log in one COPY stream and
//! checks it against the tree and every checkpoint (`docs/adr/0016-tamper-evident-log.md`).
//!
//! By job: `entries` (the one query of an entry's fields, shared by all) → `store` (the tree's
//! tables) → `follower` (the writer), `proofs` (the routes' reads, behind `reads::LogReads`) and
//! `verify` (with `deposits`, which holds every external deposit to its entry, `map_facts`, which
//! holds every partition move and added cell to its entry, and `finding`,
//! what both name). The follower and `verify` read the log as COPY lines (`copy`: COPY's text
//! format, an entry's fields borrowed from the line). It reads the event table (and
//! `external_deposits` beside it) through `eventlog`, which holds that SQL, and writes only its
//! own tables. Depends on `tlog`, `eventlog` and (for the read port it implements, `ports.rs`)
//! `application` only among the ledger's crates.

mod copy;
mod deposits;
pub mod entries;
mod finding;
pub mod follower;
mod leaf_time;
mod map_facts;
mod ports;
pub mod proofs;
mod reads;
mod store;
pub mod verify;

pub use entries::EntryRow;
pub use follower::{Follower, FollowerConfig};
pub use reads::{LogLag, LogReads};

/// Why a log operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("log store: {0}")]
    Store(#[from] sqlx::Error),
    /// The stored tree was signed by another identity than the configured key.
    #[error("{0}")]
    Identity(String),
    /// The stored tree does not extend the last checkpoint this follower signed or found at its
    /// start: someone rewrote the log or the tree behind the ledger's back. Nothing is signed.
    #[error("the log was rewritten: {0}")]
    Rewritten(String),
    /// Stored tree data that does not parse (an edge of the wrong length, a hash not 32 bytes).
    #[error("stored tree data is malformed: {0}")]
    Corrupt(String),
}
