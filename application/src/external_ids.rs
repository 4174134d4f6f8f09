//! The claim on a deposit's external_id across cells (ADR 0017 §6). Within one cell the
//! deposits table's unique external_id is enough; under a cell map the same external_id could
//! be sent twice naming two users of two cells, and credited twice. So before a deposit goes to
//! its user's cell, its external_id is claimed in the one cell that keeps it (the front picks
//! that cell), and the rule is this module's:
//!
//! - the first user to name an external_id holds it, for good;
//! - a deposit naming it under the user who holds it goes on (a retry: its cell's own
//!   idempotency answers it);
//! - a deposit naming it under any other user is refused with the code a reused external_id
//!   gets in one database, `IDEMPOTENCY_KEY_REUSED`, and nothing is credited;
//! - when the claim cannot be read or written, nothing is credited either: the caller answers
//!   a failure, and a retry claims again.
//!
//! The store is a port, [`ExternalClaims`]; `adapters::pg::external_claims` keeps it in the
//! claim cell's `external_claims` table.

use async_trait::async_trait;
use domain::{ErrorCode, UserId};

use crate::error::StoreError;

/// The claims on external_ids kept by one cell.
#[async_trait]
pub trait ExternalClaims: Send + Sync {
    /// Claims `external_id` for `user` unless someone holds it already, and returns who holds
    /// it now (`user` when this call or an earlier one of theirs took it). Taking it is
    /// durable before this returns.
    async fn claim(&self, external_id: &str, user: UserId) -> Result<UserId, StoreError>;
}

/// What a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The external_id is (now, or already) this user's: the deposit may go to its cell.
    Held,
    /// Another user holds it: the deposit is refused.
    OtherUser(UserId),
}

impl Claim {
    /// The contract's refusal for a deposit under this claim, if it is refused.
    pub fn refusal(self) -> Option<ErrorCode> {
        match self {
            Self::Held => None,
            Self::OtherUser(_) => Some(ErrorCode::IdempotencyKeyReused),
        }
    }
}

/// Claims `external_id` for `user` in `claims` (the store of the cell that keeps it). An
/// empty external_id is never claimed: the caller does not ask (the cell refuses the deposit as
/// it does without a map).
pub async fn claim(
    claims: &dyn ExternalClaims,
    external_id: &str,
    user: UserId,
) -> Result<Claim, StoreError> {
    assert!(
        !external_id.is_empty(),
        "an empty external_id is refused before any claim: claiming it would bind every \
         user's empty id to one user"
    );
    let holder = claims.claim(external_id, user).await?;
    Ok(if holder == user {
        Claim::Held
    } else {
        Claim::OtherUser(holder)
    })
}
