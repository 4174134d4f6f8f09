//! The WAL's records (also what `journal` answers): their JSON is the WAL payload, so a change
//! keeps old records readable.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::kinds::{AccountStatus, MovementOp, Outcome, RefusalCode};
use super::moves::MoveRecord;

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
    /// A `hello` named a cell map version higher than any this engine had seen (ADR 0023 §1):
    /// from then on a `hello` naming a lower one is refused `STALE_MAP`.
    MapVersion(MapVersionRecord),
    /// `move_out` took a partition's accounts out of this engine and marked the partition moved
    /// out (ADR 0023 §4): its users' movements are answered `MOVED` from then on.
    MoveOut(MoveRecord),
    /// `move_in` credited a partition's accounts and installed its users' records, and cleared
    /// the partition's moved-out mark if it had one.
    MoveIn(MoveRecord),
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
            JournalRecord::MapVersion(v) => v.seq,
            JournalRecord::MoveOut(m) | JournalRecord::MoveIn(m) => m.seq,
        }
    }

    pub fn as_movement(&self) -> Option<(MovementOp, &MovementRecord)> {
        match self {
            JournalRecord::Withdraw(m) => Some((MovementOp::Withdraw, m)),
            JournalRecord::Deposit(m) => Some((MovementOp::Deposit, m)),
            JournalRecord::Refund(m) => Some((MovementOp::Refund, m)),
            JournalRecord::SetStatus(_)
            | JournalRecord::Horizon(_)
            | JournalRecord::Retain(_)
            | JournalRecord::MapVersion(_)
            | JournalRecord::MoveOut(_)
            | JournalRecord::MoveIn(_) => None,
        }
    }

    /// The money this record takes out of the engine's totals (negative) or brings in: an
    /// applied movement's amount, a move's balances; zero for the rest. `None` past `Decimal`'s
    /// range.
    pub fn money_moved(&self) -> Option<Decimal> {
        match self {
            JournalRecord::Withdraw(m) if m.outcome == Outcome::Applied => Some(-m.amount),
            JournalRecord::Deposit(m) | JournalRecord::Refund(m)
                if m.outcome == Outcome::Applied =>
            {
                Some(m.amount)
            }
            JournalRecord::MoveOut(m) => m.payload.money().map(|v| -v),
            JournalRecord::MoveIn(m) => m.payload.money(),
            _ => Some(Decimal::ZERO),
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapVersionRecord {
    pub seq: u64,
    pub version: u64,
}
