//! `MemMoves`' spot-cores and the front's hold: the engines' journaled move-out and move-in
//! (idempotent by id, a refusal when armed), their balances, and the hold's log.

use std::collections::BTreeMap;

use async_trait::async_trait;
use cells::{partition_of, CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;

use super::{cell_of, MemMoves, MoveCall};
use crate::error::StoreError;
use crate::moves::{PartitionHold, SpotMoves, SpotPayload};

#[async_trait]
impl SpotMoves for MemMoves {
    async fn move_out(
        &self,
        cell: CellId,
        id: &str,
        p: Partition,
    ) -> Result<SpotPayload, StoreError> {
        let refuse = self.refuse_move_out;
        self.call(MoveCall::MoveOut, |state| {
            let c = cell_of(state, cell)?;
            if let Some(done) = c.spot_outs.get(id) {
                return Ok(done.clone());
            }
            if refuse {
                return Err(StoreError::new(crate::moves::MoveOutRefused(
                    "the partition's state does not fit one record".into(),
                )));
            }
            let balances: BTreeMap<(UserId, String), Decimal> = c
                .spot
                .iter()
                .filter(|((user, _), _)| partition_of(*user) == p)
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            c.spot.retain(|(user, _), _| partition_of(*user) != p);
            c.spot_moved_out.insert(p);
            let payload = SpotPayload {
                balances,
                wire: serde_json::Value::Null,
            };
            c.spot_outs.insert(id.to_owned(), payload.clone());
            Ok(payload)
        })
        .await
    }

    async fn move_in(
        &self,
        cell: CellId,
        id: &str,
        p: Partition,
        payload: &SpotPayload,
    ) -> Result<(), StoreError> {
        self.call(MoveCall::MoveIn, |state| {
            let c = cell_of(state, cell)?;
            if c.spot_ins.insert(id.to_owned()) {
                for (key, amount) in &payload.balances {
                    *c.spot.entry(key.clone()).or_default() += *amount;
                }
                c.spot_moved_out.remove(&p);
            }
            Ok(())
        })
        .await
    }

    async fn balances(
        &self,
        cell: CellId,
        p: Partition,
        users: &[UserId],
    ) -> Result<BTreeMap<(UserId, String), Decimal>, StoreError> {
        self.call(MoveCall::Balances, |state| {
            let c = cell_of(state, cell)?;
            let asked = |u: &UserId| partition_of(*u) == p && users.contains(u);
            Ok(c.spot
                .iter()
                .filter(|((u, _), _)| asked(u))
                .map(|(k, v)| (k.clone(), *v))
                .collect())
        })
        .await
    }
}

#[async_trait]
impl PartitionHold for MemMoves {
    async fn hold(&self, p: Partition) {
        let mut state = self.lock();
        state.held.insert(p);
        state.hold_log.push((p, true));
    }

    async fn release(&self, p: Partition) {
        let mut state = self.lock();
        state.held.remove(&p);
        state.hold_log.push((p, false));
    }
}
