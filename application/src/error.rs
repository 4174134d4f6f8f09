//! The coordinator's error: what a command of the core can come to besides its answer. Its own
//! module so the ports (`ports.rs`) and their implementations (`pg.rs`) name it without
//! importing the coordinator that holds them.

use std::sync::Arc;

use cqrs_es::AggregateError;
use domain::{ErrorCode, TransferError};

/// The cause of a store failure, kept whole (shared, so the error stays cheap to clone).
pub type StoreCause = Arc<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CoordinatorError {
    /// The request is refused with this contract code; nothing was created.
    #[error("refused: {0}")]
    Refused(ErrorCode),
    /// Another writer changed the transfer first; this one stopped without acting.
    #[error("another writer changed the transfer first")]
    Conflict,
    #[error("transfer not found")]
    NotFound,
    /// The aggregate refused a command: a bug in the caller's sequencing.
    #[error("transition refused: {0}")]
    Transition(TransferError),
    /// The store could not be reached or answered strangely; the outcome of a write is unknown.
    #[error("store: {0}")]
    Store(#[source] StoreCause),
}

impl CoordinatorError {
    /// A store failure with `cause`.
    pub fn store(cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self::Store(Arc::from(cause.into()))
    }
}

/// Tests expect exact errors; two store failures are the same only when they share one cause.
impl PartialEq for CoordinatorError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Refused(a), Self::Refused(b)) => a == b,
            (Self::Conflict, Self::Conflict) | (Self::NotFound, Self::NotFound) => true,
            (Self::Transition(a), Self::Transition(b)) => a == b,
            (Self::Store(a), Self::Store(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl From<AggregateError<TransferError>> for CoordinatorError {
    fn from(e: AggregateError<TransferError>) -> Self {
        match e {
            AggregateError::UserError(e) => Self::Transition(e),
            AggregateError::AggregateConflict => Self::Conflict,
            other => Self::store(other),
        }
    }
}

impl From<sqlx::Error> for CoordinatorError {
    fn from(e: sqlx::Error) -> Self {
        Self::store(e)
    }
}
