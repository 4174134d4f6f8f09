//! The adapters home: every port of the core over PostgreSQL and spot-core. The funding ledger
//! in PostgreSQL and the client side of spot-core, each behind the domain's `AccountPort` and
//! the core's books (`books.rs`); the event store (postgres-es's table, group-committed
//! appends); the core's other ports over one pool (`pg/`); and the one group-commit skeleton the
//! event store and the funding ledger share. The arrow runs `adapters → application`: the core
//! defines each port, this crate implements it, and the binary wires one to the other.

pub mod applied;
pub mod audit;
mod books;
pub mod cell_set;
pub mod event_store;
pub mod funding;
pub mod group_commit;
pub mod pg;
pub mod spot;
mod traced;

pub use event_store::{BatchingEventRepository, TransferStore};
pub use funding::{AccountStatus, FundingBalance, FundingError, FundingLedger};
pub use spot::{SpotAdapter, SpotBalance, SpotError};
