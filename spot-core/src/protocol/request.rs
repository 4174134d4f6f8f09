//! The request lines of the protocol, and its limits and versions.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::kinds::{AccountStatus, MovementOp};
use super::moves::MovePayload;

/// Largest `limit` a `journal` request may ask for; bigger values are capped.
pub const MAX_JOURNAL_LIMIT: u32 = 10_000;
/// `limit` used when a `journal` request omits it.
pub const DEFAULT_JOURNAL_LIMIT: u32 = 1_000;
/// A request line longer than this closes the connection.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// The protocol version this engine speaks, announced in its answer to `hello` (`protocol`).
/// An engine that announces none is version 1.
pub const PROTOCOL_VERSION: u32 = 3;

/// The first version whose `hello` takes `epoch` and `map_version` and answers with the
/// replica's `epoch` and `role` (ADR 0020 §4).
pub const EPOCH_SINCE_VERSION: u32 = 3;

/// The first version whose movement requests may carry `trace` (a W3C traceparent,
/// `docs/adr/0018-traces.md`). A client adds it only on a connection whose `hello` was answered
/// with at least this version: an older engine refuses unknown fields.
pub const TRACE_SINCE_VERSION: u32 = 2;

/// One request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Withdraw(MovementRequest),
    Deposit(MovementRequest),
    Refund(MovementRequest),
    Lookup {
        req_id: String,
    },
    Balances {
        user_id: u64,
    },
    SetStatus {
        user_id: u64,
        asset: String,
        status: AccountStatus,
    },
    // Empty struct variants (not unit variants) so that unknown fields are rejected.
    Ping {},
    Totals {},
    Journal {
        #[serde(default)]
        after_seq: u64,
        #[serde(default = "default_journal_limit")]
        limit: u32,
    },
    /// Settle `(req_id, movement)` for good: record a `CANCELLED` refusal if nothing is
    /// recorded under that key yet, otherwise report what is. Answered like `lookup`, with
    /// exactly one entry.
    Cancel {
        req_id: String,
        movement: MovementOp,
        user_id: u64,
        asset: String,
        amount: String,
    },
    /// Authenticate the connection (the first line when the server has a token). Handled by
    /// the server itself, never by the engine, and answered `ok` with the engine's `protocol`
    /// version (since version 2; an older engine answers a bare `ok`). `cell`, when given, is the cell the client
    /// expects this engine to be (ADR 0017): a server started with another cell id refuses the
    /// connection; a hello without it (old clients, no cell map) is not checked.
    Hello {
        token: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cell: Option<u16>,
        /// The highest epoch the client has seen from this cell's spot-core (ADR 0020 §4): a
        /// replica whose own epoch is lower refuses `STALE_EPOCH`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64>,
        /// The cell map's version the client routes by; reserved for partition moves (ADR 0020
        /// §4), accepted and not checked yet.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map_version: Option<u64>,
    },
    /// Move the idempotency horizon forward to `before_ms` (Unix milliseconds): every `req_id`
    /// whose ULID time is earlier is forgotten and refused `REQ_ID_EXPIRED` from then on.
    /// Recorded in the WAL when it moves the horizon forward; a value at or behind the current
    /// horizon changes nothing. Answered `ok` with `status`.
    AdvanceHorizon {
        before_ms: u64,
    },
    /// The fund-conservation audit has consumed every journal record up to `after_seq`:
    /// compaction may drop WAL segments wholly at or before it (and before the newest durable
    /// snapshot). Never moves backwards; durable. Answered `ok` with `status`.
    Retain {
        after_seq: u64,
    },
    /// Counters for operators and the growth benchmark. Answered `ok` with `status`.
    Status {},
    /// Take partition `partition`'s accounts out of this engine and answer them with its users'
    /// `(req_id, op)` records (ADR 0023 §4, `SPOT_MOVED`); from then on a movement, cancel or
    /// status change of its users is answered `MOVED`. Journaled before the answer; a retry
    /// with the same `move_id` gets the same answer. Answered `ok` with `moves` (one entry).
    MoveOut {
        move_id: String,
        partition: u8,
    },
    /// Credit a partition's accounts and install its users' records, taken from another
    /// engine's `move_out` answer; clears this engine's moved-out mark of the partition if it
    /// has one (a move back). Journaled; idempotent by `move_id`. Answered `ok` with `moves`.
    MoveIn {
        move_id: String,
        partition: u8,
        payload: MovePayload,
    },
    /// The move recorded under `move_id`, if any: `ok` with `moves`, empty or one entry.
    MoveLookup {
        move_id: String,
    },
}

fn default_journal_limit() -> u32 {
    DEFAULT_JOURNAL_LIMIT
}

impl Request {
    /// A movement request; `amount` is rendered in canonical plain notation.
    pub fn movement(
        op: MovementOp,
        req_id: impl Into<String>,
        user_id: u64,
        asset: impl Into<String>,
        amount: Decimal,
    ) -> Request {
        let body = MovementRequest::new(req_id, user_id, asset, amount);
        match op {
            MovementOp::Withdraw => Request::Withdraw(body),
            MovementOp::Deposit => Request::Deposit(body),
            MovementOp::Refund => Request::Refund(body),
        }
    }

    pub fn withdraw(
        req_id: impl Into<String>,
        user_id: u64,
        asset: impl Into<String>,
        amount: Decimal,
    ) -> Request {
        Request::movement(MovementOp::Withdraw, req_id, user_id, asset, amount)
    }

    pub fn deposit(
        req_id: impl Into<String>,
        user_id: u64,
        asset: impl Into<String>,
        amount: Decimal,
    ) -> Request {
        Request::movement(MovementOp::Deposit, req_id, user_id, asset, amount)
    }

    pub fn refund(
        req_id: impl Into<String>,
        user_id: u64,
        asset: impl Into<String>,
        amount: Decimal,
    ) -> Request {
        Request::movement(MovementOp::Refund, req_id, user_id, asset, amount)
    }

    /// The movement kind and body, when this request moves money.
    pub fn as_movement(&self) -> Option<(MovementOp, &MovementRequest)> {
        match self {
            Request::Withdraw(m) => Some((MovementOp::Withdraw, m)),
            Request::Deposit(m) => Some((MovementOp::Deposit, m)),
            Request::Refund(m) => Some((MovementOp::Refund, m)),
            _ => None,
        }
    }
}

/// Body of withdraw / deposit / refund.
///
/// `amount` stays a string on this side of the wire so the engine can refuse non-canonical
/// spellings (`"1e3"`, `"+1"`, `" 1"`) with `INVALID_AMOUNT` instead of silently accepting them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovementRequest {
    pub req_id: String,
    pub user_id: u64,
    pub asset: String,
    pub amount: String,
    /// The caller's trace context, a W3C `traceparent` (protocol version 2): spot-core's spans for
    /// this request join that trace. Never part of what is recorded (the WAL's `MovementRecord`
    /// has no such field), nor of the idempotency check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

impl MovementRequest {
    pub fn new(
        req_id: impl Into<String>,
        user_id: u64,
        asset: impl Into<String>,
        amount: Decimal,
    ) -> Self {
        MovementRequest {
            req_id: req_id.into(),
            user_id,
            asset: asset.into(),
            amount: canonical_amount(amount),
            trace: None,
        }
    }
}

/// Plain decimal notation without trailing fractional zeros, as the engine expects it.
pub fn canonical_amount(amount: Decimal) -> String {
    amount.normalize().to_string()
}
