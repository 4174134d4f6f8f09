//! What a broken invariant does: [`invariant!`](crate::invariant) and [`violated`], the one way
//! product code asserts a precondition, postcondition or invariant of its own in-memory state.
//!
//! The policy (issue 50):
//!
//! - A broken invariant of **in-memory state** (a transition the table does not allow, a
//!   balance below zero, a batch whose sums disagree before and after, a position that skips)
//!   **aborts the process**. Not a panic: a panic in a tokio task is caught by the runtime and
//!   by the router's catch-panic layer, and the process would go on serving from the state that
//!   broke. Every recovery path makes a restart safe (the event log, spot-core's WAL, the
//!   retry book), so the cheapest correct answer to "this cannot happen" is to stop at once,
//!   at the cause, before the broken state is written anywhere or moves money.
//! - A check of **persisted or received input** (a WAL record, a snapshot, a tree tile, a frame
//!   from another replica, a row read back) never uses this: it refuses the input with an error
//!   and the caller halts what depends on it (spot-core refuses to start on a damaged WAL; the
//!   cell halts new transfers, MON-003). Aborting there would only crash-loop on the same bytes.
//! - Under test the violation **panics** instead, so a test (or the simulator, which runs many
//!   seeds in one process and reports a violation as its seed's finding) can observe it: in the
//!   calling crate's own unit tests (`cfg(test)` is the caller's, the macro expands there), and
//!   in any process that called [`panic_instead`] (the simulator, `ledger-sim`).
//!
//! The check itself costs its condition only; the message is formatted on failure alone.

pub use ::invariant::{panic_instead, panics, violated};

/// Asserts an invariant of in-memory state: `invariant!(cond, "why it must hold {}", x)`. When
/// `cond` is false the process aborts with the reason (see the module: the policy, and when it
/// panics instead). The reason is required: it says what broke, at its cause.
#[macro_export]
macro_rules! invariant {
    ($cond:expr, $($reason:tt)+) => {
        if !$cond {
            $crate::invariant::violated(format_args!($($reason)+), cfg!(test))
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    #[should_panic(expected = "invariant violated: two is 2")]
    fn a_violation_panics_under_test() {
        let two = 3;
        invariant!(two == 2, "two is {}", 2);
    }

    #[test]
    fn a_kept_invariant_is_silent() {
        invariant!(1 + 1 == 2, "arithmetic");
    }
}
