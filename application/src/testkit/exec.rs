//! The manual executor of the fast tests: one "process" is one future, polled on the test's own
//! thread until it answers or crashes. The in-memory ports answer at once, so a process only
//! yields where it sleeps (`TestClock::sleep`, which wakes itself) or where a crash fault made a
//! call that never answers; the executor then drops the process there, as a SIGKILL would, and
//! every port's durable state stays as it was. No runtime, no timer, no thread: deterministic.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
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
    CRASHED.with(|c| c.set(false));
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
