//! A FUNDING movement written with the events that announce and record it (ADR 0024): when a
//! commit announces a call of FUNDING and the log holds FUNDING in its own database
//! (`TransferLog::funds_together`), the commit carries the call (`TransferLog::commit_funded`):
//! one durable write makes the movement and records its outcome, so the call and its
//! announcement are durable together or not at all. Used only where the announcement is new
//! (a creation, a round's recorded outcome); a transfer found with its announcement durable
//! (the recovery worker's resumptions, a manual resolution's drive) takes the separate steps,
//! looking the call up first.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use cqrs_es::Aggregate;
use domain::{
    invariant, AccountType, Movement, Operation, StepOutcome, Transfer, TransferCommand,
    TransferData, TransferEvent, TransferState,
};

use crate::coordinator::{Context, Coordinator, CoordinatorError};
use crate::ports::{Commit, Creation, Funded, FundedOutcome, FundingDecision, RecordOf};

/// Where a staged commit goes: with the FUNDING call it announces, or as it is.
pub(crate) enum Routed {
    Funded(Funded),
    Plain(Creation),
}

/// The FUNDING call a staged transfer waits on, if it waits on one: its operation and
/// movement.
pub(crate) fn funding_call(staged: &Context) -> Option<(Operation, Movement)> {
    let data = staged.aggregate.data.as_ref()?;
    let (operation, account) = match data.state {
        TransferState::SourcePending => (Operation::Withdraw, data.from),
        TransferState::TargetPending => (Operation::Deposit, data.to),
        TransferState::Compensating => (Operation::Refund, data.from),
        _ => return None,
    };
    (account == AccountType::Funding).then(|| (operation, movement_of(data)))
}

fn movement_of(data: &TransferData) -> Movement {
    Movement {
        req_id: data.req_id,
        user_id: data.user_id,
        asset: data.asset.clone(),
        amount: data.amount,
    }
}

/// The events recording FUNDING's `decision` of `operation` on `transfer` (which waits on it),
/// folded into it: the outcome, and after a withdraw the deposit's announcement (as
/// `execute_through` commits them). A refused refund records nothing: a refund is never given
/// up, and the transfer stays COMPENSATING, as on the separate steps.
fn record_decision(
    transfer: &mut Transfer,
    operation: Operation,
    decision: &FundingDecision,
    at: DateTime<Utc>,
) -> Result<Vec<TransferEvent>, CoordinatorError> {
    let outcome = match decision {
        FundingDecision::Applied => StepOutcome::Succeeded,
        FundingDecision::Refused { code, message } => StepOutcome::Refused {
            code: code.clone(),
            message: message.clone(),
        },
    };
    let command = match (operation, decision) {
        (Operation::Withdraw, _) => TransferCommand::RecordSourceOutcome { outcome, at },
        (Operation::Deposit, _) => TransferCommand::RecordTargetOutcome { outcome, at },
        (Operation::Refund, FundingDecision::Applied) => TransferCommand::RecordRefund { at },
        (Operation::Refund, FundingDecision::Refused { .. }) => return Ok(Vec::new()),
    };
    let mut events = transfer
        .step(command)
        .map_err(CoordinatorError::Transition)?;
    if operation == Operation::Withdraw {
        let next = transfer
            .state()
            .and_then(|state| TransferCommand::call_free_step(state, at));
        if let Some(next) = next {
            events.extend(transfer.step(next).map_err(CoordinatorError::Transition)?);
        }
    }
    Ok(events)
}

impl Coordinator {
    /// `creation` as an item of `commit_funded` when its staged transfer waits on a FUNDING
    /// call and the log can make it with the commit; the creation back otherwise.
    pub(crate) fn funded(&self, staged: &Context, creation: Creation) -> Routed {
        let call = self
            .log
            .funds_together()
            .then(|| funding_call(staged))
            .flatten();
        let Some((operation, movement)) = call else {
            return Routed::Plain(creation);
        };
        let at = self.clock.now();
        let waiting = staged.aggregate.clone();
        let record: RecordOf = Arc::new(move |decision: &FundingDecision| {
            record_decision(&mut waiting.clone(), operation, decision, at)
        });
        Routed::Funded(Funded {
            creation,
            operation,
            movement,
            record,
        })
    }

