//! The recovery worker: finds transfers left open, claims each under a lease, and resumes it
//! through the application core's commands (`application::Coordinator::resume`), recording every
//! attempt; also the stuck listing the admin routes show. It reads no read model and never
//! imports the read side.

pub mod worker;

pub use worker::{
    stuck_transfers, ProjectorProbe, RecoveryConfig, RecoveryOverrides, RecoveryWorker,
    StuckTransfer,
};
