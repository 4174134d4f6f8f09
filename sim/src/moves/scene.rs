//! One moves seed's world besides the moves themselves: the seed's random source, the users and
//! what they expect (every write the fence accepted, in order, and their SPOT balances), the
//! transfers open in a cell (which a drain waits for), the moves under way, the counters and the
//! trace. The schedule's hook (`interleave`) runs here before every call of the move's ports.

use std::collections::BTreeMap;

use application::moves::{MoveId, MoveRunner};
use application::testkit::moves::{MemMoves, MoveCall};
use application::testkit::run;
use cells::{partition_of, CellId};
use domain::{ReqId, UserId};
use rust_decimal::Decimal;

use super::engines::{Engines, Leg};
use crate::rng::Rng;

/// Where a moves seed's time starts (the req_ids of its writes carry it).
pub const START_MS: u64 = 1_767_225_600_000;

/// The assets users move.
pub const ASSETS: [&str; 2] = ["USDT", "BTC"];

/// One write the fence accepted: its key, asset and FUNDING amount.
pub type Write = (String, &'static str, i64);

/// A transfer open in a cell: the cell, its user, and whether it stays open until the faults
/// stop (a transfer stuck on a spot-core that does not answer: the drain must give up on it).
#[derive(Debug, Clone, Copy)]
pub struct Open {
    pub cell: CellId,
    pub user: UserId,
    pub stuck: bool,
}

pub struct Scene {
    pub rng: Rng,
    pub world: MemMoves,
    pub cells: u16,
    pub users: Vec<UserId>,
    /// Per user, every write accepted, in the order accepted.
    pub expected: BTreeMap<UserId, Vec<Write>>,
    /// Per user and asset, the SPOT balance the user holds wherever its partition is.
    pub spot: BTreeMap<(UserId, &'static str), i64>,
    pub open: Vec<Open>,
    pub keys: u64,
    /// Moves started and not yet seen ended.
    pub active: Vec<MoveId>,
    /// A runner over the same cells without faults or hook: the operator's cancels that land
    /// in the middle of another runner's step.
    pub operator: Option<MoveRunner>,
    pub engines: Engines,
    pub faults_on: bool,
    /// What went wrong while it ran (the checks after the seed add theirs).
    pub violations: Vec<String>,
    pub counts: BTreeMap<&'static str, u64>,
    pub trace: Option<Vec<String>>,
}

impl Scene {
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = self.trace.as_mut() {
            trace.push(line());
        }
    }

    /// Every asset's total across the cells: FUNDING as the cells count it, SPOT in the
    /// engines.
    pub fn total(&self) -> BTreeMap<String, Decimal> {
        let mut total = self.world.total();
        for (asset, amount) in self.engines.total(&self.users, &ASSETS) {
            *total.entry(asset).or_default() += amount;
        }
        total
    }

    pub fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_insert(0) += 1;
    }

    /// A user's transfer between FUNDING and SPOT of `amount` (FUNDING's side), sent to its
    /// cell under the map (or, now and then, to a random cell: a stale map): through the fence,
    /// then its SPOT leg in the same cell's engine if the fence let it in. A leg the engine does
    /// not apply after the fence took the write is a violation (money in one system only).
    /// Sometimes the transfer stays open.
    pub fn user_op(&mut self) {
        let i = self.rng.index(self.users.len());
        let user = self.users[i];
        let asset = ASSETS[self.rng.index(ASSETS.len())];
        let size = i64::try_from(self.rng.between(1, 50)).unwrap_or(1);
        let amount = if self.rng.chance(500) { size } else { -size };
        let cell = match self.world.owner(user) {
            Some(cell) if !self.rng.chance(100) => cell,
            _ => cell_id(self.rng.between(1, u64::from(self.cells))),
        };
        if amount > 0 && self.engines.available(cell, user, asset) < Decimal::from(amount) {
            return;
        }
        self.keys += 1;
        let key = ReqId::from_parts(START_MS, u128::from(self.keys)).to_string();
        let accepted = self.world.write(cell, &key, user, asset, amount);
        self.note(|| {
            let verdict = if accepted { "accepted" } else { "refused" };
            format!("write {key} user {user} {asset} {amount} in cell {cell}: {verdict}")
        });
        if !accepted {
            self.count("writes-refused");
            return;
        }
        self.count("writes-accepted");
        let leg = self.engines.leg(cell, &key, user, asset, -amount);
        if leg != Leg::Applied {
            let p = partition_of(user).get();
            self.violations.push(format!(
                "cell {cell} took write {key} of user {user} (p{p}) but its engine answered {leg:?}"
            ));
        }
        self.expected
            .entry(user)
            .or_default()
            .push((key, asset, amount));
        *self.spot.entry((user, asset)).or_default() -= amount;
        if self.rng.chance(300) {
            let stuck = self.faults_on && self.rng.chance(60);
            self.world.open_transfers(cell, user, 1);
            self.open.push(Open { cell, user, stuck });
            self.count("transfers-opened");
        }
    }

    /// Ends each open transfer with `per_mille` chance (every one, stuck or not, once the
    /// faults have stopped and `per_mille` is 1000).
    pub fn close_some(&mut self, per_mille: u32) {
        let mut still = Vec::new();
        for open in std::mem::take(&mut self.open) {
            let may = !open.stuck || !self.faults_on;
            if may && (per_mille >= 1000 || self.rng.chance(per_mille)) {
                self.world.open_transfers(open.cell, open.user, -1);
                let p = partition_of(open.user).get();
                self.note(|| format!("transfer of user {} (p{p}) ends", open.user));
            } else {
                still.push(open);
            }
        }
        self.open = still;
    }

    /// What the schedule does before a call of the move's ports: users write, transfers end
    /// (more often while a drain polls), and now and then the operator cancels a move.
    pub fn interleave(&mut self, call: MoveCall) {
        if call == MoveCall::Freeze {
            self.close_some(100);
        }
        if self.rng.chance(300) {
            self.user_op();
        }
        if self.faults_on && !self.active.is_empty() && self.rng.chance(3) {
            let id = self.active[self.rng.index(self.active.len())].clone();
            let Some(operator) = self.operator.clone() else {
                return;
            };
            let answer = run(operator.cancel(&id, "operator"));
            let took = matches!(answer, Some(Ok(_)));
            self.note(|| format!("cancel of {id} before {call:?}: {}", ok(took)));
            self.count(if took {
                "cancels-mid-step"
            } else {
                "cancels-refused"
            });
        }
    }
}

/// Cell `n` (1 and up).
pub fn cell_id(n: u64) -> CellId {
    CellId::new(n).unwrap_or(CellId::ONE)
}

fn ok(took: bool) -> &'static str {
    if took {
        "recorded"
    } else {
        "refused"
    }
}
