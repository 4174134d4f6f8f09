//! What a broken invariant of the engine's in-memory state does: [`invariant!`](crate::invariant)
//! and [`violated`]. The policy and its one implementation are the `invariant` crate's, shared with the ledger's
//! `domain` and `tlog`:
//!
//! - A broken invariant of **in-memory state** (a record the engine made that its own state
//!   refuses, a balance below zero, a batch whose sums disagree before and after, a seq that
//!   skips) **aborts the process**, before anything is written or answered. The WAL makes the
//!   restart safe: start-up replays exactly what was synced, and nothing unsynced was answered.
//! - A check of **persisted or received input** (a WAL frame or record, a snapshot, a
//!   replication frame from another replica) never uses this: it refuses the input with an
//!   error (start-up refuses to start on damage in the middle of the WAL; a follower refuses the
//!   frame), so a restart does not crash-loop on the same bytes.
//! - Under test it **panics** instead: in the calling crate's own unit tests (`cfg(test)` is the
//!   caller's), and in any process that called [`panic_instead`] (the simulator, which runs the
//!   engine in-process and reports a violation as its seed's finding).

pub use ::invariant::{panic_instead, violated};

/// Asserts an invariant of in-memory state with its reason:
/// `invariant!(cond, "why it must hold {}", x)`; see the module for what a violation does.
#[macro_export]
macro_rules! invariant {
    ($cond:expr, $($reason:tt)+) => {
        if !$cond {
            $crate::invariant::violated(format_args!($($reason)+), cfg!(test))
        }
    };
}
