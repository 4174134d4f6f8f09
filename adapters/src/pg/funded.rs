//! `TransferLog::commit_funded` in PostgreSQL (ADR 0024): each item goes to the group-commit
//! appender as a creation does (`event_store::Extras`), with the FUNDING movement it announces
//! (`event_store::Call`), so the appender's one transaction claims and charges (a creation's),
//! makes the movement (`funding::together`: FUNDING's own function, checks and journal key),
//! and appends the announcement and the events recording the decision, in that order; the
//! feed's lock is taken last, in the INSERT, as every writer takes it.

use std::sync::Arc;

use application::daily::DailyLimits;
use application::ports::{Commit, Funded, FundedOutcome};
use application::CoordinatorError;
use chrono::NaiveDate;
use domain::Transfer;

use super::serialized::{persistence, serialize};
use crate::event_store::{BatchingEventRepository, Call, Extras, Record, Written};
use crate::FundingLedger;

/// The appender's call for `item`: its movement, and its record serialized after its commit.
/// `None` when FUNDING does not decide it here (an asset its own check refuses): only the
/// announcement is written, and the call is made the separate way, which refuses and records.
fn call_of(funding: &FundingLedger, item: &Funded) -> Option<Call> {
    if !funding.decides_here(item.operation, &item.movement) {
        return None;
    }
    let announcement = &item.creation.commit;
    let aggregate_id = announcement.aggregate_id.clone();
    let after = announcement.expected_sequence + announcement.events.len();
    let owner = announcement.owner;
    let events = item.record.clone();
    let record: Record = Arc::new(move |decision| {
        let commit = Commit {
            aggregate_id: aggregate_id.clone(),
            expected_sequence: after,
            events: events(decision).map_err(|e| e.to_string())?,
            owner,
        };
        serialize(&commit).map_err(|e| e.to_string())
    });
    Some(Call {
        op: item.operation,
        movement: item.movement.clone(),
        record,
    })
}

/// Writes `items` through `repo`'s appender, one answer per item in order.
pub(super) async fn commit(
    repo: &BatchingEventRepository,
    funding: &FundingLedger,
    items: &[Funded],
    limits: &DailyLimits,
    day: NaiveDate,
) -> Vec<Result<FundedOutcome, CoordinatorError>> {
    let mut answers: Vec<Result<usize, CoordinatorError>> = Vec::with_capacity(items.len());
    let mut serialized = Vec::with_capacity(items.len());
    let mut extras = Extras {
        claims: Vec::with_capacity(items.len()),
        charges: Vec::with_capacity(items.len()),
        limits: Arc::new(limits.clone()),
        day,
        calls: Vec::with_capacity(items.len()),
    };
    for item in items {
        let commit = &item.creation.commit;
        match serialize(commit) {
            Ok(events) => {
                answers.push(Ok(commit.expected_sequence + commit.events.len()));
                serialized.push(events);
                extras.claims.push(item.creation.claim.clone());
                extras.charges.push(item.creation.charge.clone());
                extras.calls.push(call_of(funding, item));
            }
            Err(e) => answers.push(Err(e)),
        }
    }
    let mut written = repo
        .create_many::<Transfer>(serialized, extras)
        .await
        .into_iter();
    answers
        .into_iter()
        .zip(items)
        .map(|(answer, item)| {
            let sequence = answer?;
            match written.next() {
                Some(Ok(Written::Appended)) => Ok(FundedOutcome::Announced(sequence)),
                Some(Ok(Written::Funded(decision))) => {
                    let recorded = (item.record)(&decision)?.len();
                    Ok(FundedOutcome::Made {
                        sequence: sequence + recorded,
                        decision,
                    })
                }
                Some(Ok(Written::KeyTaken)) => Ok(FundedOutcome::KeyTaken),
                Some(Ok(Written::Refused(code))) => Ok(FundedOutcome::Refused(code)),
                Some(Err(e)) => Err(persistence(e)),
                None => Err(CoordinatorError::invariant("the appender lost an answer")),
            }
        })
        .collect()
}
