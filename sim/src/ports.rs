//! The in-memory implementations of every port the coordinator and the recovery worker run on,
//! with the contracts of the PostgreSQL ones (`application::pg`, `recovery::book`), the funding
//! ledger's (`adapters::funding`, migration 0014) and spot-core's transport, and the faults of
//! the run injected at each call: every call first yields to the scheduler; a store call may fail
//! before or after it took effect, or be slow; a message may never be sent, be delayed, arrive
//! after its caller gave up, arrive twice, or lose its answer after it was applied.
//!
//! This module holds `Sim`, the handle every port shares, and the faults of a store call and of a
//! message; each port is its own module: `log` (`SimLog`), `book` (`SimClientKeys`, `SimLeases`,
//! `SimDailyReservations`), `retry` (`SimRetryBook`), `clock` (`SimClock`), `funding`
//! (`SimFunding`) and `spot` (`SimSpot`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use application::CoordinatorError;

use crate::exec::Rt;
use crate::world::{RetryRow, World};

pub mod book;
pub mod clock;
pub mod funding;
pub mod log;
pub mod retry;
pub mod spot;

/// The process delayed and duplicated messages belong to: the network, which no crash kills.
pub const NETWORK: u32 = 0;

/// The handle every port holds: the runtime and the world.
#[derive(Clone)]
pub struct Sim {
    pub rt: Arc<Rt>,
    pub world: Arc<Mutex<World>>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim").finish_non_exhaustive()
    }
}

/// Whether a retry row's lease is free (never taken, or run out) at `now`.
fn lease_free(row: &RetryRow, now: u64) -> bool {
    row.lease_until_ms.is_none_or(|until| until < now)
}

fn store_error(what: &str) -> CoordinatorError {
    CoordinatorError::outcome_unknown(format!("sim: {what}"))
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
    /// The world, locked, with the current time and task.
    pub fn world(&self) -> MutexGuard<'_, World> {
        let now = self.rt.now_ms();
        let current = self.rt.current().map(|(t, _, r)| (t, r));
        let mut w = self.world.lock().unwrap_or_else(|e| e.into_inner());
        w.now_ms = now;
        w.current = current;
        w
    }

    fn roll(&self, per_mille: u32) -> bool {
        per_mille > 0 && self.rt.with_rng(|r| r.chance(per_mille))
    }

    /// One store call: a scheduling point, maybe slow, maybe failing before or after `effect`.
    async fn store<T>(
        &self,
        name: &'static str,
        effect: impl FnOnce(&mut World) -> Result<T, CoordinatorError>,
    ) -> Result<T, CoordinatorError> {
        self.rt.yield_now().await;
        let f = {
            let w = self.world();
            w.faults_on.then(|| w.faults.clone())
        };
        // Every call takes a little time, so concurrent drives overlap.
        let latency = self.rt.with_rng(|r| r.below(4));
        if latency > 0 {
            self.rt.sleep(Duration::from_millis(latency)).await;
        }
        if let Some(f) = &f {
            if self.roll(f.store_delay) {
                // Mostly short; one in ten a stall of many seconds (a partition, a lock wait),
                // longer than half the claims' retention.
                let ms = self.rt.with_rng(|r| {
                    if r.chance(100) {
                        r.between(10_000, 45_000)
                    } else {
                        r.between(1, 3_000)
                    }
                });
                self.world().fault("store-slow", name);
                self.rt.sleep(Duration::from_millis(ms)).await;
            }
            if self.roll(f.store_fail_before) {
                self.world().fault("store-fail", name);
                return Err(store_error("store unreachable"));
            }
        }
        let result = effect(&mut self.world());
        if let Some(f) = &f {
            if self.roll(f.store_fail_after) {
                self.world().fault("store-answer-lost", name);
                return Err(store_error("the store's answer was lost after the effect"));
            }
        }
        result
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
