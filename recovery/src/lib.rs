//! The recovery worker: finds transfers left open, claims each under a lease, and resumes it
//! through the application core's commands (`application::Coordinator::resume`), recording every
//! attempt in its retry book (`book.rs`, a port: PostgreSQL in production, in memory in the
//! simulation); also the stuck listing, the attempt log and the heartbeat the admin routes show. It
//! reads no read model and never imports the read side.

pub mod book;
pub mod heartbeat;
mod reads;
mod rows;
pub mod stuck;
#[cfg(feature = "testkit")]
pub mod testkit;
mod traced;
pub mod worker;

pub use book::{AttemptPolicy, AttemptRecord, PgRetryBook, RetryBook, Tally};
pub use reads::PgRecoveryReads;
pub use stuck::{stuck_transfers, StuckTransfer};
pub use worker::{ProjectorProbe, RecoveryConfig, RecoveryOverrides, RecoveryWorker};
