//! The adapters home: the funding ledger in PostgreSQL and the client side of spot-core, each
//! behind the domain's `AccountPort`.

pub mod funding;
pub mod spot;

pub use funding::{AccountStatus, FundingError, FundingLedger};
pub use spot::{SpotAdapter, SpotBalance, SpotError};
