//! Driving a transfer: the one loop that takes it, step by step, to a terminal state or to a call
//! whose outcome is unknown. A request drives its own new transfer straight on; the recovery
//! worker resumes one someone else left, asking the account system what it recorded for the
//! pending call (`AccountPort::lookup`) before retrying it.

use std::fmt;

use domain::{
    invariant, AccountPort, AdapterOutcome, Movement, Operation, Recorded, ReqId, StepOutcome,
    TransferCommand, TransferData, TransferState,
};

use crate::coordinator::{Context, Coordinator, CoordinatorError};
use crate::failpoint::FailPoint;

/// Why a driven transfer is still open.
#[derive(Debug, Clone, PartialEq)]
pub enum StillOpen {
    /// The pending call came to `outcome`, which records nothing: an unknown outcome, or a
    /// refund the source refused (a refund is never given up).
    Call {
        operation: Operation,
        outcome: AdapterOutcome,
    },
    /// A manual resolution was committed, but its follow-up drive stopped on this error.
    FollowUp(CoordinatorError),
}

impl fmt::Display for StillOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Call { operation, outcome } => {
                let step = match operation {
                    Operation::Withdraw => "source withdraw",
                    Operation::Deposit => "target deposit",
                    Operation::Refund => "source refund",
                };
                write!(f, "{step}: {outcome:?}")
            }
            Self::FollowUp(e) => write!(f, "follow-up drive: {e}"),
        }
    }
}

/// Where a transfer stands after one drive.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    pub data: TransferData,
    /// Why it is still open. `None` when terminal.
    pub unknown: Option<StillOpen>,
}

/// What one step came to.
enum Stepped {
    /// The step's event is committed; the context is advanced past it.
    Next(Context),
    /// The call recorded nothing; says what happened, for the worker's retry record.
    Open(StillOpen),
}

impl Coordinator {
    /// Drives a transfer from whatever state its events say, as far as it goes: to a terminal
    /// state, or to a step whose outcome is unknown (left as it is).
    pub async fn drive(&self, req_id: &ReqId) -> Result<TransferData, CoordinatorError> {
        let ctx = self.load_context(req_id).await?;
        Ok(self.drive_loop(ctx, false, &mut None).await?.data)
    }

    /// Drives a transfer someone else left, as the recovery worker does: every pending call is
    /// looked up before it is retried. Stops at a terminal state or at an unknown outcome, and
    /// says which.
    pub async fn resume(&self, req_id: &ReqId) -> Result<Resumed, CoordinatorError> {
        let ctx = self.load_context(req_id).await?;
        self.drive_loop(ctx, true, &mut None).await
    }

    /// The drive loop, keeping in `last` the newest state known to be committed. With
    /// `lookup_first`, the account system is asked what it recorded for each pending call
    /// before the call is retried.
    pub(crate) async fn drive_loop(
        &self,
        mut ctx: Context,
        lookup_first: bool,
        last: &mut Option<TransferData>,
    ) -> Result<Resumed, CoordinatorError> {
        loop {
            let Some(data) = ctx.aggregate.data.clone() else {
                return Err(CoordinatorError::NotFound);
            };
            *last = Some(data.clone());
            if data.state.is_terminal() {
                return Ok(Resumed {
                    data,
                    unknown: None,
                });
            }
            let before = ctx.current_sequence;
            match self.step(ctx, &data, lookup_first).await? {
                Stepped::Next(next) => {
                    // Each step commits at least one event, past the sequence it was decided
                    // on: the loop makes progress and ends (the table has no cycle).
                    invariant!(
                        next.current_sequence > before
                            && next.aggregate.state() != Some(data.state),
                        "{}: a step from {} at sequence {before} left it at {:?}, sequence {}",
                        data.req_id,
                        data.state,
                        next.aggregate.state(),
                        next.current_sequence
                    );
                    ctx = next
                }
                // The state stays (the in-memory aggregate is current); the transfer waits for
                // a retry.
                Stepped::Open(why) => {
                    return Ok(Resumed {
                        data,
                        unknown: Some(why),
                    })
                }
            }
        }
    }

