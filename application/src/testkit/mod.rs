//! Test support (feature `testkit`, enabled by test code only): the coordinator's ports and the
//! account systems in memory, with fault knobs, a manual executor, and a given/when/then
//! scenario for fast tests of the coordinator (`application/tests/`) and the recovery worker
//! (`recovery/tests/`).
//!
//! - `store.rs`: the event log, client keys, leases and daily counters over one `Durable` set of
//!   rows, with `StoreCall` faults (fail or crash before or after the effect).
//! - `account.rs`: `MemAccount`, a FUNDING-like `AccountPort` (journal by (req_id, operation),
//!   lookup, cancel, call log) with `Call` faults (refused, unavailable, answer lost, crash).
//! - `clock.rs`: manual time and deterministic req_ids.
//! - `exec.rs`: `run`, which polls one "process" to its answer or drops it at a crash.
//! - `scenario.rs`: `Scenario` (given) → `when_*` (one command of a fresh process) → `Then`
//!   (events appended, calls made to each account system, the answer).

pub mod account;
pub mod clock;
pub mod exec;
pub mod faults;
pub mod scenario;
pub mod store;

use std::sync::{Arc, RwLock};

use domain::{AccountType, AssetRegistry, ReqId, TransferEvent, TransferState};

use crate::coordinator::{Coordinator, Ports};
use crate::daily::DailyLimits;

pub use account::{MemAccount, Status};
pub use clock::TestClock;
pub use exec::run;
pub use faults::{AccountFault, Call, StoreCall, StoreFault};
pub use scenario::{Scenario, Then};
pub use store::{Durable, MemClientKeys, MemDailyReservations, MemLeases, MemLog, RetryRow, Store};

/// Everything that outlives a process: the stores' rows, both account systems, the clock, the
/// asset settings and the daily limits. Each `coordinator()` is a new process over it.
#[derive(Debug, Clone)]
pub struct World {
    pub store: Store,
    pub funding: MemAccount,
    pub spot: MemAccount,
    pub assets: Arc<RwLock<AssetRegistry>>,
    pub daily: DailyLimits,
}

impl Default for World {
    fn default() -> Self {
        Self {
            store: Store::default(),
            funding: MemAccount::new(AccountType::Funding),
            spot: MemAccount::new(AccountType::Spot),
            assets: Arc::new(RwLock::new(AssetRegistry::default_assets())),
            daily: DailyLimits::default(),
        }
    }
}

impl World {
    /// The coordinator's ports over this world's rows and clock.
    pub fn ports(&self) -> Ports {
        Ports {
            log: Arc::new(MemLog(self.store.clone())),
            claims: Arc::new(MemClientKeys(self.store.clone())),
            leases: Arc::new(MemLeases(self.store.clone())),
            limits: Arc::new(MemDailyReservations(self.store.clone())),
            clock: Arc::new(self.store.clock.clone()),
        }
    }

    /// A new coordinator process over this world (what a restarted `ledger serve` would be).
    pub fn coordinator(&self) -> Coordinator {
        Coordinator::with_ports(
            self.ports(),
            Arc::new(self.funding.clone()),
            Arc::new(self.spot.clone()),
            Arc::clone(&self.assets),
        )
        .with_daily_limits(self.daily.clone())
    }

    /// The account system serving `account`.
    pub fn account(&self, account: AccountType) -> &MemAccount {
        match account {
            AccountType::Funding => &self.funding,
            _ => &self.spot,
        }
    }

    /// The manual clock.
    pub fn clock(&self) -> &TestClock {
        &self.store.clock
    }

    /// The transfer's durable events.
    pub fn events(&self, req_id: ReqId) -> Vec<TransferEvent> {
        let rows = self.store.rows();
        rows.streams
            .get(&req_id)
            .map(|s| s.events.clone())
            .unwrap_or_default()
    }

    /// The transfer's durable state, if it exists.
    pub fn state(&self, req_id: ReqId) -> Option<TransferState> {
        self.store
            .rows()
            .streams
            .get(&req_id)
            .and_then(store::Stream::state)
    }
}
