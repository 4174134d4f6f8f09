//! Read models built from the event log. The projector reads events in a commit-safe order and
//! writes its own tables with its position in the same transaction (exactly once); nothing here
//! ever writes the event table. `replay` rebuilds everything from scratch and compares, and
//! answers point-in-time questions for audits.
//!
//! By job: `log` (an event row and its decoding) → `fold` (the pure fold) → `projector` (the
//! live pass) or `bulk` (the replay's bulk rebuild), which write through `tables` and `copy`;
//! `transfers`, `admin` and `feed` read the tables back. Nothing here imports a module that imports it.

pub mod admin;
mod bulk;
mod copy;
mod error;
pub mod feed;
mod fold;
mod log;
mod ports;
pub mod projector;
pub mod replay;
mod rows;
mod tables;
pub mod transfers;

pub use error::ProjectionError;
pub use fold::Fold;
pub use log::{StoredEvent, TRANSFER_AGGREGATE};
pub use ports::PgFeed;
pub use projector::{Pass, Projector};
pub use rows::{BalanceRow, TransferRow};
pub use transfers::{HistoryFilter, PageCursor, TransferView};
