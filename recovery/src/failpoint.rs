//! Fail points for crash tests: the process aborts at a named point when `LEDGER_FAILPOINT`
//! names it, so a test can kill the real coordinator exactly between two durable steps.

use std::sync::OnceLock;

/// The environment variable naming the one fail point armed in this process.
pub const FAILPOINT_ENV: &str = "LEDGER_FAILPOINT";

/// Every fail point the coordinator has, in the order a transfer meets them (seed 000 CRA-001..006).
pub const ALL: [&str; 9] = [
    "after_init",
    "source_pending_before_call",
    "source_after_call",
    "after_source_done",
    "target_pending_before_call",
    "target_after_call",
    "compensating_before_refund",
    "compensating_after_refund",
    "after_manual_resolution",
];

/// Read once: the environment does not change under a running process, and the hot path must not
/// take the environment lock on every step.
fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(FAILPOINT_ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Aborts the process (no unwinding, no destructors, no flushing: like SIGKILL) when `name` is
/// the armed fail point. A no-op otherwise.
pub fn failpoint(name: &str) {
    debug_assert!(ALL.contains(&name), "unknown fail point {name}");
    if armed() == Some(name) {
        eprintln!("fail point {name}: aborting");
        std::process::abort();
    }
}
