//! The names both ends of the protocol and the WAL use: movement ops, account statuses,
//! outcomes, refusal and error codes.

use serde::{Deserialize, Serialize};

/// A movement's kind. Its names are spelled only in `as_str`: `FromStr`, serde (the wire, the
/// WAL's records, `journal`) and every message go through it. The tags of `Request` and
/// `JournalRecord` are the same names, which a test holds to `as_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MovementOp {
    Withdraw,
    Deposit,
    Refund,
}

impl MovementOp {
    /// Every op, in key order.
    pub const ALL: [MovementOp; 3] = [
        MovementOp::Withdraw,
        MovementOp::Deposit,
        MovementOp::Refund,
    ];

    /// The op's one name, on the wire and on disk.
    pub fn as_str(self) -> &'static str {
        match self {
            MovementOp::Withdraw => "withdraw",
            MovementOp::Deposit => "deposit",
            MovementOp::Refund => "refund",
        }
    }
}

/// A name that is no movement op's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown movement op `{0}`")]
pub struct UnknownMovementOp(pub String);

impl std::str::FromStr for MovementOp {
    type Err = UnknownMovementOp;

    /// The op named exactly `name`; anything else is an error, never a default.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        MovementOp::ALL
            .into_iter()
            .find(|op| op.as_str() == name)
            .ok_or_else(|| UnknownMovementOp(name.to_owned()))
    }
}

impl std::fmt::Display for MovementOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for MovementOp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for MovementOp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = MovementOp;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a movement op's name")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<MovementOp, E> {
                name.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccountStatus {
    Active,
    Frozen,
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Applied,
    Refused,
}

/// Why a request was refused. Every refusal means "nothing changed".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefusalCode {
    // Validation refusals: decided from the request alone, never recorded.
    InvalidReqId,
    InvalidUserId,
    InvalidAsset,
    InvalidAmount,
    PrecisionOverflow,
    /// The amount itself is above 10^20 (validation), or the resulting balance would be
    /// (business, recorded).
    Overflow,
    /// The (req_id, op) was already used with a different user_id/asset/amount. Not recorded.
    ReqIdConflict,
    // Business refusals: depend on state, recorded in the WAL.
    SourceAccountNotFound,
    AccountFrozen,
    AccountDisabled,
    InsufficientBalance,
    NoMatchingWithdraw,
    /// Recorded by a `cancel` before any copy of the movement arrived: every later copy gets
    /// this refusal as a duplicate, so the movement can never be applied.
    Cancelled,
    /// The `req_id`'s ULID time is before the idempotency horizon: its records are forgotten,
    /// and it is refused for good (never recorded, never applied). `lookup` answers this too,
    /// never "not seen".
    ReqIdExpired,
}

impl RefusalCode {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::InvalidReqId => "INVALID_REQ_ID",
            RefusalCode::InvalidUserId => "INVALID_USER_ID",
            RefusalCode::InvalidAsset => "INVALID_ASSET",
            RefusalCode::InvalidAmount => "INVALID_AMOUNT",
            RefusalCode::PrecisionOverflow => "PRECISION_OVERFLOW",
            RefusalCode::Overflow => "OVERFLOW",
            RefusalCode::ReqIdConflict => "REQ_ID_CONFLICT",
            RefusalCode::SourceAccountNotFound => "SOURCE_ACCOUNT_NOT_FOUND",
            RefusalCode::AccountFrozen => "ACCOUNT_FROZEN",
            RefusalCode::AccountDisabled => "ACCOUNT_DISABLED",
            RefusalCode::InsufficientBalance => "INSUFFICIENT_BALANCE",
            RefusalCode::NoMatchingWithdraw => "NO_MATCHING_WITHDRAW",
            RefusalCode::Cancelled => "CANCELLED",
            RefusalCode::ReqIdExpired => "REQ_ID_EXPIRED",
        }
    }

    /// Human-readable text; derived from the code only, so a duplicate repeats it exactly.
    pub fn message(self) -> &'static str {
        match self {
            RefusalCode::InvalidReqId => {
                "req_id must be a canonical ULID (26 uppercase Crockford base32 characters) \
                 created at most 24 h ahead of spot-core's clock"
            }
            RefusalCode::InvalidUserId => "user_id must be between 1 and 9223372036854775807",
            RefusalCode::InvalidAsset => "asset is not configured",
            RefusalCode::InvalidAmount => "amount must be a positive plain decimal string",
            RefusalCode::PrecisionOverflow => {
                "amount has more fractional digits than the asset allows"
            }
            RefusalCode::Overflow => "amount or resulting balance exceeds 10^20",
            RefusalCode::ReqIdConflict => {
                "req_id was already used for this op with different parameters"
            }
            RefusalCode::SourceAccountNotFound => "no spot account for this user and asset",
            RefusalCode::AccountFrozen => "account is frozen",
            RefusalCode::AccountDisabled => "account is disabled",
            RefusalCode::InsufficientBalance => "insufficient available balance",
            RefusalCode::NoMatchingWithdraw => {
                "no applied withdraw with this req_id, user, asset and amount"
            }
            RefusalCode::Cancelled => "cancelled before it was applied; it never will be",
            RefusalCode::ReqIdExpired => {
                "req_id is older than the idempotency horizon; it is refused for good"
            }
        }
    }
}

impl std::fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// Malformed JSON, unknown op, unknown or missing fields, oversized line.
    BadRequest,
    /// The server requires a token and the connection did not start with a matching `hello`;
    /// the connection is closed after this answer.
    Unauthorized,
    /// A `journal` request reaches before the oldest record this spot-core still serves
    /// (compacted, and not archived); the message names the first seq available.
    JournalCompacted,
    /// This replica does not lead its cell (ADR 0020): the message names the leader's address
    /// when known. Nothing was done; the client tries the next replica.
    NotLeader,
    /// The client has seen a higher epoch than this replica's: it is a deposed leader, or a
    /// follower that has not heard of the new one yet. Nothing was done.
    StaleEpoch,
    /// The `hello` names a cell map version older than one this spot-core has seen (ADR 0023
    /// §1): the client routes by a map that may send a moved partition's users here. The
    /// message names both versions; the connection is closed after this answer.
    StaleMap,
    /// The user's partition moved out of this engine (`move_out`, ADR 0023 §4): nothing was
    /// done. Not a refusal of the movement: the caller routes it again under the new map, where
    /// the partition's engine answers it (and knows its earlier records).
    Moved,
    /// A `move_out` or `move_in` this engine will not apply (the message says why: a payload
    /// user of another partition, a balance past 10^20, a `move_id` used for another move, a
    /// partition too big for one record); nothing was done.
    MoveRefused,
}
