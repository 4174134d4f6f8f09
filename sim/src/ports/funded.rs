//! The event log with a co-located FUNDING book (ADR 0024, `SimFundedLog`): the testkit's log
//! (`MemLog`) whose `commit_funded` writes, in one store call (one transaction: one fault
//! before or after all of it), each item's claim, charge and announcement, then FUNDING's
//! decision of the movement it announces (the world's book, by the rules of
//! `funding_fresh_movements`, its arrival checked against the rows of that same write), then
//! the events recording the decision. The planted bug `funded-apart` makes the movement in a
//! call of its own before the events' call: the arrival check finds it.

use application::daily::DailyLimits;
use application::ports::{
    Commit, Context, Creation, CreationOutcome, Funded, FundedOutcome, FundingDecision, TransferLog,
};
use application::testkit::{Durable, MemLog, Store, StoreCall};
use application::CoordinatorError;
use async_trait::async_trait;
use chrono::NaiveDate;
use domain::{AdapterOutcome, ReqId, TransferState};

use super::funding::{funding_apply, funding_decide};
use super::Sim;
use crate::world::{short, System};

/// The log of the even seeds: creations with their claims and charges (ADR 0022) and FUNDING's
/// movements with their events (ADR 0024).
#[derive(Clone)]
pub struct SimFundedLog {
    pub sim: Sim,
}

impl SimFundedLog {
    fn log(&self) -> MemLog {
        MemLog(self.sim.store.clone())
    }
}

#[async_trait]
impl TransferLog for SimFundedLog {
    async fn load(&self, req_id: &ReqId) -> Result<Context, CoordinatorError> {
        self.log().load(req_id).await
    }

    async fn append(&self, commit: Commit) -> Result<usize, CoordinatorError> {
        self.log().append(commit).await
    }

    async fn create_many(
        &self,
        creations: Vec<Creation>,
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Option<Vec<Result<CreationOutcome, CoordinatorError>>> {
        self.log().create_many(creations, limits, day).await
    }

    async fn commit_funded(
        &self,
        items: &[Funded],
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Option<Vec<Result<FundedOutcome, CoordinatorError>>> {
        if application::plant::active(application::plant::Bug::FundedApart) {
            return Some(self.apart(items, limits, day).await);
        }
        let store = &self.sim.store;
        let made = store
            .call(
                StoreCall::Append(TransferState::SourcePending),
                |rows, now| {
                    Ok(items
                        .iter()
                        .map(|item| self.write(store, rows, now, item, limits, day))
                        .collect::<Vec<_>>())
                },
            )
            .await;
        // A failed call (before or after its effect) answers every item with its error.
        Some(made.unwrap_or_else(|e| items.iter().map(|_| Err(e.clone())).collect()))
    }

    fn funds_together(&self) -> bool {
        true
    }
}

impl SimFundedLog {
    /// One item, all or nothing, on the rows of the write.
    fn write(
        &self,
        store: &Store,
        rows: &mut Durable,
        now: u64,
        item: &Funded,
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Result<FundedOutcome, CoordinatorError> {
        let created =
            MemLog::create_together(store, rows, now, vec![item.creation.clone()], limits, day)
                .pop()
                .unwrap_or_else(|| Err(CoordinatorError::invariant("sim: no answer")))?;
        let sequence = match created {
            CreationOutcome::Appended(sequence) => sequence,
            CreationOutcome::KeyTaken => return Ok(FundedOutcome::KeyTaken),
            CreationOutcome::Refused(code) => return Ok(FundedOutcome::Refused(code)),
        };
        let m = &item.movement;
        let id = m.req_id.to_string();
        let decided = {
            let mut w = self.sim.world();
            w.check_arrival_in(rows, System::Funding, &id, item.operation);
            let decided = funding_decide(&mut w, item.operation, m);
            w.note(|| {
                format!(
                    "funding {} {} with its events -> {decided:?}",
                    item.operation.as_str(),
                    short(&id)
                )
            });
            decided
        };
        let Some(decision) = decision(decided) else {
            // Not decided here (a repeat, say): the announcement alone, the call made apart.
            return Ok(FundedOutcome::Announced(sequence));
        };
        let events = (item.record)(&decision)?;
        let announcement = &item.creation.commit;
        let commit = Commit {
            aggregate_id: announcement.aggregate_id.clone(),
            expected_sequence: sequence,
            events,
            owner: announcement.owner,
        };
        let sequence = MemLog::append_in(store, rows, now, commit)?;
        Ok(FundedOutcome::Made { sequence, decision })
    }

    /// Planted: each movement in a transaction of its own, before its events' write.
    async fn apart(
        &self,
        items: &[Funded],
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Vec<Result<FundedOutcome, CoordinatorError>> {
        let mut answers = Vec::with_capacity(items.len());
        for item in items {
            let decided = funding_apply(&mut self.sim.world(), item.operation, &item.movement);
            let created = self
                .log()
                .create_many(vec![item.creation.clone()], limits, day)
                .await
                .and_then(|mut a| a.pop());
            answers.push(match (created, decision(decided)) {
                (Some(Ok(CreationOutcome::Appended(sequence))), Some(decision)) => {
                    match (item.record)(&decision) {
                        Ok(events) => self
                            .log()
                            .append(Commit {
                                aggregate_id: item.creation.commit.aggregate_id.clone(),
                                expected_sequence: sequence,
                                events,
                                owner: item.creation.commit.owner,
                            })
                            .await
                            .map(|sequence| FundedOutcome::Made { sequence, decision }),
                        Err(e) => Err(e),
                    }
                }
                (Some(Ok(CreationOutcome::Appended(sequence))), None) => {
                    Ok(FundedOutcome::Announced(sequence))
                }
                (Some(Ok(CreationOutcome::KeyTaken)), _) => Ok(FundedOutcome::KeyTaken),
                (Some(Ok(CreationOutcome::Refused(code))), _) => Ok(FundedOutcome::Refused(code)),
                (Some(Err(e)), _) => Err(e),
                (None, _) => Err(CoordinatorError::invariant("sim: no answer")),
            });
        }
        answers
    }
}

/// FUNDING's answer as a decision to record, `None` when it is not one.
fn decision(outcome: AdapterOutcome) -> Option<FundingDecision> {
    match outcome {
        AdapterOutcome::Success => Some(FundingDecision::Applied),
        AdapterOutcome::ExplicitFail { code, message } => {
            Some(FundingDecision::Refused { code, message })
        }
        _ => None,
    }
}
