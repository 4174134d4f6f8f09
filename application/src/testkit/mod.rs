//! Test support (feature `testkit`, enabled by test code only): the coordinator's ports and the
//! account systems in memory, with fault knobs, a manual executor, and a given/when/then
//! scenario for fast tests of the coordinator (`application/tests/`) and the recovery worker
//! (`recovery/tests/`).
//!
//! - `rows.rs`: `Durable`, the rows every store keeps, and `Rows`, their shared handle.
//! - `store.rs`: the event log, client keys, leases and daily counters over one `Durable` set of
//!   rows, each call decided by a `StoreHook` (`hook.rs`): by default the `StoreCall` faults a
//!   test armed (fail or crash before or after the effect); the simulation plugs in its own.
//! - `account.rs`: `MemAccount`, a FUNDING-like `AccountPort` (journal by (req_id, operation),
//!   lookup, cancel, call log) with `Call` faults (refused, unavailable, answer lost, crash).
//! - `books.rs`: `MemAccount` as the books ports (`FundingBook`, `SpotBook`) too, and the
//!   conservation check's reads of `Books` (`funding_read`, `spot_read`).
//! - `records.rs`: `MemRecords`, the core's other records (halt flag, alerts, assets, the
//!   audit's checkpoint and history, its event reads, open transfers, repairs) over the same rows.
//! - `claims.rs`: `MemClaims`, the external_id claims a claim cell keeps (`external_ids.rs`).
//! - `clock.rs`: manual time and deterministic req_ids.
//! - `world.rs`: `World`, all of the above together; `coordinator()` is a new process over it.
//! - `exec.rs`: `run`, which polls one "process" to its answer or drops it at a crash;
//!   `run_together`, which interleaves several at their `Pause` faults.
//! - `kinds.rs`: `EventKind`, an event's kind without its payload, for `Then::appended`.
//! - `scenario.rs`: `Scenario` (given) → `when_*` (one command of a fresh process) → `Then`
//!   (events appended, calls made to each account system, the answer).

pub mod account;
pub mod books;
pub mod claims;
pub mod clock;
pub mod exec;
pub mod faults;
pub mod hook;
pub mod kinds;
pub mod moves;
pub mod records;
pub mod rows;
pub mod scenario;
pub mod store;
pub mod world;

pub use account::{Account, Books, Entry, MemAccount, Status};
pub use claims::MemClaims;
pub use clock::TestClock;
pub use exec::{run, run_together};
pub use faults::{AccountFault, Call, StoreCall, StoreFault};
pub use hook::{Seen, StoreHook};
pub use kinds::EventKind;
pub use records::MemRecords;
pub use rows::{Durable, RetryRow, Rows, Stream};
pub use scenario::{Scenario, Then};
pub use store::{MemClientKeys, MemDailyReservations, MemLeases, MemLog, MemLogApart, Store};
pub use world::World;
