//! Bulk transfers (`POST /api/v1/internal_transfers`): many transfers in one request, each its
//! own transfer (its own req_id, state machine and recovery; a batch is not one transaction),
//! with each step made for the whole batch at once:
//!
//! - every item is checked as the single route checks it, in contract §5.5's order and with its codes
//!   (`Ledger::request_transfers`), and a refused item does not stop the others;
//! - the batch's `TransferCreated` + `SourceWithdrawStarted` go in one append
//!   (`TransferLog::append_many`), then its withdraws in one call per account system
//!   (`AccountPort::movements`: one call of the funding batch, or one pipelined write to
//!   spot-core), then their outcomes in one append, and so on for the deposits and refunds.
//!
//! The single route's guarantees hold item by item: each outside call is made only after the
//! append that announces it answered (durable), an unknown outcome records nothing (the item
//! stays where it is and the recovery worker resumes it, looking it up first), and only an
//! explicit refusal moves money back.

mod calls;
mod create;

use std::collections::HashMap;

/// The default most transfers one bulk request may carry (`LEDGER_BULK_TRANSFERS_MAX`).
///
/// Big enough that a request's fixed costs (HTTP, JSON, authentication, the task, and above
/// all one append, one funding call and one spot-core fsync per step) are shared out thinly;
/// small enough that one request's work stays a short, bounded unit: its body at most about
/// 256 KB (`body_bytes_max`), its creation one appender transaction of 2,000 event rows, its
/// calls one funding statement and one pipelined spot-core write of 512 each, the whole well
/// inside the 30 s request timeout (a batch of 1,000 takes well under a second on a quiet
/// machine), and one client's batch never holds the shared appender for long. Formance's
/// default is 100 and TigerBeetle's ceiling 8,189; a back office that needs more sends more
/// requests, which run concurrently.
pub const TRANSFERS_PER_REQUEST_MAX_DEFAULT: usize = 1_000;

/// Most bytes one item of a bulk request's body may take on average (its longest legal form is
/// about 200: every field at its longest, a cid of 64 characters, a user id of 19 digits).
pub const ITEM_BYTES_MAX: usize = 256;

/// The body limit of a bulk request carrying at most `transfers_max` transfers.
pub fn body_bytes_max(transfers_max: usize) -> usize {
    transfers_max
        .saturating_mul(ITEM_BYTES_MAX)
        .saturating_add(1024)
}
use domain::{invariant, ErrorCode, Operation, TransferData, TransferState, UserId};

use crate::coordinator::{Context, Coordinator, CoordinatorError, NewTransfer};
use crate::failpoint::FailPoint;

/// Where an item of a batch stands before its creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Its own transfer (or repeat) to look after.
    Own,
    /// The same cid and body as the earlier item at this index: the same answer.
    SameAs(usize),
    /// Refused: the same cid as an earlier item with another body.
    Reused,
}

/// Each item's slot: an item whose user and cid an earlier item of the batch already used is
/// that item's repeat (same body) or refused (another body), as a later request would be.
pub(crate) fn cid_slots(items: &[Option<(UserId, Option<&str>, String)>]) -> Vec<Slot> {
    let mut first: HashMap<(UserId, &str), (usize, &str)> = HashMap::new();
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Some((user, Some(cid), fingerprint)) = item else {
                return Slot::Own;
            };
            match first.get(&(*user, *cid)) {
                Some((j, seen)) if *seen == fingerprint.as_str() => Slot::SameAs(*j),
                Some(_) => Slot::Reused,
                None => {
                    first.insert((*user, cid), (i, fingerprint.as_str()));
                    Slot::Own
                }
            }
        })
        .collect()
}

/// Which route a batch came by: a bulk request, or a round of single requests (`round.rs`). Only
/// the crash tests' half-batch fail points tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Batch,
    Round,
}

impl Route {
    /// The fail point that makes half of this route's `operation` calls and aborts.
    fn half(self, operation: Operation) -> Option<FailPoint> {
        match (self, operation) {
            (Route::Batch, Operation::Withdraw) => Some(FailPoint::BulkHalfWithdrawn),
            (Route::Batch, Operation::Deposit) => Some(FailPoint::BulkHalfDeposited),
            (Route::Round, Operation::Withdraw) => Some(FailPoint::RoundHalfWithdrawn),
            (Route::Round, Operation::Deposit) => Some(FailPoint::RoundHalfDeposited),
            (_, Operation::Refund) => None,
        }
    }
}

