//! Where an external_id is claimed under a cell map (ADR 0017 §6): in its claim cell, the owner
//! of the partition of its UTF-8 bytes, through that cell's claims store while it serves. What
//! a claim means (who holds it, what is refused) is `application::external_ids`'; when the
//! claim cell cannot answer, the deposit is refused and nothing is credited.

use application::external_ids::{self, Claim};
use application::StoreError;
use cells::{partition_of_bytes, CellId, Placement};
use domain::UserId;

use crate::slot::Slots;

/// Every cell (its claims store while it is up), to claim an external_id in the cell that
/// keeps it.
#[derive(Clone)]
pub struct Claims {
    placement: Placement,
    slots: Slots,
}

impl Claims {
    pub fn new(placement: Placement, slots: Slots) -> Self {
        Self { placement, slots }
    }

    /// The cell that keeps `external_id`'s claim.
    pub fn claim_cell(&self, external_id: &str) -> CellId {
        self.placement
            .owner(partition_of_bytes(external_id.as_bytes()))
    }

    /// Claims `external_id` for `user` in its claim cell, or reads who holds it. An error means
    /// the claim cell did not answer: nothing may be credited.
    pub async fn claim(&self, external_id: &str, user: UserId) -> Result<Claim, ClaimError> {
        let cell = self.claim_cell(external_id);
        let slot = self.slots.get(&cell).ok_or(ClaimError::NoCell(cell))?;
        let served = slot.serving().ok_or(ClaimError::Down(cell))?;
        external_ids::claim(served.claims.as_ref(), external_id, user)
            .await
            .map_err(|e| ClaimError::Unreachable(cell, e))
    }
}

/// Why a claim could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("cell {0}, which keeps this external_id's claim, did not answer: {1}")]
    Unreachable(CellId, #[source] StoreError),
    #[error("cell {0}, which keeps this external_id's claim, is down")]
    Down(CellId),
    #[error("cell {0} is not in the map")]
    NoCell(CellId),
}
