//! Fail points for crash tests: the process aborts at a named point when the settings arm it
//! (`LEDGER_FAILPOINT`, read once by the `ledger` binary's settings), so a test can kill the real
//! coordinator exactly between two durable steps.

use std::sync::Arc;

/// Every fail point the coordinator has, in the order a transfer meets them (seed 000 CRA-001..006).
///
/// `after_created_withdraw_started` and `after_withdrawn_deposit_started` follow the commits of
/// two events each; `after_init` and `after_source_done` are met only by a transfer found in
/// INIT or SOURCE_DONE (a log written before those pairs were one commit, or a manual
/// resolution to SOURCE_DONE), before its call-free step.
///
/// The last two are the bulk path's (`bulk.rs`): with one armed, a batch's withdraws (deposits)
/// are made for its first half only, and the process aborts before the second half's.
pub const ALL: [&str; 13] = [
    "after_init",
    "after_created_withdraw_started",
    "source_pending_before_call",
    "source_after_call",
    "after_source_done",
    "after_withdrawn_deposit_started",
    "target_pending_before_call",
    "target_after_call",
    "compensating_before_refund",
    "compensating_after_refund",
    "after_manual_resolution",
    "bulk_half_withdrawn",
    "bulk_half_deposited",
];

/// The one fail point armed in this process, if any. Cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailPoints {
    armed: Option<Arc<str>>,
}

impl FailPoints {
    /// Arms the point named `name` (none when `None` or empty).
    pub fn armed(name: Option<&str>) -> Self {
        Self {
            armed: name.filter(|n| !n.is_empty()).map(Arc::from),
        }
    }

    /// Whether `name` is the armed fail point (for a point that changes how a step is made
    /// before it aborts, such as the bulk path's half-batch points).
    pub fn is_armed(&self, name: &str) -> bool {
        debug_assert!(ALL.contains(&name), "unknown fail point {name}");
        self.armed.as_deref() == Some(name)
    }

    /// Aborts the process (no unwinding, no destructors, no flushing: like SIGKILL) when `name` is
    /// the armed fail point. A no-op otherwise.
    pub fn hit(&self, name: &str) {
        debug_assert!(ALL.contains(&name), "unknown fail point {name}");
        if self.armed.as_deref() == Some(name) {
            eprintln!("fail point {name}: aborting");
            std::process::abort();
        }
    }
}