/// One transfer of the batch on its way.
struct Lane {
    /// Its index among the items handed to `create_and_drive_many`.
    index: usize,
    ctx: Context,
}

/// What a round left a lane with.
enum Moved {
    /// Its step's events are committed: go on.
    Next(Lane),
    /// It stops here (terminal, or an outcome that records nothing): the answer is this state.
    Stop(usize, TransferData),
    /// Its commit failed (conflict, store): the answer is reloaded from the log.
    Broke(usize, TransferData, CoordinatorError),
}

impl Coordinator {
    /// `submit` for many transfers (the integration tests enter here): per item the cid repeat
    /// and `validate`, then the batch's creation and drive. One answer per request, in order.
    pub async fn submit_many(
        &self,
        requests: Vec<NewTransfer>,
    ) -> Vec<Result<TransferData, CoordinatorError>> {
        let mut answers: Vec<Option<Result<TransferData, CoordinatorError>>> =
            requests.iter().map(|_| None).collect();
        let mut fresh = Vec::new();
        let mut positions = Vec::new();
        for (i, request) in requests.into_iter().enumerate() {
            let checked = match self.existing_for_cid(&request).await {
                Ok(Some(existing)) => Err(Ok(existing)),
                Ok(None) => self.validate(&request).map_err(Err),
                Err(e) => Err(Err(e)),
            };
            match checked {
                Ok(()) => {
                    positions.push(i);
                    fresh.push(request);
                }
                Err(answer) => answers[i] = Some(answer),
            }
        }
        let sent = fresh.len();
        let driven = self.create_and_drive_many(fresh, Route::Batch).await;
        // `create_and_drive_many`'s postcondition: one answer per request, in order.
        invariant!(
            driven.len() == sent,
            "a batch of {sent} came back with {} answers",
            driven.len()
        );
        for (i, answer) in positions.into_iter().zip(driven) {
            answers[i] = Some(answer);
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(CoordinatorError::invariant("bulk answer missing"))))
            .collect()
    }

    /// Everything after the checks, for a batch: claims each cid, charges the daily limits,
    /// creates every transfer in one append and drives them together. One answer per request,
    /// in order; a created transfer is always answered with its state (never an error), as
    /// `create_and_drive` does.
    pub(crate) async fn create_and_drive_many(
        &self,
        requests: Vec<NewTransfer>,
        route: Route,
    ) -> Vec<Result<TransferData, CoordinatorError>> {
        let keys: Vec<_> = requests
            .iter()
            .map(|r| Some((r.user_id, r.cid.as_deref(), r.fingerprint())))
            .collect();
        let slots = cid_slots(&keys);
        let mut answers: Vec<Option<Result<TransferData, CoordinatorError>>> =
            requests.iter().map(|_| None).collect();
        for (i, slot) in slots.iter().enumerate() {
            if *slot == Slot::Reused {
                answers[i] = Some(Err(CoordinatorError::Refused(
                    ErrorCode::IdempotencyKeyReused,
                )));
            }
        }
        let lanes = match self.create_together(&requests, &slots, &mut answers).await {
            Some(lanes) => lanes,
            // A log without claims and counters of its own: the separate steps.
            None => {
                let creations = self.claim_and_charge(&requests, &slots, &mut answers).await;
                self.create_many(&requests, creations, &mut answers).await
            }
        };
        if !lanes.is_empty() {
            // The batch's TransferCreated and SourceWithdrawStarted are durable: every withdraw
            // is announced before it is called.
            self.failpoints.hit(FailPoint::AfterCreatedWithdrawStarted);
        }
        let lanes_in = lanes.len();
        let driven = self.drive_many(lanes, route).await;
        // Every lane comes back once: none lost (its request would go unanswered though its
        // transfer exists), none twice.
        invariant!(
            driven.len() == lanes_in,
            "{lanes_in} lanes driven, {} came back",
            driven.len()
        );
        for (index, data) in driven {
            invariant!(
                answers[index].is_none(),
                "item {index} of the batch answered twice ({})",
                data.req_id
            );
            answers[index] = Some(Ok(data));
        }
        for (i, slot) in slots.iter().enumerate() {
            if let Slot::SameAs(j) = *slot {
                answers[i] = answers[j].clone();
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(CoordinatorError::invariant("bulk answer missing"))))
            .collect()
    }

    /// Drives the batch's transfers together, a round per step: every lane waiting on the same
    /// call is called in one `AccountPort::movements` and its outcomes committed in one append.
    /// Returns each lane's last known state.
    async fn drive_many(&self, mut lanes: Vec<Lane>, route: Route) -> Vec<(usize, TransferData)> {
        let mut done = Vec::with_capacity(lanes.len());
        while !lanes.is_empty() {
            let mut by_state: HashMap<TransferState, Vec<Lane>> = HashMap::new();
            for lane in lanes.drain(..) {
                // A lane is made from a created transfer only; one without data would be
                // dropped from the answers.
                let Some(data) = lane.ctx.aggregate.data.clone() else {
                    invariant!(false, "lane {} holds no transfer", lane.index);
                    continue;
                };
                if data.state.is_terminal() {
                    done.push((lane.index, data));
                } else {
                    by_state.entry(data.state).or_default().push(lane);
                }
            }
            for (state, group) in by_state {
                let moved = match state {
                    TransferState::SourcePending => {
                        self.call_round(group, Operation::Withdraw, route).await
                    }
                    TransferState::TargetPending => {
                        self.call_round(group, Operation::Deposit, route).await
                    }
                    TransferState::Compensating => {
                        self.call_round(group, Operation::Refund, route).await
                    }
                    // Never left by a creation (its announcement shares the create's commit):
                    // the single drive loop, lane by lane.
                    _ => self.drive_alone(group).await,
                };
                for m in moved {
                    match m {
                        Moved::Next(lane) => lanes.push(lane),
                        Moved::Stop(index, data) => done.push((index, data)),
                        Moved::Broke(index, last, e) => {
                            done.push((index, self.after_break(last, e).await));
                        }
                    }
                }
            }
        }
        done
    }

    /// The state to answer with after a lane's commit failed: what the log holds now, or the
    /// last state known; the recovery worker finishes it.
    async fn after_break(&self, last: TransferData, e: CoordinatorError) -> TransferData {
        if !matches!(e, CoordinatorError::Conflict) {
            tracing::warn!(req_id = %last.req_id, error = %e, "drive stopped; the recovery worker resumes it");
        }
        self.load(&last.req_id).await.ok().flatten().unwrap_or(last)
    }

    /// Lanes in a state this path never creates (INIT, SOURCE_DONE): the single drive loop.
    async fn drive_alone(&self, group: Vec<Lane>) -> Vec<Moved> {
        let mut moved = Vec::with_capacity(group.len());
        for lane in group {
            let mut last = lane.ctx.aggregate.data.clone();
            let index = lane.index;
            match self.drive_loop(lane.ctx, false, &mut last).await {
                Ok(driven) => moved.push(Moved::Stop(index, driven.data)),
                Err(e) => match last {
                    Some(last) => moved.push(Moved::Broke(index, last, e)),
                    None => continue,
                },
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(n: u64) -> UserId {
        UserId::new(n).expect("a valid user id")
    }

    #[test]
    fn a_cid_repeated_in_a_batch_is_the_same_request_or_refused() {
        let items = vec![
            Some((user(1), Some("a"), "F|S|USDT|1".to_owned())),
            Some((user(1), Some("a"), "F|S|USDT|1".to_owned())),
            Some((user(1), Some("a"), "F|S|USDT|2".to_owned())),
            Some((user(2), Some("a"), "F|S|USDT|2".to_owned())),
            Some((user(1), None, "F|S|USDT|1".to_owned())),
            None,
        ];
        assert_eq!(
            cid_slots(&items),
            [
                Slot::Own,
                Slot::SameAs(0),
                Slot::Reused,
                Slot::Own,
                Slot::Own,
                Slot::Own
            ]
        );
    }
}