    /// The context after one item of `commit_funded` was written: the staged context advanced
    /// past the announcement and, when the call was made, past the events recording its
    /// decision (the same `record` the store wrote them by). `None` for a creation that wrote
    /// nothing (`KeyTaken`, `Refused`): the caller answers those.
    pub(crate) fn settle_funded(
        staged: Context,
        item: &Funded,
        outcome: &FundedOutcome,
    ) -> Option<Result<Context, CoordinatorError>> {
        let Commit {
            expected_sequence,
            events,
            ..
        } = &item.creation.commit;
        let announced = expected_sequence + events.len();
        let (current_sequence, recorded) = match outcome {
            FundedOutcome::Announced(sequence) => (*sequence, Vec::new()),
            FundedOutcome::Made { sequence, decision } => match (item.record)(decision) {
                Ok(recorded) => (*sequence, recorded),
                Err(e) => return Some(Err(e)),
            },
            FundedOutcome::KeyTaken | FundedOutcome::Refused(_) => return None,
        };
        // Postcondition of the write: the log put the announcement and the record right after
        // the sequence they were decided on.
        invariant!(
            current_sequence == announced + recorded.len(),
            "{}: funded write up to sequence {current_sequence}, decided for {}",
            staged.aggregate_id,
            announced + recorded.len()
        );
        let mut ctx = staged;
        for event in recorded {
            ctx.aggregate.apply(event);
        }
        Some(Ok(Context {
            current_sequence,
            ..ctx
        }))
    }

    /// Commits staged steps (`stage_steps`' answers) in one round: the ones announcing a
    /// FUNDING call with that call (`commit_funded`), the rest in one append, at the same time
    /// (the appender puts them in one transaction when they meet). One answer per step, in
    /// order, what `commit_many` answers.
    pub(crate) async fn append_staged_funded(
        &self,
        staged: Vec<(Context, Commit)>,
    ) -> Vec<Result<Context, CoordinatorError>> {
        let mut plain = Vec::new();
        let mut funded = Vec::new();
        let mut route = Vec::with_capacity(staged.len());
        for (ctx, commit) in staged {
            let creation = Creation {
                commit,
                claim: None,
                charge: None,
            };
            match self.funded(&ctx, creation) {
                Routed::Funded(item) => {
                    route.push(true);
                    funded.push((ctx, item));
                }
                Routed::Plain(creation) => {
                    route.push(false);
                    plain.push((ctx, creation.commit));
                }
            }
        }
        let items: Vec<Funded> = funded.iter().map(|(_, item)| item.clone()).collect();
        let day = crate::daily::day_of(self.clock.now());
        let (plain, made) = futures_util::future::join(self.append_staged(plain), async {
            match items.is_empty() {
                true => Some(Vec::new()),
                false => self.log.commit_funded(&items, &self.daily, day).await,
            }
        })
        .await;
        let made = made.unwrap_or_default();
        invariant!(
            made.len() == items.len(),
            "the log answered {} of {} funded commits",
            made.len(),
            items.len()
        );
        let mut made = funded.into_iter().zip(made).map(|((ctx, item), outcome)| {
            let outcome = outcome?;
            Self::settle_funded(ctx, &item, &outcome).unwrap_or_else(|| {
                Err(CoordinatorError::invariant(
                    "a step's commit answered as a creation",
                ))
            })
        });
        let mut plain = plain.into_iter();
        route
            .into_iter()
            .map(|funded| {
                let next = match funded {
                    true => made.next(),
                    false => plain.next(),
                };
                next.unwrap_or_else(|| Err(CoordinatorError::invariant("the log lost an answer")))
            })
            .collect()
    }
}
