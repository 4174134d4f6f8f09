//! Wire types of the spot-core protocol (newline-delimited JSON over TCP) and of its WAL records.
//!
//! These types are shared by the server, the WAL, the client and other crates of the workspace,
//! so everything here is plain serde data with no behaviour that depends on engine state.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

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
}

/// What a replicated engine adds to its answer to `hello` (protocol version 3): the epoch it
/// leads, and its role. Read from the same line as the `Response`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloInfo {
    #[serde(default)]
    pub epoch: Option<u64>,
    #[serde(default)]
    pub role: Option<String>,
}

/// One response line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Response {
    /// A movement took effect (now, or earlier when `duplicate` is true).
    Applied {
        balance: Decimal,
        duplicate: bool,
        seq: u64,
    },
    /// Nothing changed. `seq` is present when the refusal is recorded in the WAL.
    Refused {
        code: RefusalCode,
        message: String,
        duplicate: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
    },
    /// The request could not be understood; nothing changed.
    Error { code: ErrorCode, message: String },
    /// Successful non-movement request; exactly the field belonging to the op is set.
    Ok {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ops: Option<Vec<LookupOp>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        balances: Option<Vec<BalanceEntry>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        totals: Option<Vec<TotalEntry>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        records: Option<Vec<JournalRecord>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        core: Option<CoreStatus>,
        /// In the answer to `hello` only: the engine's protocol version (`PROTOCOL_VERSION`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        protocol: Option<u32>,
    },
}

impl Response {
    /// `{"status":"ok"}` with no payload.
    pub fn ok() -> Response {
        Response::Ok {
            ops: None,
            balances: None,
            totals: None,
            records: None,
            core: None,
            protocol: None,
        }
    }

    /// The answer to an accepted `hello`: `ok` with this engine's protocol version.
    pub fn hello() -> Response {
        Response::Ok {
            ops: None,
            balances: None,
            totals: None,
            records: None,
            core: None,
            protocol: Some(PROTOCOL_VERSION),
        }
    }

    /// The protocol version an answer to `hello` announces: 1 when it names none.
    pub fn protocol_version(&self) -> u32 {
        match self {
            Response::Ok {
                protocol: Some(v), ..
            } => *v,
            _ => 1,
        }
    }

    pub fn refused(code: RefusalCode, duplicate: bool, seq: Option<u64>) -> Response {
        Response::Refused {
            code,
            message: code.message().to_string(),
            duplicate,
            seq,
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Response {
        Response::Error {
            code: ErrorCode::Unauthorized,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Response {
        Response::Error {
            code: ErrorCode::BadRequest,
            message: message.into(),
        }
    }
}

/// What `status` (and `advance_horizon`, `retain`) answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreStatus {
    /// Seq of the newest record (0 when empty).
    pub last_seq: u64,
    /// The idempotency horizon, Unix milliseconds (0: none yet).
    pub horizon_ms: u64,
    /// The audit's consumed position (`retain`).
    pub retain_after: u64,
    /// The oldest seq `journal` can still serve (from the live WAL or the archive).
    pub first_seq: u64,
    /// Seq covered by the newest durable snapshot (0: none).
    pub snapshot_seq: u64,
    /// Size of the newest durable snapshot file.
    pub snapshot_bytes: u64,
    /// Bytes of WAL segments in the data directory.
    pub wal_bytes: u64,
    /// WAL segments in the data directory.
    pub wal_segments: u64,
    /// `(req_id, op)` records remembered in RAM.
    pub remembered: u64,
    /// Accounts in RAM.
    pub accounts: u64,
    /// On the leader of a replicated cell (ADR 0020): its epoch and each follower's
    /// acknowledged seq; absent on a single engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationStatus>,
}

/// A replicated leader's view of its followers (`status`), for `/metrics` and the admin's
/// cells view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationStatus {
    pub epoch: u64,
    /// Replicas holding everything acknowledged: the leader and each follower of this epoch
    /// within one batch of it (2 or 3 while the cell acknowledges).
    pub acknowledging: u32,
    pub followers: Vec<FollowerStatus>,
}

/// One follower as the leader sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowerStatus {
    pub name: String,
    /// The last seq it acknowledged as fsynced (0: none this epoch).
    pub acked_seq: u64,
    /// Records it is behind the leader's last seq.
    pub lag: u64,
}

/// One entry of a `lookup` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupOp {
    pub op: MovementOp,
    pub user_id: u64,
    pub asset: String,
    pub amount: Decimal,
    pub outcome: Outcome,
    pub code: Option<RefusalCode>,
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceEntry {
    pub asset: String,
    pub available: Decimal,
    pub status: AccountStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TotalEntry {
    pub asset: String,
    pub sum: Decimal,
}

/// One WAL record; also what `journal` returns. Its JSON is the WAL payload, so changing
/// it means keeping old records readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum JournalRecord {
    Withdraw(MovementRecord),
    Deposit(MovementRecord),
    Refund(MovementRecord),
    SetStatus(StatusRecord),
    /// `advance_horizon` moved the idempotency horizon forward.
    Horizon(HorizonRecord),
    /// `retain` moved the audit's consumed position forward.
    Retain(RetainRecord),
}

impl JournalRecord {
    pub fn seq(&self) -> u64 {
        match self {
            JournalRecord::Withdraw(m) | JournalRecord::Deposit(m) | JournalRecord::Refund(m) => {
                m.seq
            }
            JournalRecord::SetStatus(s) => s.seq,
            JournalRecord::Horizon(h) => h.seq,
            JournalRecord::Retain(r) => r.seq,
        }
    }

