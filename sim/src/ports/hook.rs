//! The run's hook on the shared in-memory stores (`SimHook`): each store call yields to the
//! scheduler, takes a little time, and meets the seeded faults (slow, failing before or after
//! its effect); each effect is checked (`World::check_append`) and traced.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use application::testkit::{Durable, Seen, StoreCall, StoreFault, StoreHook, Stream};
use async_trait::async_trait;
use cqrs_es::DomainEvent;
use domain::{ReqId, TransferState};

use crate::exec::Rt;
use crate::world::{short, World};

/// `world` locked, with the current time and task.
pub(crate) fn locked<'a>(rt: &Rt, world: &'a Mutex<World>) -> MutexGuard<'a, World> {
    let now = rt.now_ms();
    let current = rt.current().map(|(t, _, r)| (t, r));
    let mut w = world.lock().unwrap_or_else(|e| e.into_inner());
    w.now_ms = now;
    w.current = current;
    w
}

pub(crate) fn roll(rt: &Rt, per_mille: u32) -> bool {
    per_mille > 0 && rt.with_rng(|r| r.chance(per_mille))
}

/// The run's faults and checks on every store call.
#[derive(Clone)]
pub struct SimHook {
    pub rt: Arc<Rt>,
    pub world: Arc<Mutex<World>>,
}

impl std::fmt::Debug for SimHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHook").finish_non_exhaustive()
    }
}

/// The name a store call has in the trace.
fn name(site: StoreCall) -> &'static str {
    match site {
        StoreCall::Load => "log.load",
        StoreCall::Append(_) => "log.append",
        StoreCall::FindClaim => "cid.find",
        StoreCall::Claim => "cid.claim",
        StoreCall::Rekey => "cid.rekey",
        StoreCall::TakeLease => "lease.take",
        StoreCall::RenewLease => "lease.renew",
        StoreCall::ReleaseLease => "lease.release",
        StoreCall::Reserve => "limits.reserve",
        StoreCall::ReleaseReservation => "limits.release",
        StoreCall::RetryBook => "retry.book",
    }
}

fn short_id(id: &ReqId) -> String {
    short(&id.to_string()).to_owned()
}

#[async_trait]
impl StoreHook for SimHook {
    /// A scheduling point, a little latency, maybe a stall, maybe a failure before the effect.
    async fn before(&self, site: StoreCall) -> Option<StoreFault> {
        self.rt.yield_now().await;
        let f = {
            let w = locked(&self.rt, &self.world);
            w.faults_on.then(|| w.faults.clone())
        };
        // Every call takes a little time, so concurrent drives overlap.
        let latency = self.rt.with_rng(|r| r.below(4));
        if latency > 0 {
            self.rt.sleep(Duration::from_millis(latency)).await;
        }
        let f = f?;
        if roll(&self.rt, f.store_delay) {
            // Mostly short; one in ten a stall of many seconds (a partition, a lock wait),
            // longer than half the claims' retention.
            let ms = self.rt.with_rng(|r| {
                if r.chance(100) {
                    r.between(10_000, 45_000)
                } else {
                    r.between(1, 3_000)
                }
            });
            locked(&self.rt, &self.world).fault("store-slow", name(site));
            self.rt.sleep(Duration::from_millis(ms)).await;
        }
        if roll(&self.rt, f.store_fail_before) {
            locked(&self.rt, &self.world).fault("store-fail", name(site));
            return Some(StoreFault::FailBefore);
        }
        None
    }

    /// Maybe the answer is lost after the effect.
    fn after(&self, site: StoreCall, _before: Option<StoreFault>) -> Option<StoreFault> {
        let rate = {
            let w = locked(&self.rt, &self.world);
            if !w.faults_on {
                return None;
            }
            w.faults.store_fail_after
        };
        if !roll(&self.rt, rate) {
            return None;
        }
        locked(&self.rt, &self.world).fault("store-answer-lost", name(site));
        Some(StoreFault::FailAfter)
    }

    fn seen(&self, rows: &Durable, seen: Seen<'_>) {
        let mut w = locked(&self.rt, &self.world);
        match seen {
            Seen::Appending { req_id, events } => w.check_append(rows, &req_id, events),
            Seen::Appended { req_id, events } => {
                let names: Vec<String> = events.iter().map(DomainEvent::event_type).collect();
                let state = rows.streams.get(&req_id).and_then(Stream::state);
                w.note(|| {
                    format!(
                        "log {} +{} -> {}",
                        short_id(&req_id),
                        names.join("+"),
                        state.map_or("?", TransferState::as_str)
                    )
                });
            }
            Seen::SequenceTaken {
                req_id,
                expected,
                at,
            } => w.note(|| {
                format!(
                    "log {} refused: sequence {} taken (at {at})",
                    short_id(&req_id),
                    expected + 1
                )
            }),
            Seen::ClaimMoved { req_id, cid } => {
                w.note(|| format!("log {} refused: claim of {cid} moved", short_id(&req_id)));
            }
            Seen::Claimed { cid, req_id } => {
                w.note(|| format!("cid {cid} claimed for {}", short_id(&req_id)));
            }
            Seen::Rekeyed { cid, old, new } => w.note(|| {
                format!(
                    "cid {cid} re-keyed {} -> {}",
                    short_id(&old),
                    short_id(&new)
                )
            }),
            Seen::LeaseTaken { req_id, owner } => {
                w.note(|| format!("lease {} taken by {owner}", short_id(&req_id)));
            }
            Seen::AttemptBegun {
                attempt,
                req_id,
                worker,
                state_before,
            } => w.note(|| {
                format!(
                    "attempt {attempt} on {} by {worker} from {state_before}",
                    short_id(&req_id)
                )
            }),
            Seen::AttemptEnded { req_id, outcome } => {
                w.note(|| format!("attempt on {} ended {outcome}", short_id(&req_id)));
            }
        }
    }
}
