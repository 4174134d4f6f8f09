//! Planted bugs: deliberate faults in the protocol that the deterministic simulation
//! (`ledger-sim --plant NAME`) must find, the proof that its checks are not vacuous
//! (`docs/adr/0014-simulation.md`). Compiled only with the `plant` feature, which only the
//! `sim` crate enables: no production binary can switch one on. One bug at most is active, per
//! thread (each simulated run is one thread's work).

use std::cell::Cell;

/// The planted bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bug {
    /// An unknown outcome of a withdraw or deposit is recorded as a refusal (the transfer fails
    /// or compensates without proof that nothing was applied).
    CompensateOnUnknown,
    /// A repeated refund is applied again (the simulation's funding ledger).
    RefundNotIdempotent,
    /// The deposit is called before its announcement (`TargetDepositStarted`) is durable.
    PersistAfterCall,
    /// Resume retries a pending call without asking the account system first.
    ResumeWithoutLookup,
    /// The event log appends without its version check (the simulation's log).
    NoCas,
    /// Recovery reads a lookup's `NOT_SEEN` as a refusal.
    NotSeenAsRefusal,
    /// A creation written together with its claim and charge (ADR 0022) is answered as
    /// created while its events are not written (the simulation's log): all or nothing broken.
    EventsApart,
    /// A creation written together with its daily charge (ADR 0022) leaves the charge out (the
    /// simulation's log).
    ChargeApart,
    /// A FUNDING movement written with its events (ADR 0024) is made in one transaction and
    /// its events in another (the simulation's log): the movement before its announcement.
    FundedApart,
    /// The source of a partition move accepts a write of the moving partition after the pause
    /// began (the fence lets a write into a draining or frozen partition: `testkit::moves`), so
    /// the write may land after the last copy (`ledger-sim --moves`).
    WriteAfterPause,
}

impl Bug {
    pub const ALL: [Bug; 10] = [
        Bug::CompensateOnUnknown,
        Bug::RefundNotIdempotent,
        Bug::PersistAfterCall,
        Bug::ResumeWithoutLookup,
        Bug::NoCas,
        Bug::NotSeenAsRefusal,
        Bug::EventsApart,
        Bug::ChargeApart,
        Bug::FundedApart,
        Bug::WriteAfterPause,
    ];

    /// The name `--plant` takes.
    pub fn name(self) -> &'static str {
        match self {
            Bug::CompensateOnUnknown => "compensate-on-unknown",
            Bug::RefundNotIdempotent => "refund-not-idempotent",
            Bug::PersistAfterCall => "persist-after-call",
            Bug::ResumeWithoutLookup => "resume-without-lookup",
            Bug::NoCas => "no-cas",
            Bug::NotSeenAsRefusal => "not-seen-as-refusal",
            Bug::EventsApart => "events-apart",
            Bug::ChargeApart => "charge-apart",
            Bug::FundedApart => "funded-apart",
            Bug::WriteAfterPause => "write-after-pause",
        }
    }

    pub fn parse(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }
}

thread_local! {
    static ACTIVE: Cell<Option<Bug>> = const { Cell::new(None) };
}

/// Activates `bug` (or none) on this thread.
pub fn set(bug: Option<Bug>) {
    ACTIVE.with(|a| a.set(bug));
}

/// Whether `bug` is active on this thread.
pub fn active(bug: Bug) -> bool {
    ACTIVE.with(|a| a.get() == Some(bug))
}