    /// One step by state (contract §6.2): persist the announcement, call, record the
    /// outcome. The fail points are the CRA-001..006 crash points (the create's own,
    /// `after_created_withdraw_started`, is in `submit.rs`).
    async fn step(
        &self,
        ctx: Context,
        data: &TransferData,
        lookup_first: bool,
    ) -> Result<Stepped, CoordinatorError> {
        let fail = &self.failpoints;
        let movement = Movement {
            req_id: data.req_id,
            user_id: data.user_id,
            asset: data.asset.clone(),
            amount: data.amount,
        };
        let source = self.port(data.from);
        let target = self.port(data.to);
        let at = || self.clock.now();
        let command = match data.state {
            // INIT and SOURCE_DONE are never committed alone by this code (see
            // `Coordinator::execute_through`); a transfer is found in them only in a log written
            // before that, or after a manual resolution to SOURCE_DONE. Stepped as they always
            // were: the announcement alone.
            TransferState::Init | TransferState::SourceDone => {
                fail.hit(if data.state == TransferState::Init {
                    FailPoint::AfterInit
                } else {
                    FailPoint::AfterSourceDone
                });
                TransferCommand::call_free_step(data.state, at())
                    .expect("INIT and SOURCE_DONE have a call-free step")
            }
            TransferState::SourcePending => {
                return self.withdraw_step(ctx, data, &movement, lookup_first).await
            }
            TransferState::TargetPending => {
                fail.hit(FailPoint::TargetPendingBeforeCall);
                let outcome =
                    call_or_lookup(target, Operation::Deposit, &movement, lookup_first).await;
                fail.hit(FailPoint::TargetAfterCall);
                match definite(data, Operation::Deposit, outcome) {
                    Ok(outcome) => TransferCommand::RecordTargetOutcome { outcome, at: at() },
                    Err(open) => return Ok(Stepped::Open(open)),
                }
            }
            TransferState::Compensating => {
                fail.hit(FailPoint::CompensatingBeforeRefund);
                let outcome =
                    call_or_lookup(source, Operation::Refund, &movement, lookup_first).await;
                fail.hit(FailPoint::CompensatingAfterRefund);
                match outcome {
                    AdapterOutcome::Success => TransferCommand::RecordRefund { at: at() },
                    other => {
                        // A refund is never given up: it stays COMPENSATING until it succeeds.
                        tracing::error!(req_id = %data.req_id, outcome = ?other, "refund not applied; transfer stays COMPENSATING");
                        return Ok(Stepped::Open(StillOpen::Call {
                            operation: Operation::Refund,
                            outcome: other,
                        }));
                    }
                }
            }
            TransferState::Committed | TransferState::Failed | TransferState::RolledBack => {
                unreachable!("terminal states are not stepped")
            }
        };
        Ok(Stepped::Next(self.execute(ctx, command).await?))
    }

    /// SOURCE_PENDING: call (or look up) the withdraw and record its outcome. A withdrawn
    /// source goes straight on to the deposit's announcement, in the same commit:
    /// SourceWithdrawn and TargetDepositStarted are durable together, before the deposit is
    /// called.
    async fn withdraw_step(
        &self,
        ctx: Context,
        data: &TransferData,
        movement: &Movement,
        lookup_first: bool,
    ) -> Result<Stepped, CoordinatorError> {
        let fail = &self.failpoints;
        fail.hit(FailPoint::SourcePendingBeforeCall);
        let source = self.port(data.from);
        let outcome = call_or_lookup(source, Operation::Withdraw, movement, lookup_first).await;
        fail.hit(FailPoint::SourceAfterCall);
        let command = match definite(data, Operation::Withdraw, outcome) {
            Ok(outcome) => {
                if planted!(PersistAfterCall) && outcome == StepOutcome::Succeeded {
                    // Planted: the deposit is called before its announcement is durable.
                    let _ = self.port(data.to).deposit(movement).await;
                }
                TransferCommand::RecordSourceOutcome {
                    outcome,
                    at: self.clock.now(),
                }
            }
            Err(open) => return Ok(Stepped::Open(open)),
        };
        let next = self.execute_through(ctx, command).await?;
        if next.aggregate.state() == Some(TransferState::TargetPending) {
            fail.hit(FailPoint::AfterWithdrawnDepositStarted);
        }
        Ok(Stepped::Next(next))
    }
}

