//! The Transfer aggregate: its commands, versioned past-tense events and the transition table
//! (its states and the steps each may take are `state.rs`). All business rules live in `handle`;
//! `apply` only folds.

use chrono::{DateTime, Utc};
use cqrs_es::event_sink::EventSink;
use cqrs_es::{Aggregate, DomainEvent};
use serde::{Deserialize, Serialize};

use crate::codes::ErrorCode;
pub use crate::state::TransferState;
use crate::values::{AccountType, Amount, AssetSymbol, ReqId, UserId};

/// The version every `TransferEvent` is written with; a reader refuses any other (there is no
/// upcaster yet).
pub const EVENT_VERSION: &str = "1";

/// What an account system definitely said about one step. Unknown outcomes are not commands:
/// they change nothing, so the coordinator records nothing for them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepOutcome {
    Succeeded,
    Refused { code: String, message: String },
}

/// What an operator confirmed about the adapter call a transfer is waiting on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// The pending call was applied in its account system.
    Applied,
    /// The pending call was not applied and never will be.
    NotApplied,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "APPLIED",
            Self::NotApplied => "NOT_APPLIED",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "APPLIED" => Some(Self::Applied),
            "NOT_APPLIED" => Some(Self::NotApplied),
            _ => None,
        }
    }
}

/// Where a manual resolution may take a transfer: the state the confirmed fact proves, never
/// further. Returns `None` where the state allows no manual resolution with this fact.
///
/// - SOURCE_PENDING, withdraw applied → SOURCE_DONE (the deposit is then driven as usual);
///   withdraw not applied → FAILED (nothing left the source).
/// - TARGET_PENDING, deposit applied → COMMITTED; deposit not applied → COMPENSATING (the refund
///   is then driven and retried until it succeeds).
/// - COMPENSATING, refund applied → ROLLED_BACK; "refund not applied" proves nothing new (the
///   refund keeps being retried), so it is refused.
/// - INIT and SOURCE_DONE wait on no outside call (the worker advances them without asking
///   anyone), and terminal states never change: refused.
pub fn manual_resolution_target(
    state: TransferState,
    resolution: Resolution,
) -> Option<TransferState> {
    use Resolution as R;
    use TransferState as S;
    match (state, resolution) {
        (S::SourcePending, R::Applied) => Some(S::SourceDone),
        (S::SourcePending, R::NotApplied) => Some(S::Failed),
        (S::TargetPending, R::Applied) => Some(S::Committed),
        (S::TargetPending, R::NotApplied) => Some(S::Compensating),
        (S::Compensating, R::Applied) => Some(S::RolledBack),
        _ => None,
    }
}

/// Commands carry the time they happen at; the domain never reads a clock.
#[derive(Debug, Clone, PartialEq)]
pub enum TransferCommand {
    Create {
        req_id: ReqId,
        user_id: UserId,
        from: AccountType,
        to: AccountType,
        asset: AssetSymbol,
        amount: Amount,
        cid: Option<String>,
        at: DateTime<Utc>,
    },
    /// Persisted before the source adapter is called.
    StartSourceWithdraw { at: DateTime<Utc> },
    RecordSourceOutcome {
        outcome: StepOutcome,
        at: DateTime<Utc>,
    },
    /// Persisted before the target adapter is called.
    StartTargetDeposit { at: DateTime<Utc> },
    RecordTargetOutcome {
        outcome: StepOutcome,
        at: DateTime<Utc>,
    },
    /// The refund of a compensating transfer was applied.
    RecordRefund { at: DateTime<Utc> },
    /// An operator confirmed what happened to the pending call (see
    /// [`manual_resolution_target`] for what each state allows).
    ManuallyResolve {
        resolution: Resolution,
        operator: String,
        reason: String,
        at: DateTime<Utc>,
    },
}

