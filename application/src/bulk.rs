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

use domain::{
    AccountPort, AccountType, AdapterOutcome, ErrorCode, Movement, Operation, TransferCommand,
    TransferData, TransferState, UserId,
};

use crate::coordinator::{Context, Coordinator, CoordinatorError, NewTransfer};
use crate::drive::definite;
use crate::failpoint::FailPoint;
use crate::ports::{CidClaim, Creation, CreationOutcome};
use crate::submit::{CidKey, Created};

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
        let driven = self.create_and_drive_many(fresh, Route::Batch).await;
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
        for (index, data) in self.drive_many(lanes, route).await {
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

    /// Creates the own items of a batch, each in the same durable write as its cid's claim and
    /// its daily charge (`TransferLog::create_many`, ADR 0022): the created ones as lanes, the
    /// others answered in `answers`. An item whose key someone claimed first takes the separate
    /// steps alone (the claim found: a repeat, a reused key or an orphan claim). `None` when
    /// the log cannot create that way; nothing was written then.
    async fn create_together(
        &self,
        requests: &[NewTransfer],
        slots: &[Slot],
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> Option<Vec<Lane>> {
        let day = crate::daily::day_of(self.clock.now());
        let (staged, creations) = self.stage_creations(requests, slots, answers).await;
        let outcomes = match creations.is_empty() {
            true => Vec::new(),
            false => self.log.create_many(creations, &self.daily, day).await?,
        };
        if outcomes.len() != staged.len() {
            for (i, _, _) in &staged {
                answers[*i] = Some(Err(CoordinatorError::invariant("the log lost an answer")));
            }
            return Some(Vec::new());
        }
        let mut lanes = Vec::with_capacity(staged.len());
        let mut alone = Vec::new();
        for ((i, req_id, ctx), outcome) in staged.into_iter().zip(outcomes) {
            let created = match outcome {
                Ok(CreationOutcome::Appended(current_sequence)) => Ok(Context {
                    current_sequence,
                    ..ctx
                }),
                Ok(CreationOutcome::KeyTaken) => {
                    alone.push(i);
                    continue;
                }
                Ok(CreationOutcome::Refused(code)) => {
                    answers[i] = Some(Err(CoordinatorError::Refused(code)));
                    continue;
                }
                Err(e) => Err(e),
            };
            // Nothing was charged apart from the creation, so there is no charge to give back.
            match self
                .settle_creation(&requests[i], req_id, None, created)
                .await
            {
                Ok(Created::New(ctx)) => lanes.push(Lane { index: i, ctx }),
                Ok(Created::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(Created::ClaimMoved) => alone.push(i),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        for i in alone {
            answers[i] = Some(self.create_and_drive_alone(requests[i].clone()).await);
        }
        Some(lanes)
    }

    /// Each own item's creation staged on the empty aggregate, with its claim and its charge:
    /// (index, req_id, context) and the creations to write, in the same order; an item the
    /// aggregate refuses is answered in `answers`.
    async fn stage_creations(
        &self,
        requests: &[NewTransfer],
        slots: &[Slot],
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> (Vec<(usize, domain::ReqId, Context)>, Vec<Creation>) {
        let charged = !self.daily.is_unlimited();
        let mut staged = Vec::new();
        let mut creations = Vec::new();
        for i in (0..requests.len()).filter(|&i| slots[i] == Slot::Own) {
            let request = &requests[i];
            // Generated as late as possible (`horizon.rs`): just before the write.
            let req_id = self.clock.req_id();
            let (ctx, command) = self.creation(req_id, request);
            match self.stage_steps(ctx, command, true).await {
                Ok((ctx, commit)) => {
                    let claim = request.cid.clone().map(|cid| CidClaim {
                        user: request.user_id,
                        cid,
                        req_id,
                        fingerprint: request.fingerprint(),
                    });
                    let charge = charged.then(|| request.charge());
                    creations.push(Creation {
                        commit,
                        claim,
                        charge,
                    });
                    staged.push((i, req_id, ctx));
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        (staged, creations)
    }

    /// Claims each own item's cid and charges its daily limits: the creations to make (index,
    /// req_id, day charged); the others answered (a repeat found, a refusal) in `answers`.
    async fn claim_and_charge(
        &self,
        requests: &[NewTransfer],
        slots: &[Slot],
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> Vec<(usize, domain::ReqId, Option<chrono::NaiveDate>)> {
        // The cid claims together, in one statement: each key is its own (a key used twice in
        // the batch is one slot).
        let own: Vec<usize> = (0..requests.len())
            .filter(|&i| slots[i] == Slot::Own)
            .collect();
        let keyed = own.iter().copied().zip(self.cid_keys(requests, &own).await);
        // Then the charges, all at once and in request order, so a daily limit running out
        // refuses the batch's last items, as the same requests one after another would be.
        let mut claimed = Vec::new();
        for (i, keyed) in keyed {
            match keyed {
                Ok(CidKey::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(CidKey::Key(key)) => claimed.push((i, key)),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        let indices: Vec<usize> = claimed.iter().map(|&(i, _)| i).collect();
        let charged = self.reserve_daily_many(requests, &indices).await;
        let mut creations = Vec::new();
        for ((i, key), charge) in claimed.into_iter().zip(charged) {
            match charge {
                // Generated as late as possible (`horizon.rs`): after the claims and charges.
                Ok(reservation) => {
                    let req_id = key.unwrap_or_else(|| self.clock.req_id());
                    creations.push((i, req_id, reservation));
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        creations
    }

    /// Creates the prepared transfers in one append; the created ones are returned as lanes, the
    /// others answered (a repeat found, a refusal) in `answers`. A creation whose cid claim was
    /// re-keyed meanwhile (rare: it took half a retention) takes the single path alone.
    async fn create_many(
        &self,
        requests: &[NewTransfer],
        creations: Vec<(usize, domain::ReqId, Option<chrono::NaiveDate>)>,
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> Vec<Lane> {
        let steps = creations
            .iter()
            .map(|&(i, req_id, _)| {
                let (ctx, command) = self.creation(req_id, &requests[i]);
                (ctx, command, true)
            })
            .collect();
        let created = self.commit_many(steps).await;
        let mut lanes = Vec::with_capacity(created.len());
        for ((i, req_id, reservation), created) in creations.into_iter().zip(created) {
            let request = &requests[i];
            match self
                .settle_creation(request, req_id, reservation, created)
                .await
            {
                Ok(Created::New(ctx)) => lanes.push(Lane { index: i, ctx }),
                Ok(Created::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(Created::ClaimMoved) => {
                    answers[i] = Some(self.create_and_drive_alone(request.clone()).await);
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        lanes
    }

    /// Drives the batch's transfers together, a round per step: every lane waiting on the same
    /// call is called in one `AccountPort::movements` and its outcomes committed in one append.
    /// Returns each lane's last known state.
    async fn drive_many(&self, mut lanes: Vec<Lane>, route: Route) -> Vec<(usize, TransferData)> {
        let mut done = Vec::with_capacity(lanes.len());
        while !lanes.is_empty() {
            let mut by_state: HashMap<TransferState, Vec<Lane>> = HashMap::new();
            for lane in lanes.drain(..) {
                let Some(data) = lane.ctx.aggregate.data.clone() else {
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

    /// One step for every lane waiting on `operation`: the calls (one per account system), then
    /// the definite outcomes committed in one append. An unknown outcome (and a refund not
    /// applied, which is never given up) records nothing: that lane stops where it is.
    async fn call_round(&self, group: Vec<Lane>, operation: Operation, route: Route) -> Vec<Moved> {
        let (before, after) = match operation {
            Operation::Withdraw => (
                FailPoint::SourcePendingBeforeCall,
                FailPoint::SourceAfterCall,
            ),
            Operation::Deposit => (
                FailPoint::TargetPendingBeforeCall,
                FailPoint::TargetAfterCall,
            ),
            Operation::Refund => (
                FailPoint::CompensatingBeforeRefund,
                FailPoint::CompensatingAfterRefund,
            ),
        };
        let datas: Vec<TransferData> = group
            .iter()
            .filter_map(|lane| lane.ctx.aggregate.data.clone())
            .collect();
        if datas.len() != group.len() {
            return Vec::new();
        }
        self.failpoints.hit(before);
        let outcomes = self.calls(operation, &datas, route).await;
        self.failpoints.hit(after);
        if operation == Operation::Withdraw && planted!(PersistAfterCall) {
            for (data, outcome) in datas.iter().zip(&outcomes) {
                if *outcome == AdapterOutcome::Success {
                    // Planted: the deposit is called before its announcement is durable.
                    let _ = self.port(data.to).deposit(&movement_of(data)).await;
                }
            }
        }
        let mut moved = Vec::with_capacity(group.len());
        let mut steps = Vec::new();
        let mut stepping = Vec::new();
        for ((lane, data), outcome) in group.into_iter().zip(datas).zip(outcomes) {
            match self.record_command(&data, operation, outcome) {
                Some((command, through)) => {
                    steps.push((lane.ctx, command, through));
                    stepping.push((lane.index, data));
                }
                None => moved.push(Moved::Stop(lane.index, data)),
            }
        }
        let committed = self.commit_many(steps).await;
        let mut deposit_announced = false;
        for ((index, data), ctx) in stepping.into_iter().zip(committed) {
            match ctx {
                Ok(ctx) => {
                    deposit_announced |=
                        ctx.aggregate.state() == Some(TransferState::TargetPending);
                    moved.push(Moved::Next(Lane { index, ctx }));
                }
                Err(e) => moved.push(Moved::Broke(index, data, e)),
            }
        }
        if deposit_announced {
            self.failpoints.hit(FailPoint::AfterWithdrawnDepositStarted);
        }
        moved
    }

    /// The command recording `outcome`, and whether it goes through to the next call-free step
    /// (a withdraw's outcome takes the deposit's announcement into the same commit); `None` when
    /// the outcome records nothing.
    fn record_command(
        &self,
        data: &TransferData,
        operation: Operation,
        outcome: AdapterOutcome,
    ) -> Option<(TransferCommand, bool)> {
        let at = self.clock.now();
        match operation {
            Operation::Withdraw => {
                let outcome = definite(data, operation, outcome).ok()?;
                Some((TransferCommand::RecordSourceOutcome { outcome, at }, true))
            }
            Operation::Deposit => {
                let outcome = definite(data, operation, outcome).ok()?;
                Some((TransferCommand::RecordTargetOutcome { outcome, at }, false))
            }
            // A refund is never given up: it stays COMPENSATING until it succeeds.
            Operation::Refund => match outcome {
                AdapterOutcome::Success => Some((TransferCommand::RecordRefund { at }, false)),
                other => {
                    tracing::error!(req_id = %data.req_id, outcome = ?other, "refund not applied; transfer stays COMPENSATING");
                    None
                }
            },
        }
    }

    /// Makes `operation` for every transfer, one `movements` call per account system (the two
    /// systems' calls at the same time), and answers in the transfers' order.
    async fn calls(
        &self,
        operation: Operation,
        datas: &[TransferData],
        route: Route,
    ) -> Vec<AdapterOutcome> {
        let mut outcomes: Vec<Option<AdapterOutcome>> = datas.iter().map(|_| None).collect();
        let per_system = [AccountType::Funding, AccountType::Spot].map(|account| {
            let (positions, movements): (Vec<usize>, Vec<Movement>) = datas
                .iter()
                .enumerate()
                .filter(|(_, d)| port_account(d, operation) == account)
                .map(|(i, d)| (i, movement_of(d)))
                .unzip();
            async move {
                if movements.is_empty() {
                    return (positions, Vec::new());
                }
                let port = self.port(account);
                let made = self
                    .movements_of_port(port, operation, &movements, route)
                    .await;
                (positions, made)
            }
        });
        for (positions, made) in futures_util::future::join_all(per_system).await {
            for (i, outcome) in positions.into_iter().zip(made) {
                outcomes[i] = Some(outcome);
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| AdapterOutcome::Unknown("no answer".to_owned())))
            .collect()
    }

    /// One `movements` call, or, with a half-batch fail point armed, the first half's call and
    /// the abort before the second half's (crash tests).
    async fn movements_of_port(
        &self,
        port: &dyn AccountPort,
        operation: Operation,
        movements: &[Movement],
        route: Route,
    ) -> Vec<AdapterOutcome> {
        let Some(half) = route.half(operation) else {
            return port.movements(operation, movements).await;
        };
        if self.failpoints.is_armed(half) && movements.len() > 1 {
            let first = port
                .movements(operation, &movements[..movements.len() / 2])
                .await;
            tracing::info!(made = first.len(), "half of the batch's calls made");
            self.failpoints.hit(half);
        }
        port.movements(operation, movements).await
    }
}

/// The account system `operation` of this transfer is made in.
fn port_account(data: &TransferData, operation: Operation) -> AccountType {
    match operation {
        Operation::Withdraw | Operation::Refund => data.from,
        Operation::Deposit => data.to,
    }
}

fn movement_of(data: &TransferData) -> Movement {
    Movement {
        req_id: data.req_id,
        user_id: data.user_id,
        asset: data.asset.clone(),
        amount: data.amount,
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
