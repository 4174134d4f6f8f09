//! Rounds: the single route's requests that arrive together move together (issue 35, ADR 0019).
//!
//! A request that finds no round in flight goes out at once, alone: nothing ever waits on a
//! timer. Requests that arrive while a round is in flight wait in the queue, and when the round
//! ends the first of them leads the next round, carrying everyone queued by then. A round is the
//! bulk route's machinery (`Coordinator::create_and_drive_many`): the cid claims together, the
//! daily limits in one reservation, the creations in one append, each step's calls in one
//! `AccountPort::movements` per account system (one funding batch call, one pipelined spot-core
//! write and so one WAL sync), each step's outcomes in one append. So batches grow with load, as
//! the group commit's do.
//!
//! Every request keeps its own answer: the round answers each request with its own transfer or
//! its own refusal, exactly as the bulk route answers each item; one item's refusal or unknown
//! outcome stops only its own lane. The round belongs to one coordinator (one cell), so it never
//! spans two cells.
//!
//! The lead passes on even when the leading future is dropped (a crash unwinding, a runtime
//! shutting down): its guard hands the slot to the next waiter, and the waiters of the round it
//! carried are answered with an unknown outcome (their transfers may exist; the recovery worker
//! finishes them and a cid repeat finds them).

use std::sync::atomic::Ordering;

use domain::{invariant, TransferData};
use tracing::Instrument;

use crate::bulk::Route;
use crate::coordinator::{Coordinator, CoordinatorError, NewTransfer, Queued};
pub use crate::round_queue::ROUNDS_IN_FLIGHT;
use crate::round_queue::{Entered, Signal, Slot};

/// Most requests one round carries: the bulk route's default maximum, so a round is never a
/// larger unit of work than one bulk request.
pub const ROUND_MAX: usize = crate::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT;

type Answer = Result<TransferData, CoordinatorError>;

/// How many rounds a coordinator ran and how many requests they carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundStats {
    pub rounds: u64,
    pub requests: u64,
    /// Requests carried by a round with at least one other request.
    pub shared: u64,
}

impl Coordinator {
    /// The rounds of single requests this coordinator (and its clones) ran so far.
    pub fn round_stats(&self) -> RoundStats {
        let r = &self.rounds;
        RoundStats {
            rounds: r.rounds.load(Ordering::Relaxed),
            requests: r.requests.load(Ordering::Relaxed),
            shared: r.shared.load(Ordering::Relaxed),
        }
    }

    /// Everything after the checks for one request: claims the cid, charges the daily limits,
    /// creates, drives, in a round with the requests that arrive meanwhile. The answer is this
    /// request's own, as `create_and_drive_alone` would give it.
    pub(crate) async fn create_and_drive(&self, request: NewTransfer) -> Answer {
        let (own, slot) = match self.rounds.enter((request, telemetry::current())) {
            Entered::Lead(own, slot) => (own, slot),
            Entered::Wait(mut waiting) => match waiting.told().await {
                Some(Signal::Answer(answer)) => return answer,
                Some(Signal::Lead(own)) => (own, Slot(self.rounds.clone())),
                None => {
                    return Err(CoordinatorError::outcome_unknown(
                        "the round carrying this request ended before it was answered",
                    ))
                }
            },
        };
        self.lead_round(own, slot).await
    }

    /// One round: this request and up to `ROUND_MAX - 1` waiting ones through the bulk
    /// machinery; each waiter told its own answer, then the slot passed on.
    async fn lead_round(&self, own: Queued, slot: Slot<Queued, Answer>) -> Answer {
        let seats = self.rounds.take(ROUND_MAX - 1);
        let (queued, tells): (Vec<Queued>, Vec<_>) = std::iter::once((own, None))
            .chain(seats.into_iter().map(|s| (s.request, Some(s.tell))))
            .unzip();
        let (requests, traces): (Vec<NewTransfer>, Vec<_>) = queued.into_iter().unzip();
        invariant!(
            (1..=ROUND_MAX).contains(&requests.len()),
            "a round of {} requests (at most {ROUND_MAX}, its leader's included)",
            requests.len()
        );
        self.rounds.count(requests.len());
        let seated = tells.len();
        let round = self.create_and_drive_many(requests, Route::Round);
        let answers = if traces.len() > 1 && traces.iter().any(Option::is_some) {
            // A shared round is a step of its own, linked to each request it served (as the
            // group commit is), not a child of the one request that happened to lead it.
            let span = tracing::info_span!(
                target: telemetry::TARGET,
                parent: None,
                "round",
                requests = traces.len()
            );
            telemetry::link_all(&span, traces.into_iter().flatten());
            round.instrument(span).await
        } else {
            round.await
        };
        // One answer per seat, in order: a short answer would leave a waiter unanswered, a
        // shifted one tell a waiter another's transfer.
        invariant!(
            answers.len() == seated,
            "a round of {seated} answered {}",
            answers.len()
        );
        let mut own_answer = None;
        for (tell, answer) in tells.into_iter().zip(answers) {
            match tell {
                None => own_answer = Some(answer),
                // A caller gone meanwhile: its transfer is the recovery worker's, as any other.
                Some(tell) => drop(tell.send(Signal::Answer(answer))),
            }
        }
        drop(slot);
        own_answer.unwrap_or_else(|| Err(CoordinatorError::invariant("round answer missing")))
    }
}
