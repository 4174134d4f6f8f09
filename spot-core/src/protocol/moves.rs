//! A partition's move between two engines (ADR 0023 §4, `SPOT_MOVED`): what `move_out` answers
//! and `move_in` takes (the partition's accounts and the `(req_id, op)` records of its users),
//! and the WAL record of either (their answer, `MoveAnswer`, is `response.rs`').

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::kinds::{AccountStatus, MovementOp, Outcome, RefusalCode};

/// Longest `move_id` accepted (bytes); it is printable ASCII.
pub const MAX_MOVE_ID_BYTES: usize = 128;

/// A request line carrying a `move_in` may be this long (its payload is a partition's state); any
/// other line keeps [`super::MAX_LINE_BYTES`]. A move's WAL record must also fit one frame
/// (`storage::MAX_RECORD_BYTES`, 1 MiB): a bigger partition is refused `MOVE_REFUSED` at
/// `move_out`, before anything is recorded.
pub const MAX_MOVE_LINE_BYTES: usize = 2 << 20;

/// Which side of a move an engine took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveKind {
    /// `move_out`: the partition's state left this engine.
    Out,
    /// `move_in`: the partition's state came into this engine.
    In,
}

/// A partition's SPOT state, as `move_out` answers it and `move_in` takes it. Both lists are
/// sorted by their keys, each key once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovePayload {
    /// Every account of the partition's users, by `(user_id, asset)`.
    pub accounts: Vec<MovedAccount>,
    /// Every `(req_id, op)` record of the partition's users the engine remembered (those not
    /// older than its idempotency horizon), by `(req_id, op)`.
    pub records: Vec<MovedRecord>,
}

impl MovePayload {
    /// Every asset's moved balances added up (`None` past `Decimal`'s range).
    pub fn money(&self) -> Option<Decimal> {
        self.accounts
            .iter()
            .try_fold(Decimal::ZERO, |sum, a| sum.checked_add(a.available))
    }
}

/// One account of a moved partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovedAccount {
    pub user_id: u64,
    pub asset: String,
    pub available: Decimal,
    pub status: AccountStatus,
}

/// One `(req_id, op)` record of a moved partition's user: what a duplicate, a `lookup`, a
/// `cancel` and a refund's matching check need in the engine it moves to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovedRecord {
    pub req_id: String,
    pub op: MovementOp,
    pub user_id: u64,
    pub asset: String,
    pub amount: Decimal,
    pub outcome: Outcome,
    pub code: Option<RefusalCode>,
    pub balance: Option<Decimal>,
}

/// The WAL record of a `move_out` or a `move_in` (`op` says which): the whole payload, so replay
/// checks a `move_out` against the state it took and re-credits a `move_in` exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveRecord {
    pub seq: u64,
    pub move_id: String,
    pub partition: u8,
    pub payload: MovePayload,
}

/// A `move_id`: 1 to [`MAX_MOVE_ID_BYTES`] bytes of printable ASCII.
pub fn valid_move_id(move_id: &str) -> bool {
    !move_id.is_empty()
        && move_id.len() <= MAX_MOVE_ID_BYTES
        && move_id.bytes().all(|b| b.is_ascii_graphic())
}
