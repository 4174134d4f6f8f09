//! The cells' spot-cores in a moves seed: spot-core's real `Engine`, one per cell. The move
//! reaches them as `adapters::spot::moves::EngineMoves` does over the wire (`move_out`, whose
//! payload travels as it is to the target's `move_in`; `balances`, a user answered `MOVED`
//! holding nothing there), and the users' transfers make their SPOT legs there (a deposit or a
//! withdrawal, answered `MOVED` once the partition moved out).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use application::error::StoreError;
use application::moves::SpotPayload;
use application::ports::Clock;
use application::testkit::TestClock;
use cells::{CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;
use spot_core::assets::{Assets, DEFAULT_ASSETS_JSON};
use spot_core::engine::Engine;
use spot_core::protocol::{ErrorCode, Request, Response};

/// What an engine answered a user's SPOT leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    Applied,
    Refused,
    /// The partition moved out of this engine: nothing was done.
    Moved,
}

/// One engine per cell. Cheap to clone; every clone is the same engines.
#[derive(Clone)]
pub struct Engines {
    engines: Arc<Mutex<BTreeMap<CellId, Engine>>>,
    clock: TestClock,
}

impl Engines {
    pub fn new(cells: impl IntoIterator<Item = CellId>, clock: TestClock) -> Self {
        let engines = cells
            .into_iter()
            .map(|cell| {
                let assets = Assets::parse(DEFAULT_ASSETS_JSON)
                    .unwrap_or_else(|e| unreachable!("the shipped asset list parses: {e}"));
                (cell, Engine::new(assets))
            })
            .collect();
        Self {
            engines: Arc::new(Mutex::new(engines)),
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<CellId, Engine>> {
        self.engines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `cell`'s engine's answer to `request`.
    pub fn apply(&self, cell: CellId, request: &Request) -> Result<Response, StoreError> {
        let now = self.clock.now_ms();
        let mut engines = self.lock();
        let engine = engines
            .get_mut(&cell)
            .ok_or_else(|| StoreError::new(format!("no spot-core for cell {cell}")))?;
        Ok(engine.apply_at(request, now).response)
    }

    /// A user's SPOT leg of `amount` (a deposit, or a withdrawal when negative) under `req_id`.
    pub fn leg(&self, cell: CellId, req_id: &str, user: UserId, asset: &str, amount: i64) -> Leg {
        let size = Decimal::from(amount.unsigned_abs());
        let request = if amount >= 0 {
            Request::deposit(req_id, user.get(), asset, size)
        } else {
            Request::withdraw(req_id, user.get(), asset, size)
        };
        match self.apply(cell, &request) {
            Ok(Response::Applied { .. }) => Leg::Applied,
            Ok(Response::Error {
                code: ErrorCode::Moved,
                ..
            }) => Leg::Moved,
            _ => Leg::Refused,
        }
    }

    /// `user`'s available `asset` in `cell`'s engine (nothing when it holds no account).
    pub fn available(&self, cell: CellId, user: UserId, asset: &str) -> Decimal {
        self.lock()
            .get(&cell)
            .and_then(|e| e.account(user.get(), asset))
            .map_or(Decimal::ZERO, |(available, _)| available)
    }

    /// Every engine's balances of `users`, per asset.
    pub fn total(&self, users: &[UserId], assets: &[&str]) -> BTreeMap<String, Decimal> {
        let cells: Vec<CellId> = self.lock().keys().copied().collect();
        let mut total = BTreeMap::<String, Decimal>::new();
        for cell in cells {
            for user in users {
                for asset in assets {
                    *total.entry((*asset).to_owned()).or_default() +=
                        self.available(cell, *user, asset);
                }
            }
        }
        total
    }

    /// `move_out` in `cell`: the partition's state, as the target's `move_in` takes it.
    pub fn move_out(
        &self,
        cell: CellId,
        id: &str,
        p: Partition,
    ) -> Result<SpotPayload, StoreError> {
        let request = Request::MoveOut {
            move_id: id.to_owned(),
            partition: p.get(),
        };
        let payload = match self.apply(cell, &request)? {
            Response::Ok {
                moves: Some(moves), ..
            } => moves.first().and_then(|m| m.payload.clone()),
            other => return Err(StoreError::new(format!("move_out answered {other:?}"))),
        };
        let payload =
            payload.ok_or_else(|| StoreError::new("a move_out answered without its payload"))?;
        adapters::spot::moves::spot_payload(&payload)
    }

    /// `move_in` in `cell` of what a `move_out` answered.
    pub fn move_in(
        &self,
        cell: CellId,
        id: &str,
        p: Partition,
        payload: &SpotPayload,
    ) -> Result<(), StoreError> {
        let request = Request::MoveIn {
            move_id: id.to_owned(),
            partition: p.get(),
            payload: adapters::spot::moves::engine_payload(payload)?,
        };
        match self.apply(cell, &request)? {
            Response::Ok { .. } => Ok(()),
            other => Err(StoreError::new(format!("move_in answered {other:?}"))),
        }
    }

    /// `cell`'s engine's balances of `users`; a user answered `MOVED` holds nothing there.
    pub fn balances(
        &self,
        cell: CellId,
        users: &[UserId],
    ) -> Result<BTreeMap<(UserId, String), Decimal>, StoreError> {
        let mut balances = BTreeMap::new();
        for user in users {
            let request = Request::Balances {
                user_id: user.get(),
            };
            match self.apply(cell, &request)? {
                Response::Ok {
                    balances: Some(list),
                    ..
                } => {
                    for b in list {
                        balances.insert((*user, b.asset), b.available);
                    }
                }
                Response::Error {
                    code: ErrorCode::Moved,
                    ..
                } => {}
                other => return Err(StoreError::new(format!("balances answered {other:?}"))),
            }
        }
        Ok(balances)
    }
}
