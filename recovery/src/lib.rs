//! The process manager: the coordinator that drives each transfer through the state machine via
//! the adapters (persist before every call, compensate only on an explicit refusal), and the
//! sweeper that resumes transfers left open.

pub mod coordinator;
pub mod sweeper;

pub use coordinator::{Coordinator, CoordinatorError, NewTransfer, TransferStore};
pub use sweeper::Sweeper;
