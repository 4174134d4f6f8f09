//! The answer lines of the protocol: the response, and what `status`, `lookup`, `balances`
//! and `totals` carry.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::kinds::{AccountStatus, ErrorCode, MovementOp, Outcome, RefusalCode};
use super::moves::MoveKind;
use super::moves::{MovePayload, MoveRecord};
use super::record::JournalRecord;
use super::request::PROTOCOL_VERSION;

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
        /// In the answer to `move_out`, `move_in` and `move_lookup`. Boxed: every other answer
        /// goes without, and the response stays within clippy's enum size limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[allow(clippy::box_collection)]
        moves: Option<Box<Vec<MoveAnswer>>>,
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
            moves: None,
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
            moves: None,
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
    /// The highest cell map version a `hello` has named (0: none).
    #[serde(default)]
    pub map_version: u64,
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

/// The answer to `move_out`, `move_in` and `move_lookup` (one entry of `moves`): the same for a
/// move and every retry of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveAnswer {
    pub move_id: String,
    pub kind: MoveKind,
    pub partition: u8,
    /// The seq of the move's WAL record.
    pub seq: u64,
    /// Accounts and records moved.
    pub accounts: u64,
    pub records: u64,
    /// Per asset, the balances moved: what the other engine's answer must show.
    pub totals: Vec<TotalEntry>,
    /// The partition's state, in the answer to a `move_out` (and its lookup) only: what the
    /// target's `move_in` takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<MovePayload>,
}

impl MoveAnswer {
    /// The answer for the move `record` of `kind`.
    pub fn of(kind: MoveKind, record: &MoveRecord) -> MoveAnswer {
        MoveAnswer {
            move_id: record.move_id.clone(),
            kind,
            partition: record.partition,
            seq: record.seq,
            accounts: record.payload.accounts.len() as u64,
            records: record.payload.records.len() as u64,
            totals: moved_totals(&record.payload),
            payload: (kind == MoveKind::Out).then(|| record.payload.clone()),
        }
    }
}

/// Per asset, the balances `payload` moves (sorted by asset; an asset with no account is absent).
fn moved_totals(payload: &MovePayload) -> Vec<TotalEntry> {
    let mut sums: std::collections::BTreeMap<&str, Decimal> = Default::default();
    for a in &payload.accounts {
        *sums.entry(&a.asset).or_default() += a.available;
    }
    sums.into_iter()
        .map(|(asset, sum)| TotalEntry {
            asset: asset.to_owned(),
            sum: sum.normalize(),
        })
        .collect()
}