/// Turns an adapter outcome into a recordable one, or says why it cannot be recorded.
pub(crate) fn definite(
    data: &TransferData,
    operation: Operation,
    outcome: AdapterOutcome,
) -> Result<StepOutcome, StillOpen> {
    let what = match operation {
        Operation::Withdraw => "source withdraw",
        Operation::Deposit => "target deposit",
        Operation::Refund => "source refund",
    };
    let explicit = matches!(
        outcome,
        AdapterOutcome::Success | AdapterOutcome::ExplicitFail { .. }
    );
    let decided = decide_outcome(data, operation, what, outcome);
    // Postcondition: only the account system's own answer is recorded. A refusal recorded for
    // an unknown outcome fails or compensates a transfer whose movement may be applied.
    invariant!(
        decided.is_err() || explicit,
        "{}: {what} recorded as {:?} without the account system's answer",
        data.req_id,
        decided
    );
    decided
}

fn decide_outcome(
    data: &TransferData,
    operation: Operation,
    what: &str,
    outcome: AdapterOutcome,
) -> Result<StepOutcome, StillOpen> {
    match outcome {
        AdapterOutcome::Success => Ok(StepOutcome::Succeeded),
        AdapterOutcome::ExplicitFail { code, message } => {
            tracing::info!(req_id = %data.req_id, %code, "{what} refused");
            Ok(StepOutcome::Refused { code, message })
        }
        unknown if planted!(CompensateOnUnknown) => Ok(StepOutcome::Refused {
            code: "PLANTED".to_owned(),
            message: format!("planted: unknown outcome {unknown:?} taken as a refusal"),
        }),
        unknown => {
            tracing::warn!(req_id = %data.req_id, state = %data.state, outcome = ?unknown, "{what} outcome unknown; state kept for retry");
            Err(StillOpen::Call {
                operation,
                outcome: unknown,
            })
        }
    }
}

/// Calls the adapter, first asking the account system what it recorded when `lookup_first`:
/// a recorded decision is the call's answer (the same one an idempotent repeat would return),
/// and only an operation never seen, or a system that cannot say, is called again.
async fn call_or_lookup(
    port: &dyn AccountPort,
    operation: Operation,
    movement: &Movement,
    lookup_first: bool,
) -> AdapterOutcome {
    if lookup_first && !planted!(ResumeWithoutLookup) {
        match port.lookup(movement, operation).await {
            Recorded::Applied => {
                tracing::info!(req_id = %movement.req_id, ?operation, "lookup: already applied; recording without a new call");
                return AdapterOutcome::Success;
            }
            Recorded::Refused { code, message } => {
                tracing::info!(req_id = %movement.req_id, ?operation, %code, "lookup: already refused");
                return AdapterOutcome::ExplicitFail { code, message };
            }
            Recorded::NotSeen if planted!(NotSeenAsRefusal) => {
                return AdapterOutcome::ExplicitFail {
                    code: "NOT_SEEN".to_owned(),
                    message: "planted: not seen taken as a refusal".to_owned(),
                };
            }
            Recorded::NotSeen => {}
            Recorded::Unavailable(why) => {
                tracing::debug!(req_id = %movement.req_id, ?operation, %why, "lookup unavailable; retrying the idempotent call");
            }
            // The key holds another movement: a retry would only be refused as a conflict, and
            // nothing about this movement is known. It stays open for an operator.
            Recorded::Mismatch(why) => {
                tracing::error!(req_id = %movement.req_id, ?operation, %why, "lookup: req_id recorded for a different movement");
                return AdapterOutcome::Mismatch(format!("MISMATCH: {why}"));
            }
        }
    }
    match operation {
        Operation::Withdraw => port.withdraw(movement).await,
        Operation::Deposit => port.deposit(movement).await,
        Operation::Refund => port.refund(movement).await,
    }
}
