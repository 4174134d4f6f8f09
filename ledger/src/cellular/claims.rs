//! The claim on an external_id across cells (ADR 0017 §6): `external_id` credits once, whichever
//! user a retry names, so before a deposit is sent to its user's cell the external_id is claimed
//! in its claim cell (the owner of the partition of its UTF-8 bytes), in `external_claims`
//! (migration 0022, written only here). The first user to name it holds it; a deposit naming it
//! under another user is refused with the code one database gives a reused external_id. When
//! the claim cell cannot answer, the deposit is refused and nothing is credited.

use cells::{partition_of_bytes, CellId, Placement};
use domain::UserId;

use super::slot::Slots;

/// Every cell (its pool while it is up), to claim an external_id in the cell that owns it.
#[derive(Clone)]
pub struct Claims {
    placement: Placement,
    slots: Slots,
}

/// What a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The external_id is (now, or already) this user's: the deposit may go to its cell.
    Held,
    /// Another user holds it.
    OtherUser(UserId),
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
        let slot = self.slots.get(&cell).ok_or(ClaimError::NoPool(cell))?;
        let served = slot.serving().ok_or(ClaimError::Down(cell))?;
        let pool = &served.pool;
        sqlx::query(
            "INSERT INTO external_claims (external_id, user_id) VALUES ($1, $2) \
             ON CONFLICT (external_id) DO NOTHING",
        )
        .bind(external_id)
        .bind(user.as_i64())
        .execute(pool)
        .await
        .map_err(|e| ClaimError::Unreachable(cell, e))?;
        let holder: i64 =
            sqlx::query_scalar("SELECT user_id FROM external_claims WHERE external_id = $1")
                .bind(external_id)
                .fetch_one(pool)
                .await
                .map_err(|e| ClaimError::Unreachable(cell, e))?;
        if holder == user.as_i64() {
            return Ok(Claim::Held);
        }
        let holder = u64::try_from(holder)
            .ok()
            .and_then(|raw| UserId::new(raw).ok())
            .ok_or(ClaimError::Corrupt(cell, holder))?;
        Ok(Claim::OtherUser(holder))
    }
}

/// Why a claim could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("cell {0}, which keeps this external_id's claim, did not answer: {1}")]
    Unreachable(CellId, #[source] sqlx::Error),
    #[error("cell {0}, which keeps this external_id's claim, is down")]
    Down(CellId),
    #[error("no pool for cell {0}")]
    NoPool(CellId),
    #[error("cell {0} keeps an invalid user id {1} in external_claims")]
    Corrupt(CellId, i64),
}