    pub fn as_movement(&self) -> Option<(MovementOp, &MovementRecord)> {
        match self {
            JournalRecord::Withdraw(m) => Some((MovementOp::Withdraw, m)),
            JournalRecord::Deposit(m) => Some((MovementOp::Deposit, m)),
            JournalRecord::Refund(m) => Some((MovementOp::Refund, m)),
            JournalRecord::SetStatus(_) | JournalRecord::Horizon(_) | JournalRecord::Retain(_) => {
                None
            }
        }
    }

    pub fn from_movement(op: MovementOp, rec: MovementRecord) -> JournalRecord {
        match op {
            MovementOp::Withdraw => JournalRecord::Withdraw(rec),
            MovementOp::Deposit => JournalRecord::Deposit(rec),
            MovementOp::Refund => JournalRecord::Refund(rec),
        }
    }
}

/// A withdraw / deposit / refund that was accepted (applied or refused for a business reason).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovementRecord {
    pub seq: u64,
    pub req_id: String,
    pub user_id: u64,
    pub asset: String,
    pub amount: Decimal,
    pub outcome: Outcome,
    /// Set exactly when `outcome` is `refused`.
    pub code: Option<RefusalCode>,
    /// Available balance right after an applied movement; kept so a duplicate can return
    /// the first answer verbatim. `None` for refusals.
    pub balance: Option<Decimal>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusRecord {
    pub seq: u64,
    pub user_id: u64,
    pub asset: String,
    pub status: AccountStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HorizonRecord {
    pub seq: u64,
    pub before_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetainRecord {
    pub seq: u64,
    pub after_seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn parse(line: &str) -> Result<Request, serde_json::Error> {
        serde_json::from_str(line)
    }

    #[test]
    fn requests_parse_from_the_documented_shapes() {
        let r =
            parse(r#"{"op":"withdraw","req_id":"a-1","user_id":7,"asset":"USDT","amount":"10.5"}"#)
                .unwrap();
        assert_eq!(
            r,
            Request::Withdraw(MovementRequest::new(
                "a-1",
                7,
                "USDT",
                Decimal::from_str("10.5").unwrap()
            ))
        );
        assert_eq!(parse(r#"{"op":"ping"}"#).unwrap(), Request::Ping {});
        assert_eq!(parse(r#"{"op":"totals"}"#).unwrap(), Request::Totals {});
        assert_eq!(
            parse(r#"{"op":"journal"}"#).unwrap(),
            Request::Journal {
                after_seq: 0,
                limit: DEFAULT_JOURNAL_LIMIT
            }
        );
        assert_eq!(
            parse(r#"{"op":"set_status","user_id":1,"asset":"BTC","status":"FROZEN"}"#).unwrap(),
            Request::SetStatus {
                user_id: 1,
                asset: "BTC".into(),
                status: AccountStatus::Frozen
            }
        );
    }

    #[test]
    fn unknown_ops_and_fields_are_rejected() {
        assert!(parse(r#"{"op":"steal"}"#).is_err());
        assert!(parse(r#"{"op":"ping","x":1}"#).is_err());
        assert!(parse(r#"{"op":"totals","x":1}"#).is_err());
        assert!(parse(r#"{"op":"lookup","req_id":"a","x":1}"#).is_err());
        assert!(parse(
            r#"{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC","amount":"1","x":1}"#
        )
        .is_err());
        assert!(parse(r#"{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC"}"#).is_err());
        // A float on the wire is not money.
        assert!(
            parse(r#"{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC","amount":1.5}"#)
                .is_err()
        );
        assert!(parse(r#"{"op":"balances","user_id":-1}"#).is_err());
    }

    /// Version 2's `trace` rides on a movement, is left out when absent (a version 1 line is
    /// unchanged), and the hello answer announces the version; an old engine's bare `ok` reads
    /// as version 1.
    #[test]
    fn a_trace_is_a_version_2_field_of_movements_only() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let line = format!(
            r#"{{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC","amount":"1","trace":"{tp}"}}"#
        );
        let Request::Deposit(m) = parse(&line).unwrap() else {
            panic!("a deposit");
        };
        assert_eq!(m.trace.as_deref(), Some(tp));
        let plain = Request::deposit("a", 1, "BTC", Decimal::ONE);
        assert!(!serde_json::to_string(&plain).unwrap().contains("trace"));
        assert!(parse(&format!(r#"{{"op":"lookup","req_id":"a","trace":"{tp}"}}"#)).is_err());
        let hello = serde_json::to_string(&Response::hello()).unwrap();
        assert_eq!(
            hello,
            format!(r#"{{"status":"ok","protocol":{PROTOCOL_VERSION}}}"#)
        );
        let back: Response = serde_json::from_str(&hello).unwrap();
        assert_eq!(back.protocol_version(), PROTOCOL_VERSION);
        let old: Response = serde_json::from_str(r#"{"status":"ok"}"#).unwrap();
        assert_eq!(old.protocol_version(), 1);
    }

    #[test]
    fn responses_use_strings_for_amounts() {
        let r = Response::Applied {
            balance: Decimal::from_str("10.5").unwrap(),
            duplicate: false,
            seq: 3,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"status":"applied","balance":"10.5","duplicate":false,"seq":3}"#
        );
        assert_eq!(
            serde_json::to_string(&Response::ok()).unwrap(),
            r#"{"status":"ok"}"#
        );
        let refused = Response::refused(RefusalCode::InsufficientBalance, true, None);
        let text = serde_json::to_string(&refused).unwrap();
        assert!(
            text.starts_with(r#"{"status":"refused","code":"INSUFFICIENT_BALANCE","#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Response>(&text).unwrap(), refused);
    }

    #[test]
    fn lookup_entries_serialize_null_code() {
        let op = LookupOp {
            op: MovementOp::Withdraw,
            user_id: 7,
            asset: "USDT".into(),
            amount: Decimal::from_str("10.5").unwrap(),
            outcome: Outcome::Applied,
            code: None,
            seq: 12,
        };
        assert_eq!(
            serde_json::to_string(&op).unwrap(),
            r#"{"op":"withdraw","user_id":7,"asset":"USDT","amount":"10.5","outcome":"applied","code":null,"seq":12}"#
        );
    }

    /// The one spelling of each op: parsed back, refused when unknown, and the same as the tag
    /// of its request and of its record (serde derives those from the variant names).
    #[test]
    fn every_movement_op_has_one_name() {
        assert_eq!("withdraw".parse(), Ok(MovementOp::Withdraw));
        assert_eq!(
            "Withdraw".parse::<MovementOp>(),
            Err(UnknownMovementOp("Withdraw".into()))
        );
        assert!("".parse::<MovementOp>().is_err());
        assert!(serde_json::from_str::<MovementOp>(r#""steal""#).is_err());
        assert!(serde_json::from_str::<MovementOp>(r#"{"withdraw":null}"#).is_err());
        for op in MovementOp::ALL {
            let name = op.as_str();
            assert_eq!(name.parse(), Ok(op));
            assert_eq!(op.to_string(), name);
            assert_eq!(serde_json::to_string(&op).unwrap(), format!("\"{name}\""));
            assert_eq!(
                serde_json::from_str::<MovementOp>(&format!("\"{name}\"")).unwrap(),
                op
            );
            let tag = |v: serde_json::Value| v["op"].as_str().map(str::to_owned);
            let request = Request::movement(op, "a", 1, "USDT", Decimal::ONE);
            assert_eq!(
                tag(serde_json::to_value(&request).unwrap()).as_deref(),
                Some(name)
            );
            let record = JournalRecord::from_movement(
                op,
                MovementRecord {
                    seq: 1,
                    req_id: "a".into(),
                    user_id: 1,
                    asset: "USDT".into(),
                    amount: Decimal::ONE,
                    outcome: Outcome::Applied,
                    code: None,
                    balance: Some(Decimal::ONE),
                },
            );
            let json = serde_json::to_value(&record).unwrap();
            assert_eq!(tag(json.clone()).as_deref(), Some(name));
            assert_eq!(
                serde_json::from_value::<JournalRecord>(json).unwrap(),
                record
            );
        }
    }

    #[test]
    fn canonical_amount_drops_trailing_zeros() {
        assert_eq!(
            canonical_amount(Decimal::from_str("10.500").unwrap()),
            "10.5"
        );
        assert_eq!(canonical_amount(Decimal::from_str("100").unwrap()), "100");
        assert_eq!(
            canonical_amount(Decimal::from_str("0.00000001").unwrap()),
            "0.00000001"
        );
    }
}
