//! What a broken invariant does, once for every crate that asserts one (`domain`, `spot-core`,
//! `tlog`, each with its `invariant!` over [`violated`]): the policy of ARCHITECTURE.md, "When an
//! invariant breaks".
//!
//! - A broken invariant of **in-memory state** aborts the process, after writing its reason to
//!   stderr and as an ERROR event. Not a panic: a panic in a tokio task is caught by the runtime
//!   and by the router's catch-panic layer, and the process would go on serving from the state
//!   that broke. The recovery paths (the event log, spot-core's WAL, the retry book) make a
//!   restart safe.
//! - A check of **persisted or received input** never comes here: it refuses the input with an
//!   error, so a restart cannot crash-loop on the same bytes.
//! - Under test it **panics** instead: in the calling crate's own unit tests (each crate's
//!   `invariant!` passes its own `cfg!(test)`), and in any process that called
//!   [`panic_instead`] (`ledger-sim`, which reports the panic as its seed's finding).
//!
//! The check costs its condition only; the reason is formatted on failure alone.

use std::sync::atomic::{AtomicBool, Ordering};

static PANIC_INSTEAD: AtomicBool = AtomicBool::new(false);

/// Makes every later violation in this process panic instead of aborting. For the simulator
/// and test harnesses only; never called by a product binary.
pub fn panic_instead() {
    PANIC_INSTEAD.store(true, Ordering::SeqCst);
}

/// Whether a violation panics instead of aborting (see [`panic_instead`]).
pub fn panics() -> bool {
    PANIC_INSTEAD.load(Ordering::Relaxed)
}

/// A broken invariant: logs `reason` (stderr and an ERROR event) and aborts the process, or
/// panics with it when `panic` (the caller's `cfg!(test)`) is set or [`panic_instead`] was
/// called.
#[cold]
#[inline(never)]
pub fn violated(reason: std::fmt::Arguments<'_>, panic: bool) -> ! {
    if panic || panics() {
        panic!("invariant violated: {reason}");
    }
    eprintln!("invariant violated: {reason}; aborting");
    tracing::error!(target: "invariant", "invariant violated: {reason}; aborting");
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "invariant violated: two is 2")]
    fn a_violation_panics_under_test() {
        violated(format_args!("two is {}", 2), true);
    }
}
