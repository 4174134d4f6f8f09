//! The application core: every command the edges (HTTP, GraphQL, the recovery worker) call, over
//! the pure `domain` and ports (`ports.rs`, `books.rs`, `stores.rs`) that `adapters` implements:
//! the core names no database and no adapter (`scripts/no-database-in-core` checks it). Creating a transfer (`Ledger::request_transfer`,
//! `Coordinator::submit`), driving and resuming it (`drive.rs`), resolving it by hand, the daily
//! limits, the conservation check and the halt flag, the idempotency horizon
//! (`horizon.rs`), the asset settings, and the fail points of the crash tests. It never reads
//! the environment, never starts a background service (the edge's start-up runs the periodic
//! work it offers), and never imports the read side (`projections`).

/// Whether a planted bug (`plant.rs`) is active: always false without the `plant` feature.
#[cfg(feature = "plant")]
macro_rules! planted {
    ($bug:ident) => {
        $crate::plant::active($crate::plant::Bug::$bug)
    };
}
#[cfg(not(feature = "plant"))]
macro_rules! planted {
    ($bug:ident) => {
        false
    };
}

pub mod access;
pub mod alerts;
pub mod assets;
pub mod audit;
pub mod books;
pub mod bulk;
pub mod cell_map;
pub mod coordinator;
pub mod daily;
pub mod drive;
pub mod error;
pub mod external_ids;
pub mod failpoint;
pub(crate) mod funded;
pub mod halt;
pub mod horizon;
pub mod ledger;
pub mod moves;
#[cfg(feature = "plant")]
pub mod plant;
pub mod ports;
pub mod queries;
pub mod reads;
pub mod repair;
pub mod request;
pub mod resolve;
pub mod round;
mod round_queue;
pub mod stores;
pub mod submit;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use assets::AssetSettings;
pub use coordinator::{Coordinator, CoordinatorError, NewTransfer, Ports, StoreCause};
pub use daily::{Charge, DailyLimits, DailyUsage};
pub use drive::{Resumed, StillOpen};
pub use error::StoreError;
pub use failpoint::{FailPoint, FailPoints, UnknownFailPoint};
pub use horizon::{Horizon, HorizonConfig};
pub use ledger::accounts::{AccountError, DepositRequest, Deposited, StatusSet};
pub use ledger::requests::RequestError;
pub use ledger::{Ledger, RateGate, Stores, Unlimited};
pub use ports::{
    CidClaim, ClientKey, ClientKeys, Clock, Commit, Creation, CreationOutcome, DailyReservations,
    LeaseRequest, Leases, Rekeyed, SystemClock, TransferLog,
};
pub use queries::Queries;
pub use repair::{RepairDesk, RepairError, RepairOutcome};
pub use request::TransferRequest;
pub use resolve::ManualResolutionError;

/// An error with its causes, `: `-separated: the detail an operator needs in a log line or the
/// attempt log, never shown to clients.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        // A variant that shows its source in its own message already says it.
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}
