//! The process manager: the coordinator that drives each transfer through the state machine via
//! the adapters (persist before every call, compensate only on an explicit refusal), and the
//! sweeper that resumes transfers left open.

pub mod coordinator;
pub mod event_log;
pub mod failpoint;
pub mod lease;
pub mod limits;
pub mod sweeper;

pub use coordinator::{Coordinator, CoordinatorError, NewTransfer, TransferStore};
pub use limits::DailyLimits;
pub use sweeper::Sweeper;
pub use sweeper::{RecoveryConfig, StuckTransfer, Worker};
