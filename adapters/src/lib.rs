//! The adapters home: the funding ledger in PostgreSQL and the client side of spot-core, each
//! behind the domain's `AccountPort`; the event store (postgres-es's table, group-committed
//! appends); and the one group-commit skeleton the event store and the funding ledger share.

pub mod applied;
pub mod audit;
pub mod event_store;
pub mod funding;
pub mod group_commit;
pub mod spot;
mod traced;

pub use event_store::{BatchingEventRepository, TransferStore};
pub use funding::{AccountStatus, FundingBalance, FundingError, FundingLedger};
pub use spot::{SpotAdapter, SpotBalance, SpotError};
