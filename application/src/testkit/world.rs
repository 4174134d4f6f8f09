//! The world a scenario's processes share: the stores' rows, both account systems, the clock,
//! the asset settings and the daily limits; each `coordinator()` is a new process over it.

use std::sync::{Arc, RwLock};

use domain::{AccountType, AssetRegistry, ReqId, TransferEvent, TransferState};

use crate::coordinator::{Coordinator, Ports};
use crate::daily::DailyLimits;
use crate::ledger::Ledger;
use crate::testkit::account::MemAccount;
use crate::testkit::clock::TestClock;
use crate::testkit::faults::{Script, StoreCall, StoreFault};
use crate::testkit::records::MemRecords;
use crate::testkit::rows::{Rows, Stream};
use crate::testkit::store::{
    MemClientKeys, MemDailyReservations, MemLeases, MemLog, MemLogApart, Store,
};

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
    /// The core's other records (halt flag, the audit's checkpoint, repairs, ...).
    pub records: MemRecords,
    /// The log claims, charges and creates in separate steps (`MemLogApart`) rather than in
    /// one write (ADR 0022).
    pub apart: bool,
}

impl Default for World {
    fn default() -> Self {
        let faults = Script::default();
        let clock = TestClock::default();
        let hook = Arc::new(faults.clone());
        let rows = Rows::default();
        Self {
            records: MemRecords::new(rows.clone()),
            store: Store::new(rows, hook, Arc::new(clock.clone())),
            faults,
            clock,
            funding: MemAccount::new(AccountType::Funding),
            spot: MemAccount::new(AccountType::Spot),
            assets: Arc::new(RwLock::new(AssetRegistry::default_assets())),
            daily: DailyLimits::default(),
            apart: false,
        }
    }
}

impl World {
    /// The coordinator's ports over this world's rows and clock.
    pub fn ports(&self) -> Ports {
        Ports {
            log: match self.apart {
                false => Arc::new(MemLog(self.store.clone())),
                true => Arc::new(MemLogApart(self.store.clone())),
            },
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

    /// A new ledger process over this world: the coordinator of [`World::coordinator`], the
    /// records, and both account systems as its books.
    pub fn ledger(&self) -> Ledger {
        Ledger::from_parts(
            self.coordinator(),
            self.records.stores(),
            Arc::new(self.funding.clone()),
            Arc::new(self.spot.clone()),
            Arc::clone(&self.assets),
        )
    }

    /// Records every FUNDING balance as it stands as an external deposit (what a user's money
    /// came in as), so the conservation check, full or incremental, starts from books that hold.
    /// SPOT starts empty in every scenario; money reaches it by transfers.
    pub fn open_books(&self) {
        let mut books = self.funding.books();
        let opened: Vec<_> = books
            .accounts
            .iter()
            .map(|((user, asset), a)| (*user, asset.clone(), a.balance))
            .collect();
        for (user, asset, balance) in opened {
            let tx = books.take_tx();
            let id = format!("opening-{user}-{asset}");
            books.deposits.push((tx, id, user, asset, balance));
        }
        assert!(
            self.spot.books().accounts.is_empty(),
            "a scenario's SPOT opens empty"
        );
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
