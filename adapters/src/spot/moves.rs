//! The engines' side of a partition move (`application::moves::SpotMoves`) over each cell's
//! spot-core: `move_out` answers the partition's state (its accounts and its users' `(req_id,
//! op)` records, spot-core's `MovePayload`), which travels to the target's `move_in` as it is.
//! Both are journaled by the engine under the move's id, so a repeat answers the first answer.

use std::collections::BTreeMap;

use application::moves::{MoveOutRefused, SpotMoves, SpotPayload};
use application::StoreError;
use async_trait::async_trait;
use cells::{CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;
use spot_core::protocol::{MovePayload, Request, Response};
use spot_core::{ClientError, SpotClient};

use crate::cell_set::CellSet;

/// Each cell's spot-core, as a move reaches it.
#[derive(Clone)]
pub struct EngineMoves {
    engines: CellSet<SpotClient>,
}

impl EngineMoves {
    pub fn new(engines: BTreeMap<CellId, SpotClient>) -> Self {
        Self {
            engines: CellSet::new(engines),
        }
    }

    /// Cell `id`'s spot-core too, from now on (a cell added while the process serves).
    pub fn add_cell(&self, id: CellId, engine: SpotClient) {
        self.engines.insert(id, engine);
    }

    fn engine(&self, cell: CellId) -> Result<SpotClient, StoreError> {
        self.engines
            .get(cell)
            .ok_or_else(|| StoreError::new(format!("no spot-core for cell {cell}")))
    }
}

/// A move-out's payload as the core keeps it: its balances per user and asset, and the
/// engine's own form to hand to the target's `move_in` (the sim's engines use it too).
pub fn spot_payload(payload: &MovePayload) -> Result<SpotPayload, StoreError> {
    let mut balances = BTreeMap::new();
    for account in &payload.accounts {
        let user = UserId::new(account.user_id)
            .map_err(|_| StoreError::new(format!("a moved account of user {}", account.user_id)))?;
        balances.insert((user, account.asset.clone()), account.available);
    }
    Ok(SpotPayload {
        balances,
        wire: serde_json::to_value(payload).map_err(StoreError::new)?,
    })
}

/// The engine's form of a payload [`spot_payload`] made.
pub fn engine_payload(payload: &SpotPayload) -> Result<MovePayload, StoreError> {
    serde_json::from_value(payload.wire.clone()).map_err(StoreError::new)
}

#[async_trait]
impl SpotMoves for EngineMoves {
    async fn move_out(
        &self,
        cell: CellId,
        id: &str,
        p: Partition,
    ) -> Result<SpotPayload, StoreError> {
        let answer = self
            .engine(cell)?
            .move_out(id, p.get())
            .await
            .map_err(|e| match e {
                ClientError::MoveRefused(why) => StoreError::new(MoveOutRefused(why)),
                other => StoreError::new(other),
            })?;
        let payload = answer
            .payload
            .ok_or_else(|| StoreError::new("a move_out answered without its payload"))?;
        spot_payload(&payload)
    }

    async fn move_in(
        &self,
        cell: CellId,
        id: &str,
        p: Partition,
        payload: &SpotPayload,
    ) -> Result<(), StoreError> {
        let wire = engine_payload(payload)?;
        self.engine(cell)?
            .move_in(id, p.get(), &wire)
            .await
            .map_err(StoreError::new)?;
        Ok(())
    }

    async fn balances(
        &self,
        cell: CellId,
        _p: Partition,
        users: &[UserId],
    ) -> Result<BTreeMap<(UserId, String), Decimal>, StoreError> {
        let engine = self.engine(cell)?;
        let mut balances = BTreeMap::new();
        for user in users {
            let request = Request::Balances {
                user_id: user.get(),
            };
            match engine.call(&request).await {
                Ok(Response::Ok {
                    balances: Some(list),
                    ..
                }) => {
                    for b in list {
                        balances.insert((*user, b.asset), b.available);
                    }
                }
                Ok(other) => {
                    return Err(StoreError::new(format!("balances answered {other:?}")));
                }
                Err(ClientError::Moved(_)) => {}
                Err(e) => return Err(StoreError::new(e)),
            }
        }
        Ok(balances)
    }
}
