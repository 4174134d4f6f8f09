//! `EventKind`: which event a `domain::TransferEvent` is, without its payload, so a fast test
//! names the events it expects as values the compiler checks (a renamed or added event breaks
//! the match below, not a string comparison at run time).

use domain::TransferEvent;

/// One variant per `TransferEvent` variant, same name, no payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    TransferCreated,
    SourceWithdrawStarted,
    SourceWithdrawn,
    TransferFailed,
    TargetDepositStarted,
    TransferCommitted,
    CompensationStarted,
    TransferRolledBack,
    TransferManuallyResolved,
}

impl EventKind {
    /// The kind of `event`.
    pub fn of(event: &TransferEvent) -> Self {
        use TransferEvent as E;
        match event {
            E::TransferCreated { .. } => Self::TransferCreated,
            E::SourceWithdrawStarted { .. } => Self::SourceWithdrawStarted,
            E::SourceWithdrawn { .. } => Self::SourceWithdrawn,
            E::TransferFailed { .. } => Self::TransferFailed,
            E::TargetDepositStarted { .. } => Self::TargetDepositStarted,
            E::TransferCommitted { .. } => Self::TransferCommitted,
            E::CompensationStarted { .. } => Self::CompensationStarted,
            E::TransferRolledBack { .. } => Self::TransferRolledBack,
            E::TransferManuallyResolved { .. } => Self::TransferManuallyResolved,
        }
    }
}

impl From<&TransferEvent> for EventKind {
    fn from(event: &TransferEvent) -> Self {
        Self::of(event)
    }
}
