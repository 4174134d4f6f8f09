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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use domain::TransferData;
use tokio::sync::oneshot;

use crate::bulk::Route;
use crate::coordinator::{Coordinator, CoordinatorError, NewTransfer};

/// Most rounds of single requests one coordinator has in flight at once. One: what arrives while
/// it is in flight makes the next round larger. Two were measured too (`docs/perf-log.md`, issue
/// 35): a request finding one round in flight and a slot free then goes nearly alone, so rounds
/// fragment, and the rate and the CPU per transfer were both worse than with one.
pub const ROUNDS_IN_FLIGHT: usize = 1;

/// Most requests one round carries: the bulk route's default maximum, so a round is never a
/// larger unit of work than one bulk request.
pub const ROUND_MAX: usize = crate::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT;

type Answer = Result<TransferData, CoordinatorError>;

/// What a waiting request is told.
enum Signal {
    /// Its answer: the round that carried it is over.
    Answer(Answer),
    /// It leads the next round (its own request given back), taking everyone queued.
    Lead(NewTransfer),
}

/// A waiting request.
struct Seat {
    request: NewTransfer,
    tell: oneshot::Sender<Signal>,
}

#[derive(Default)]
struct Queue {
    /// Rounds in flight (each held by a `Slot`).
    running: usize,
    waiting: VecDeque<Seat>,
}

/// How many rounds a coordinator ran and how many requests they carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundStats {
    pub rounds: u64,
    pub requests: u64,
    /// Requests carried by a round with at least one other request.
    pub shared: u64,
}

/// One coordinator's round former. Shared by the coordinator's clones.
#[derive(Default)]
pub(crate) struct Rounds {
    queue: Mutex<Queue>,
    rounds: AtomicU64,
    requests: AtomicU64,
    shared: AtomicU64,
}

impl std::fmt::Debug for Rounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rounds").finish_non_exhaustive()
    }
}

/// What entering the round former gave a request.
enum Entered {
    /// No round was in flight (or fewer than the most): lead one now.
    Lead(NewTransfer, Slot),
    /// Wait for a round to carry it, or to be told to lead one.
    Wait(Waiting),
}

impl Rounds {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A poisoned lock only means a holder panicked; the queue itself is always whole.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enter(self: &Arc<Self>, request: NewTransfer) -> Entered {
        let mut queue = self.lock();
        if queue.running < ROUNDS_IN_FLIGHT {
            queue.running += 1;
            return Entered::Lead(request, Slot(self.clone()));
        }
        let (tell, told) = oneshot::channel();
        queue.waiting.push_back(Seat { request, tell });
        Entered::Wait(Waiting {
            told: Some(told),
            rounds: self.clone(),
        })
    }

    /// Up to `most` waiting requests, in arrival order; a seat whose caller is gone is skipped
    /// (nothing was made for it yet).
    fn take(&self, most: usize) -> Vec<Seat> {
        let mut queue = self.lock();
        let mut seats = Vec::new();
        while seats.len() < most {
            let Some(seat) = queue.waiting.pop_front() else {
                break;
            };
            if !seat.tell.is_closed() {
                seats.push(seat);
            }
        }
        seats
    }

    fn count(&self, carried: usize) {
        let carried = u64::try_from(carried).unwrap_or(u64::MAX);
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(carried, Ordering::Relaxed);
        if carried > 1 {
            self.shared.fetch_add(carried, Ordering::Relaxed);
        }
    }

    /// A round's slot is free: the first waiter still there leads the next round, or the slot
    /// is given back when nobody waits.
    fn pass_on(&self) {
        let mut queue = self.lock();
        while let Some(seat) = queue.waiting.pop_front() {
            match seat.tell.send(Signal::Lead(seat.request)) {
                Ok(()) => return,
                // Its caller is gone: the next one.
                Err(_) => continue,
            }
        }
        queue.running = queue.running.saturating_sub(1);
    }
}

/// A round's slot, held while the round runs; dropping it (at the round's end, or when the
/// leading future is dropped) passes it on.
struct Slot(Arc<Rounds>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.pass_on();
    }
}

/// A waiting request's end of its seat. Dropped before its answer (its caller gone), it closes
/// the seat, and a lead handed to it in the meantime is passed on.
struct Waiting {
    told: Option<oneshot::Receiver<Signal>>,
    rounds: Arc<Rounds>,
}

impl Waiting {
    /// What this request is told; `None` when the round carrying it ended without a word (its
    /// leading future was dropped).
    async fn told(&mut self) -> Option<Signal> {
        let told = self.told.as_mut()?;
        let signal = told.await.ok();
        self.told = None;
        signal
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut told) = self.told.take() {
            told.close();
            if let Ok(Signal::Lead(_)) = told.try_recv() {
                self.rounds.pass_on();
            }
        }
    }
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
        let (own, slot) = match self.rounds.enter(request) {
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
    async fn lead_round(&self, own: NewTransfer, slot: Slot) -> Answer {
        let seats = self.rounds.take(ROUND_MAX - 1);
        let (requests, tells): (Vec<NewTransfer>, Vec<_>) = std::iter::once((own, None))
            .chain(seats.into_iter().map(|s| (s.request, Some(s.tell))))
            .unzip();
        self.rounds.count(requests.len());
        let answers = self.create_and_drive_many(requests, Route::Round).await;
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
