//! The world a scenario's processes share: the stores' rows, both account systems, the clock,
//! the asset settings and the daily limits; each `coordinator()` is a new process over it.

use std::sync::{Arc, RwLock};

use domain::{AccountType, AssetRegistry, ReqId, TransferEvent, TransferState};

use crate::coordinator::{Coordinator, Ports};
use crate::daily::DailyLimits;
use crate::testkit::account::MemAccount;
use crate::testkit::clock::TestClock;
use crate::testkit::faults::{Script, StoreCall, StoreFault};
use crate::testkit::rows::{Rows, Stream};
use crate::testkit::store::{MemClientKeys, MemDailyReservations, MemLeases, MemLog, Store};

/// Everything that outlives a process: the stores' rows, both account systems, the clock, the
/// asset settings and the daily limits. Each `coordinator()` is a new process over it.
#[derive(Debug, Clone)]
pub struct World {
    pub store: Store,
    /// The faults armed at the stores' calls (the store's hook).
    pub faults: Script<StoreCall, StoreFault>,
    clock: TestClock,
    pub funding: MemAccount,
    pub spot: MemAccount,
    pub assets: Arc<RwLock<AssetRegistry>>,
    pub daily: DailyLimits,
}

impl Default for World {
    fn default() -> Self {
        let faults = Script::default();
        let clock = TestClock::default();
        let hook = Arc::new(faults.clone());
        Self {
            store: Store::new(Rows::default(), hook, Arc::new(clock.clone())),
            faults,
            clock,
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
            clock: Arc::clone(&self.store.clock),
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
        &self.clock
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
            .and_then(Stream::state)
    }
}