impl TransferCommand {
    /// The command that leaves `state` without any outside call: INIT announces the withdraw,
    /// SOURCE_DONE announces the deposit. `None` for a state that waits on a call and for a
    /// terminal one.
    ///
    /// Nothing can happen between such a state and its announcement, so the coordinator commits
    /// the announcement together with the event that led into the state (one commit, two
    /// events): the log still holds every event and the fold passes through every state, but a
    /// transfer waits on no durable step that protects no call. A log written before that (or by
    /// a manual resolution to SOURCE_DONE) can still hold a transfer in INIT or SOURCE_DONE; the
    /// drive loop steps it with this same command.
    pub fn call_free_step(state: TransferState, at: DateTime<Utc>) -> Option<Self> {
        match state {
            TransferState::Init => Some(Self::StartSourceWithdraw { at }),
            TransferState::SourceDone => Some(Self::StartTargetDeposit { at }),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "Create",
            Self::StartSourceWithdraw { .. } => "StartSourceWithdraw",
            Self::RecordSourceOutcome { .. } => "RecordSourceOutcome",
            Self::StartTargetDeposit { .. } => "StartTargetDeposit",
            Self::RecordTargetOutcome { .. } => "RecordTargetOutcome",
            Self::RecordRefund { .. } => "RecordRefund",
            Self::ManuallyResolve { .. } => "ManuallyResolve",
        }
    }
}

/// Events, past tense, each carrying what projections need. Version "1" for all; a later change
/// to a payload gets a new version and an upcaster, never an edit of stored rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TransferEvent {
    TransferCreated {
        req_id: ReqId,
        user_id: UserId,
        from: AccountType,
        to: AccountType,
        asset: AssetSymbol,
        amount: Amount,
        cid: Option<String>,
        at: DateTime<Utc>,
    },
    SourceWithdrawStarted {
        at: DateTime<Utc>,
    },
    SourceWithdrawn {
        at: DateTime<Utc>,
    },
    TransferFailed {
        code: String,
        message: String,
        at: DateTime<Utc>,
    },
    TargetDepositStarted {
        at: DateTime<Utc>,
    },
    TransferCommitted {
        at: DateTime<Utc>,
    },
    CompensationStarted {
        code: String,
        message: String,
        at: DateTime<Utc>,
    },
    TransferRolledBack {
        at: DateTime<Utc>,
    },
    /// An operator resolved the pending call; `from_state` → `to_state`, with who and why.
    TransferManuallyResolved {
        resolution: Resolution,
        from_state: TransferState,
        to_state: TransferState,
        operator: String,
        reason: String,
        at: DateTime<Utc>,
    },
}

impl TransferEvent {
    pub fn at(&self) -> DateTime<Utc> {
        match self {
            Self::TransferCreated { at, .. }
            | Self::SourceWithdrawStarted { at }
            | Self::SourceWithdrawn { at }
            | Self::TransferFailed { at, .. }
            | Self::TargetDepositStarted { at }
            | Self::TransferCommitted { at }
            | Self::CompensationStarted { at, .. }
            | Self::TransferRolledBack { at }
            | Self::TransferManuallyResolved { at, .. } => *at,
        }
    }

    /// The state a transfer is in right after this event.
    pub fn resulting_state(&self) -> TransferState {
        match self {
            Self::TransferCreated { .. } => TransferState::Init,
            Self::SourceWithdrawStarted { .. } => TransferState::SourcePending,
            Self::SourceWithdrawn { .. } => TransferState::SourceDone,
            Self::TransferFailed { .. } => TransferState::Failed,
            Self::TargetDepositStarted { .. } => TransferState::TargetPending,
            Self::TransferCommitted { .. } => TransferState::Committed,
            Self::CompensationStarted { .. } => TransferState::Compensating,
            Self::TransferRolledBack { .. } => TransferState::RolledBack,
            Self::TransferManuallyResolved { to_state, .. } => *to_state,
        }
    }
}

impl DomainEvent for TransferEvent {
    fn event_type(&self) -> String {
        let name = match self {
            Self::TransferCreated { .. } => "TransferCreated",
            Self::SourceWithdrawStarted { .. } => "SourceWithdrawStarted",
            Self::SourceWithdrawn { .. } => "SourceWithdrawn",
            Self::TransferFailed { .. } => "TransferFailed",
            Self::TargetDepositStarted { .. } => "TargetDepositStarted",
            Self::TransferCommitted { .. } => "TransferCommitted",
            Self::CompensationStarted { .. } => "CompensationStarted",
            Self::TransferRolledBack { .. } => "TransferRolledBack",
            Self::TransferManuallyResolved { .. } => "TransferManuallyResolved",
        };
        name.to_owned()
    }

