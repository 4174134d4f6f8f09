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
    /// The store could not be reached or answered strangely: the outcome of a write is unknown
    /// (it may or may not be durable); the caller reloads before acting again.
    #[error("store: {0}")]
    OutcomeUnknown(#[source] StoreCause),
    /// An internal invariant broke (a bug, or stored data no code of ours writes): nothing about
    /// the store's state is in doubt, and retrying will not help.
    #[error("invariant broken: {0}")]
    Invariant(String),
}

/// A write the cell's partition fence refused (ADR 0023 §2): the user's partition is frozen
/// for a move, or another cell's now. Nothing of the write was applied; the request is to be
/// routed again under the current map, after a short wait. Carried as the cause of an
/// `OutcomeUnknown` (the coordinator reloads before acting again, as after any failed write).
#[derive(Debug, thiserror::Error)]
#[error("the user's partition is not this cell's to write now (frozen for a move, or moved): {0}")]
pub struct Fenced(pub String);

impl CoordinatorError {
    /// Whether the store refused the write at the partition fence ([`Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::OutcomeUnknown(cause) if cause.downcast_ref::<Fenced>().is_some())
    }

    /// A store failure with `cause`: the outcome is unknown.
    pub fn outcome_unknown(
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::OutcomeUnknown(Arc::from(cause.into()))
    }

    /// An internal invariant broke: `what` says which.
    pub fn invariant(what: impl Into<String>) -> Self {
        Self::Invariant(what.into())
    }
}

/// A store's failure (PostgreSQL in production) in one of the core's public errors, with its
/// cause kept whole for `error_chain`: the driver's own error type stays in the adapter that
/// made it (`StoreError::new` there), and the core names none.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct StoreError(StoreCause);

impl StoreError {
    /// A store failure caused by `cause`.
    pub fn new(cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self(Arc::from(cause.into()))
    }

    /// A store failure described by `what` alone (a store with no driver error to keep).
    pub fn msg(what: impl Into<String>) -> Self {
        Self::new(what.into())
    }

    /// Whether the store refused the write at the partition fence ([`Fenced`]): nothing was
    /// written.
    pub fn is_fenced(&self) -> bool {
        self.cause::<Fenced>().is_some()
    }

    /// The failure's cause, when it is a `T` (a typed refusal a port reports through it).
    pub fn cause<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

impl From<StoreError> for CoordinatorError {
    fn from(e: StoreError) -> Self {
        Self::OutcomeUnknown(e.0)
    }
}

/// Tests expect exact errors; two store failures are the same only when they share one cause.
impl PartialEq for CoordinatorError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Refused(a), Self::Refused(b)) => a == b,
            (Self::Conflict, Self::Conflict) | (Self::NotFound, Self::NotFound) => true,
            (Self::Transition(a), Self::Transition(b)) => a == b,
            (Self::OutcomeUnknown(a), Self::OutcomeUnknown(b)) => Arc::ptr_eq(a, b),
            (Self::Invariant(a), Self::Invariant(b)) => a == b,
            _ => false,
        }
    }
}

impl From<AggregateError<TransferError>> for CoordinatorError {
    fn from(e: AggregateError<TransferError>) -> Self {
        match e {
            AggregateError::UserError(e) => Self::Transition(e),
            AggregateError::AggregateConflict => Self::Conflict,
            other => Self::outcome_unknown(other),
        }
    }
}
