//! The manual executor of the fast tests: one "process" is one future, polled on the test's own
//! thread until it answers or crashes. The in-memory ports answer at once, so a process only
//! yields where it sleeps (`TestClock::sleep`, which wakes itself) or where a crash fault made a
//! call that never answers; the executor then drops the process there, as a SIGKILL would, and
//! every port's durable state stays as it was. `run_together` interleaves several processes: each
//! runs until it yields (a `Pause` fault, a sleep), then the next. No runtime, no timer, no
//! thread: deterministic.

use std::cell::Cell;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Most polls of one process before the executor calls it a spin (a bug in the test or the code).
const POLLS_MAX: u32 = 100_000;

thread_local! {
    /// Set by a crash fault of the process being run on this thread.
    static CRASHED: Cell<bool> = const { Cell::new(false) };
}

/// Marks the process being run on this thread as crashed (`faults::crash`).
pub(crate) fn mark_crashed() {
    CRASHED.with(|c| c.set(true));
}

/// Whether a waker was called since the flag was last taken.
#[derive(Default)]
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs one process to its answer, or `None` when it crashed (a crash fault fired): the future
/// is dropped at that point. Panics when the process waits on something that never comes
/// without a crash, or spins.
pub fn run<F: Future>(process: F) -> Option<F::Output> {
    // A process run inside another's call (the sim's hook runs an operator's cancel there) has
    // its own crash flag: the outer one's, set by a crash in one branch of a `join` before the
    // inner ran, is given back afterwards, so the outer process is still dropped at its yield.
    let outer = CRASHED.with(|c| c.replace(false));
    let answer = run_alone(process);
    CRASHED.with(|c| c.set(outer));
    answer
}

fn run_alone<F: Future>(process: F) -> Option<F::Output> {
    let woken = Arc::new(Woken::default());
    let waker = Waker::from(Arc::clone(&woken));
    let mut cx = Context::from_waker(&waker);
    let mut process = pin!(process);
    for _ in 0..POLLS_MAX {
        if let Poll::Ready(answer) = process.as_mut().poll(&mut cx) {
            return Some(answer);
        }
        if CRASHED.with(Cell::get) {
            return None;
        }
        assert!(
            woken.0.swap(false, Ordering::SeqCst),
            "the process waits on something that never comes, without a crash fault"
        );
    }
    panic!("the process spun for {POLLS_MAX} polls");
}

/// Runs `processes` interleaved on this thread, round-robin: each is polled until it yields (a
/// `Pause` fault, a sleep), then the next. One answer per process in order, `None` for one that
/// crashed (dropped there, the others go on). Panics when every process left waits on nothing.
pub fn run_together<'a, T>(
    processes: Vec<Pin<Box<dyn Future<Output = T> + 'a>>>,
) -> Vec<Option<T>> {
    let mut slots: Vec<_> = processes
        .into_iter()
        .map(|p| (Some(p), Arc::new(Woken::default())))
        .collect();
    let mut answers: Vec<Option<T>> = slots.iter().map(|_| None).collect();
    for _ in 0..POLLS_MAX {
        let mut progressed = false;
        let mut running = false;
        for (i, (slot, woken)) in slots.iter_mut().enumerate() {
            let Some(process) = slot else { continue };
            running = true;
            CRASHED.with(|c| c.set(false));
            let waker = Waker::from(Arc::clone(woken));
            let mut cx = Context::from_waker(&waker);
            progressed = true;
            if let Poll::Ready(answer) = process.as_mut().poll(&mut cx) {
                answers[i] = Some(answer);
                *slot = None;
            } else if CRASHED.with(Cell::get) {
                *slot = None;
            } else if !woken.0.swap(false, Ordering::SeqCst) {
                progressed = false;
            }
        }
        if !running {
            return answers;
        }
        assert!(
            progressed,
            "every process left waits on something that never comes"
        );
    }
    panic!("the processes spun for {POLLS_MAX} rounds");
}

/// Pending once (waking itself at once), then ready: lets the other processes of
/// `run_together` run here.
pub(crate) struct YieldOnce(bool);

impl YieldOnce {
    pub(crate) fn new() -> Self {
        Self(false)
    }
}

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