    fn event_version(&self) -> String {
        EVENT_VERSION.to_owned()
    }
}

/// Refusals of the aggregate. Each is a typed value so tests can expect the exact one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("transfer already exists")]
    AlreadyExists,
    #[error("transfer does not exist")]
    NotCreated,
    #[error("transfer is in terminal state {state} and never changes")]
    Terminal { state: TransferState },
    #[error("{command} is not allowed in state {state}")]
    IllegalTransition {
        state: TransferState,
        command: &'static str,
    },
    #[error("invalid transfer: {0}")]
    Invalid(ErrorCode),
}

/// Everything known about one transfer, folded from its events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferData {
    pub req_id: ReqId,
    pub user_id: UserId,
    pub from: AccountType,
    pub to: AccountType,
    pub asset: AssetSymbol,
    pub amount: Amount,
    pub cid: Option<String>,
    pub state: TransferState,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The refusal that ended or reversed the transfer, if any: (code, message).
    pub failure: Option<(String, String)>,
}

/// The aggregate root. `None` until `TransferCreated`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    pub data: Option<TransferData>,
}

impl Transfer {
    pub fn state(&self) -> Option<TransferState> {
        self.data.as_ref().map(|d| d.state)
    }

    /// `handle` of a created transfer without a sink: the events `command` produces, already
    /// folded into `self`. Pure and synchronous, so a store can decide a step's events inside
    /// its own transaction (ADR 0024: the events recording a FUNDING movement made with them).
    pub fn step(&mut self, command: TransferCommand) -> Result<Vec<TransferEvent>, TransferError> {
        let Some(data) = &self.data else {
            return Err(TransferError::NotCreated);
        };
        let events = Self::decided(data, command)?;
        for event in &events {
            self.apply(event.clone());
        }
        Ok(events)
    }

    /// The table's events for `command` on a created transfer, with its postcondition checked.
    fn decided(
        data: &TransferData,
        command: TransferCommand,
    ) -> Result<Vec<TransferEvent>, TransferError> {
        let events = Self::decide(data.state, command)?;
        // Postcondition of the table: one event per accepted command, along an edge of the
        // table, never out of a terminal state.
        crate::invariant!(
            events.len() == 1 && data.state.may_step_to(events[0].resulting_state()),
            "the transition table moved {} {} -> {:?}",
            data.req_id,
            data.state,
            events
                .iter()
                .map(TransferEvent::resulting_state)
                .collect::<Vec<_>>()
        );
        Ok(events)
    }

    /// The transition table. Returns the events a command produces in `state`, or the refusal.
    // long: the transition table, one arm per (state, command), kept whole so it reads as the table.
    fn decide(
        state: TransferState,
        command: TransferCommand,
    ) -> Result<Vec<TransferEvent>, TransferError> {
        use TransferCommand as C;
        use TransferState as S;
        if state.is_terminal() {
            return Err(TransferError::Terminal { state });
        }
        let name = command.name();
        let events = match (state, command) {
            (S::Init, C::StartSourceWithdraw { at }) => {
                vec![TransferEvent::SourceWithdrawStarted { at }]
            }
            (S::SourcePending, C::RecordSourceOutcome { outcome, at }) => match outcome {
                StepOutcome::Succeeded => vec![TransferEvent::SourceWithdrawn { at }],
                StepOutcome::Refused { code, message } => {
                    vec![TransferEvent::TransferFailed { code, message, at }]
                }
            },
            (S::SourceDone, C::StartTargetDeposit { at }) => {
                vec![TransferEvent::TargetDepositStarted { at }]
            }
            (S::TargetPending, C::RecordTargetOutcome { outcome, at }) => match outcome {
                StepOutcome::Succeeded => vec![TransferEvent::TransferCommitted { at }],
                StepOutcome::Refused { code, message } => {
                    vec![TransferEvent::CompensationStarted { code, message, at }]
                }
            },
            (S::Compensating, C::RecordRefund { at }) => {
                vec![TransferEvent::TransferRolledBack { at }]
            }
            (
                state,
                C::ManuallyResolve {
                    resolution,
                    operator,
                    reason,
                    at,
                },
            ) => match manual_resolution_target(state, resolution) {
                // An operator's word is recorded with who and why; an empty name or reason
                // would make the record worthless.
                Some(_) if operator.trim().is_empty() || reason.trim().is_empty() => {
                    return Err(TransferError::Invalid(ErrorCode::BadRequest))
                }
                Some(to_state) => vec![TransferEvent::TransferManuallyResolved {
                    resolution,
                    from_state: state,
                    to_state,
                    operator,
                    reason,
                    at,
                }],
                None => {
                    return Err(TransferError::IllegalTransition {
                        state,
                        command: name,
                    })
                }
            },
            (state, C::Create { .. }) => {
                let _ = state;
                return Err(TransferError::AlreadyExists);
            }
            (state, _) => {
                return Err(TransferError::IllegalTransition {
                    state,
                    command: name,
                })
            }
        };
        Ok(events)
    }

