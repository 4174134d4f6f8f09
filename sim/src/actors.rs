//! The simulated run's actors, each a task outside the ledger processes: the users (requests at
//! random times into a random ledger, repeated with the same cid and body, some in batches), an
//! operator resolving open transfers by hand, and an admin freezing accounts and suspending
//! assets and undoing it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use application::testkit::Status;
use application::{CoordinatorError, NewTransfer};
use domain::{
    AccountType, AssetRegistry, AssetStatus, AssetSymbol, ReqId, Resolution, TransferData,
    TransferState, UserId,
};
use spot_core::protocol::{AccountStatus, Request};

use crate::exec::Role;
use crate::ports::Sim;
use crate::world::{short, World};

use crate::cast::{amount, Ledger, ASSETS, LEDGERS, OUTSIDE, USERS};

fn new_transfer(sim: &Sim, n: usize) -> NewTransfer {
    sim.rt.with_rng(|r| {
        let user = r.between(1, USERS);
        let asset = ASSETS[r.index(ASSETS.len())];
        // Large enough that some are refused for the balance.
        let amounts = ["1", "5", "25", "120", "400"];
        let (from, to) = if r.chance(500) {
            (AccountType::Funding, AccountType::Spot)
        } else {
            (AccountType::Spot, AccountType::Funding)
        };
        NewTransfer {
            user_id: UserId::new(user).unwrap_or_else(|_| unreachable!("users are 1..=3")),
            from,
            to,
            asset: AssetSymbol::parse(asset).unwrap_or_else(|_| unreachable!("known asset")),
            amount: amount(amounts[r.index(amounts.len())]),
            cid: (!r.chance(150)).then(|| format!("c{n}")),
        }
    })
}

/// The users: `transfers` requests at random times into a random ledger process, a third of
/// them repeated (the same cid and body) later or at once. With `bulk`, about half of them go in
/// batches of 2 to 6 (an item now and then twice in its batch), repeated whole.
pub(crate) fn spawn_users(sim: &Sim, ledgers: &Arc<Vec<Ledger>>, transfers: usize, bulk: bool) {
    let s = sim.clone();
    let ledgers = ledgers.clone();
    sim.rt.spawn(OUTSIDE, Role::Client, async move {
        let mut n = 0;
        while n < transfers {
            let pause = s.rt.with_rng(|r| r.between(0, 1_500));
            s.rt.sleep(Duration::from_millis(pause)).await;
            let size = if bulk && s.rt.with_rng(|r| r.chance(500)) {
                usize::try_from(s.rt.with_rng(|r| r.between(2, 6))).unwrap_or(2)
            } else {
                1
            };
            let mut batch: Vec<NewTransfer> = Vec::new();
            for _ in 0..size.min(transfers - n) {
                batch.push(new_transfer(&s, n));
                n += 1;
            }
            if batch.len() > 1 && s.rt.with_rng(|r| r.chance(200)) {
                let twice = batch[s.rt.with_rng(|r| r.index(batch.len()))].clone();
                batch.push(twice);
            }
            let copies =
                if batch.iter().any(|r| r.cid.is_some()) && s.rt.with_rng(|r| r.chance(333)) {
                    2
                } else {
                    1
                };
            for copy in 0..copies {
                let delay = if copy == 0 {
                    0
                } else {
                    s.rt.with_rng(|r| r.between(0, 45_000))
                };
                let i = s.rt.with_rng(|r| r.index(ledgers.len()));
                let coordinator = ledgers[i].coordinator.clone();
                let batch = batch.clone();
                let sim = s.clone();
                s.rt.spawn(LEDGERS[i], Role::Request, async move {
                    sim.rt.sleep(Duration::from_millis(delay)).await;
                    for request in &batch {
                        sim.world().note(|| {
                            format!(
                                "request {:?} user {} {}->{} {} {}{}",
                                request.cid,
                                request.user_id,
                                request.from,
                                request.to,
                                request.amount,
                                request.asset,
                                if batch.len() > 1 { " (in a batch)" } else { "" }
                            )
                        });
                    }
                    let answers = if let [request] = batch.as_slice() {
                        vec![coordinator.submit(request.clone()).await]
                    } else {
                        coordinator.submit_many(batch.clone()).await
                    };
                    let mut w = sim.world();
                    for (request, answer) in batch.iter().zip(&answers) {
                        record_answer(&mut w, request, answer);
                    }
                });
            }
        }
    });
}

