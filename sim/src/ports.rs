//! The simulation's ports and faults. The coordinator's stores and the worker's retry book are
//! the shared in-memory ones (`application::testkit::Store`, `MemLog`, `MemClientKeys`,
//! `MemLeases`, `MemDailyReservations`; `recovery::testkit::MemRetryBook`) with the run's hook
//! (`hook.rs`, `SimHook`): every store call first yields to the scheduler and takes a little time,
//! and may be slow or fail before or after it took effect; every append is checked. The account
//! systems are the simulation's own, with the network's faults on each message: a message may
//! never be sent, be delayed, arrive after its caller gave up, arrive twice, or lose its answer
//! after it was applied.
//!
//! This module holds `Sim`, the handle every port shares, and the faults of a message; each port
//! is its own module: `hook` (`SimHook`), `clock` (`SimClock`), `funding` (`SimFunding`) and
//! `spot` (`SimSpot`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use application::testkit::Store;
use recovery::testkit::MemRetryBook;

use crate::exec::Rt;
use crate::ports::hook::{locked, roll};
use crate::world::World;

pub mod clock;
pub mod funded;
pub mod funding;
pub mod hook;
pub mod spot;

/// The process delayed and duplicated messages belong to: the network, which no crash kills.
pub const NETWORK: u32 = 0;

/// The handle every port holds: the runtime, the world, and the stores over the world's rows.
#[derive(Clone)]
pub struct Sim {
    pub rt: Arc<Rt>,
    pub world: Arc<Mutex<World>>,
    /// The coordinator's stores' handle: the world's rows, the run's hook and its clock.
    pub store: Store,
    /// The recovery workers' retry book over the same store; its attempt log is durable, shared
    /// by every worker and every restart.
    pub book: MemRetryBook,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim").finish_non_exhaustive()
    }
}

/// What the network does to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Never sent: the caller knows nothing happened.
    Unsent,
    /// Arrives after the caller gave up (a timeout), or never.
    Late,
    /// Applied, and its answer lost.
    AnswerLost,
    /// Delivered and answered.
    Delivered,
}

impl Sim {
    /// The ports' handle over `world`, on `rt`: the stores share the world's rows and decide
    /// each call by the run's hook.
    pub fn new(rt: Arc<Rt>, world: World) -> Self {
        let rows = world.rows.clone();
        let world = Arc::new(Mutex::new(world));
        let hook = hook::SimHook {
            rt: rt.clone(),
            world: world.clone(),
        };
        let clock = clock::SimClock { rt: rt.clone() };
        let store = Store::new(rows, Arc::new(hook), Arc::new(clock));
        let book = MemRetryBook::new(store.clone());
        Self {
            rt,
            world,
            store,
            book,
        }
    }

    /// The world, locked, with the current time and task.
    pub fn world(&self) -> MutexGuard<'_, World> {
        locked(&self.rt, &self.world)
    }

    fn roll(&self, per_mille: u32) -> bool {
        roll(&self.rt, per_mille)
    }

    /// What the network does to one message (none of it with faults off).
    async fn fate(&self, name: &str) -> Fate {
        self.rt.yield_now().await;
        let latency = self.rt.with_rng(|r| r.below(15));
        if latency > 0 {
            self.rt.sleep(Duration::from_millis(latency)).await;
        }
        let f = {
            let w = self.world();
            if !w.faults_on {
                return Fate::Delivered;
            }
            w.faults.clone()
        };
        if self.roll(f.net_delay) {
            let ms = self.rt.with_rng(|r| r.between(1, 2_000));
            self.world().fault("net-delay", name);
            self.rt.sleep(Duration::from_millis(ms)).await;
        }
        if self.roll(f.net_unsent) {
            self.world().fault("net-unsent", name);
            return Fate::Unsent;
        }
        if self.roll(f.net_late) {
            self.world().fault("net-late", name);
            return Fate::Late;
        }
        if self.roll(f.net_answer_lost) {
            self.world().fault("net-answer-lost", name);
            return Fate::AnswerLost;
        }
        Fate::Delivered
    }

    /// Maybe a second copy of a delivered message, arriving later.
    fn maybe_duplicate(&self, name: &str) -> Option<u64> {
        let rate = {
            let w = self.world();
            if !w.faults_on {
                return None;
            }
            w.faults.net_duplicate
        };
        if !self.roll(rate) {
            return None;
        }
        self.world().fault("net-duplicate", name);
        Some(self.rt.with_rng(|r| r.between(0, 5_000)))
    }

    /// A late copy: maybe lost for good, else arriving within a few seconds.
    fn late_delivery(&self) -> Option<u64> {
        let lost = self.rt.with_rng(|r| r.chance(300));
        (!lost).then(|| self.rt.with_rng(|r| r.between(1, 8_000)))
    }
}
