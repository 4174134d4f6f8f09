//! The round former's queue (`round.rs`, ADR 0019), over any request `R` and answer `A`: which
//! request leads a round, who waits for the next one, how the lead passes on. It knows nothing
//! of the coordinator, which holds one (`Coordinator::rounds`) and drives the rounds themselves
//! in `round.rs`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Most rounds of single requests one coordinator has in flight at once. One: what arrives while
/// it is in flight makes the next round larger. Two were measured too (`docs/perf-log.md`, issue
/// 35): a request finding one round in flight and a slot free then goes nearly alone, so rounds
/// fragment, and the rate and the CPU per transfer were both worse than with one.
pub const ROUNDS_IN_FLIGHT: usize = 1;

/// What a waiting request is told.
pub(crate) enum Signal<R, A> {
    /// Its answer: the round that carried it is over.
    Answer(A),
    /// It leads the next round (its own request given back), taking everyone queued.
    Lead(R),
}

/// A waiting request.
pub(crate) struct Seat<R, A> {
    pub(crate) request: R,
    pub(crate) tell: oneshot::Sender<Signal<R, A>>,
}

struct Queue<R, A> {
    /// Rounds in flight (each held by a `Slot`).
    running: usize,
    waiting: VecDeque<Seat<R, A>>,
}

/// One coordinator's round former. Shared by the coordinator's clones.
pub(crate) struct Rounds<R, A> {
    queue: Mutex<Queue<R, A>>,
    pub(crate) rounds: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) shared: AtomicU64,
}

impl<R, A> Default for Rounds<R, A> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Queue {
                running: 0,
                waiting: VecDeque::new(),
            }),
            rounds: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            shared: AtomicU64::new(0),
        }
    }
}

impl<R, A> std::fmt::Debug for Rounds<R, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rounds").finish_non_exhaustive()
    }
}

/// What entering the round former gave a request.
pub(crate) enum Entered<R, A> {
    /// No round was in flight (or fewer than the most): lead one now.
    Lead(R, Slot<R, A>),
    /// Wait for a round to carry it, or to be told to lead one.
    Wait(Waiting<R, A>),
}

impl<R, A> Rounds<R, A> {
    fn lock(&self) -> MutexGuard<'_, Queue<R, A>> {
        // A poisoned lock only means a holder panicked; the queue itself is always whole.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn enter(self: &Arc<Self>, request: R) -> Entered<R, A> {
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
    pub(crate) fn take(&self, most: usize) -> Vec<Seat<R, A>> {
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

    pub(crate) fn count(&self, carried: usize) {
        let carried = u64::try_from(carried).unwrap_or(u64::MAX);
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(carried, Ordering::Relaxed);
        if carried > 1 {
            self.shared.fetch_add(carried, Ordering::Relaxed);
        }
    }

    /// A round's slot is free: the first waiter still there leads the next round, or the slot
    /// is given back when nobody waits.
    pub(crate) fn pass_on(&self) {
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
pub(crate) struct Slot<R, A>(pub(crate) Arc<Rounds<R, A>>);

impl<R, A> Drop for Slot<R, A> {
    fn drop(&mut self) {
        self.0.pass_on();
    }
}

/// A waiting request's end of its seat. Dropped before its answer (its caller gone), it closes
/// the seat, and a lead handed to it in the meantime is passed on.
pub(crate) struct Waiting<R, A> {
    told: Option<oneshot::Receiver<Signal<R, A>>>,
    rounds: Arc<Rounds<R, A>>,
}

impl<R, A> Waiting<R, A> {
    /// What this request is told; `None` when the round carrying it ended without a word (its
    /// leading future was dropped).
    pub(crate) async fn told(&mut self) -> Option<Signal<R, A>> {
        let told = self.told.as_mut()?;
        let signal = told.await.ok();
        self.told = None;
        signal
    }
}

impl<R, A> Drop for Waiting<R, A> {
    fn drop(&mut self) {
        if let Some(mut told) = self.told.take() {
            told.close();
            if let Ok(Signal::Lead(_)) = told.try_recv() {
                self.rounds.pass_on();
            }
        }
    }
}