/// Notes a request's answer, and which transfer it named for its client key.
fn record_answer(
    w: &mut World,
    request: &NewTransfer,
    answer: &Result<TransferData, CoordinatorError>,
) {
    match answer {
        Ok(data) => {
            let id = data.req_id.to_string();
            w.note(|| format!("answer {:?}: {} {}", request.cid, short(&id), data.state));
            if let Some(cid) = &request.cid {
                w.answers
                    .entry((request.user_id.get(), cid.clone()))
                    .or_default()
                    .insert(id);
            }
        }
        Err(e) => w.note(|| format!("answer {:?}: error {e}", request.cid)),
    }
}

/// The operator: now and then resolves an open transfer by hand (never forced), APPLIED or
/// NOT_APPLIED at random; the account systems' records decide whether it is taken.
pub(crate) fn spawn_operator(sim: &Sim, ledgers: &Arc<Vec<Ledger>>) {
    let s = sim.clone();
    let ledgers = ledgers.clone();
    sim.rt.spawn(OUTSIDE, Role::Operator, async move {
        loop {
            let pause = s.rt.with_rng(|r| r.between(2_000, 9_000));
            s.rt.sleep(Duration::from_millis(pause)).await;
            let open: Vec<String> = s
                .store
                .rows()
                .streams
                .iter()
                .filter(|(_, t)| {
                    matches!(
                        t.state(),
                        Some(
                            TransferState::SourcePending
                                | TransferState::TargetPending
                                | TransferState::Compensating
                        )
                    )
                })
                .map(|(id, _)| id.to_string())
                .collect();
            if open.is_empty() {
                continue;
            }
            let id = open[s.rt.with_rng(|r| r.index(open.len()))].clone();
            let Ok(req_id) = ReqId::parse(&id) else {
                continue;
            };
            let resolution = if s.rt.with_rng(|r| r.chance(500)) {
                Resolution::Applied
            } else {
                Resolution::NotApplied
            };
            let i = s.rt.with_rng(|r| r.index(ledgers.len()));
            s.world()
                .note(|| format!("operator resolves {} {}", short(&id), resolution.as_str()));
            let result = ledgers[i]
                .coordinator
                .manually_resolve(&req_id, resolution, "sim-operator", "simulated", false)
                .await;
            let mut w = s.world();
            w.fault("operator-resolution", short(&id));
            w.note(|| {
                format!(
                    "operator on {}: {:?}",
                    short(&id),
                    result.map(|r| r.data.state)
                )
            });
        }
    });
}

/// The admin: freezes and disables accounts in both systems, and suspends assets, then
/// undoes it, at random.
// long: one admin loop: each action (freeze, disable, suspend) beside its undo.
pub(crate) fn spawn_admin(sim: &Sim, registry: &Arc<RwLock<AssetRegistry>>) {
    let s = sim.clone();
    let registry = registry.clone();
    sim.rt.spawn(OUTSIDE, Role::Admin, async move {
        loop {
            let pause = s.rt.with_rng(|r| r.between(500, 4_000));
            s.rt.sleep(Duration::from_millis(pause)).await;
            let (user, asset, what) = s.rt.with_rng(|r| {
                (
                    r.between(1, USERS),
                    ASSETS[r.index(ASSETS.len())],
                    r.below(8),
                )
            });
            let mut w = s.world();
            match what {
                0 | 1 => {
                    let (status, name) = if what == 0 {
                        (Status::Frozen, "FROZEN")
                    } else {
                        (Status::Disabled, "DISABLED")
                    };
                    if let Some(a) = w.funding_account(user, asset) {
                        a.status = status;
                    }
                    w.fault("admin-funding-status", name);
                }
                2 | 3 => {
                    let status = if s.rt.with_rng(|r| r.chance(500)) {
                        AccountStatus::Frozen
                    } else {
                        AccountStatus::Disabled
                    };
                    w.engine_apply(&Request::SetStatus {
                        user_id: user,
                        asset: asset.to_owned(),
                        status,
                    });
                    w.fault("admin-spot-status", asset);
                }
                4 => {
                    let mut reg = registry.write().unwrap_or_else(|e| e.into_inner());
                    if let Ok(mut config) = reg.get(asset).cloned() {
                        config.status = AssetStatus::Suspended;
                        reg.upsert(config);
                    }
                    w.fault("admin-asset-suspended", asset);
                }
                _ => {
                    // Back to normal for this user and asset.
                    if let Some(a) = w.funding_account(user, asset) {
                        a.status = Status::Active;
                    }
                    w.engine_apply(&Request::SetStatus {
                        user_id: user,
                        asset: asset.to_owned(),
                        status: AccountStatus::Active,
                    });
                    let mut reg = registry.write().unwrap_or_else(|e| e.into_inner());
                    if let Ok(mut config) = reg.get(asset).cloned() {
                        config.status = AssetStatus::Active;
                        reg.upsert(config);
                    }
                    w.note(|| format!("admin restores user {user} {asset}"));
                }
            }
        }
    });
}