    /// Checks of a new transfer that need no outside data: the coordinator's own defence in
    /// depth, so a caller that bypasses the API is refused the same way.
    fn validate_create(from: AccountType, to: AccountType) -> Result<(), TransferError> {
        if from == to {
            return Err(TransferError::Invalid(ErrorCode::SameAccount));
        }
        if !from.is_supported() || !to.is_supported() {
            return Err(TransferError::Invalid(ErrorCode::UnsupportedAccountType));
        }
        Ok(())
    }
}

impl Aggregate for Transfer {
    const TYPE: &'static str = "Transfer";
    type Command = TransferCommand;
    type Event = TransferEvent;
    type Error = TransferError;
    type Services = ();

    async fn handle(
        &mut self,
        command: Self::Command,
        _service: &Self::Services,
        sink: &EventSink<Self>,
    ) -> Result<(), Self::Error> {
        let events = match (&self.data, command) {
            (
                None,
                TransferCommand::Create {
                    req_id,
                    user_id,
                    from,
                    to,
                    asset,
                    amount,
                    cid,
                    at,
                },
            ) => {
                Self::validate_create(from, to)?;
                // Precondition of every later step: an amount is positive (`Amount`'s own
                // constructors) and the two sides differ (just checked).
                crate::invariant!(
                    amount.value() > rust_decimal::Decimal::ZERO && from != to,
                    "a transfer is created for a positive amount between two accounts: \
                     {req_id} {amount} {from}->{to}"
                );
                vec![TransferEvent::TransferCreated {
                    req_id,
                    user_id,
                    from,
                    to,
                    asset,
                    amount,
                    cid,
                    at,
                }]
            }
            (None, _) => return Err(TransferError::NotCreated),
            (Some(data), command) => Self::decided(data, command)?,
        };
        for event in events {
            sink.write(event, self).await;
        }
        Ok(())
    }

    fn apply(&mut self, event: Self::Event) {
        let state = event.resulting_state();
        let at = event.at();
        match event {
            TransferEvent::TransferCreated {
                req_id,
                user_id,
                from,
                to,
                asset,
                amount,
                cid,
                at,
            } => {
                self.data = Some(TransferData {
                    req_id,
                    user_id,
                    from,
                    to,
                    asset,
                    amount,
                    cid,
                    state,
                    created_at: at,
                    updated_at: at,
                    failure: None,
                });
            }
            other => {
                let data = self
                    .data
                    .as_mut()
                    .expect("events after TransferCreated only follow a created transfer");
                match other {
                    TransferEvent::TransferFailed { code, message, .. }
                    | TransferEvent::CompensationStarted { code, message, .. } => {
                        data.failure = Some((code, message));
                    }
                    // A manual FAILED or COMPENSATING carries the operator's reason as its cause.
                    TransferEvent::TransferManuallyResolved {
                        to_state: TransferState::Failed | TransferState::Compensating,
                        reason,
                        ..
                    } => {
                        data.failure = Some(("MANUALLY_RESOLVED".to_owned(), reason));
                    }
                    _ => {}
                }
                data.state = state;
                data.updated_at = at;
            }
        }
    }
}
