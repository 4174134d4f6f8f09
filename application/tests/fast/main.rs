//! The coordinator's fast loop: given/when/then tests over the in-memory ports of
//! `application::testkit`, one command per test, no database, no spot-core, no runtime. Each
//! test states what is durable before (given), the one command (when), and what it did (then):
//! the events appended, the calls made to each account system, and the answer.
//!
//! - `submit.rs`: the transition table's effects on a new transfer (success, refusal at the
//!   source and at the target, unknown outcomes), the coordinator's own refusals, and the batch.
//! - `resume.rs`: resuming from every open state, with the lookup before any retry.
//! - `crash.rs`: a process dropped between two durable steps, and store writes whose outcome is
//!   unknown; a new process finishes.
//! - `cid.rs`: client-key repeats; `limits.rs`: the daily limits; `together.rs`: a creation
//!   written with its claim and its charge (ADR 0022), and the separate steps.
//! - `external_ids.rs`: the claim on a deposit's external_id across cells.
//! - `moves.rs`: moving a partition between cells: every step, crash, lost answer and cancel.
//! - `manual.rs`: manual resolution, the table's ManuallyResolve rows.
//! - `audit.rs`: the conservation check, the halt and the failover repair over the in-memory records.
//! - `race.rs`: two processes at once on one transfer.
//! - `accounts.rs`: the admin's account commands (a status, an external deposit) and a user's own
//!   transfer, over `Ledger` (`Scenario::when_ledger`).

mod accounts;
mod audit;
mod cid;
mod crash;
mod external_ids;
mod limits;
mod manual;
mod moves;
mod race;
mod resume;
mod submit;
mod together;

/// Names used by every module.
mod prelude {
    pub use application::testkit::scenario::{given_req_id, movement, request, user};
    pub use application::testkit::EventKind::{self, *};
    pub use application::testkit::{AccountFault, Call, Scenario, StoreCall, StoreFault};
    pub use domain::{AccountType, ErrorCode, Operation, TransferState};

    pub const FUNDING: AccountType = AccountType::Funding;
    pub const SPOT: AccountType = AccountType::Spot;

    /// The events of a transfer that went all the way, in order.
    pub const HAPPY: [EventKind; 5] = [
        TransferCreated,
        SourceWithdrawStarted,
        SourceWithdrawn,
        TargetDepositStarted,
        TransferCommitted,
    ];

    /// A refusal `code`, as the account system sends it.
    pub fn refuse(code: &str) -> AccountFault {
        AccountFault::Refuse(code.to_owned())
    }
}
