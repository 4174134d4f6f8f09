//! The WAL's records (also what `journal` answers): their JSON is the WAL payload, so a change
//! keeps old records readable.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::kinds::{AccountStatus, MovementOp, Outcome, RefusalCode};

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
            | JournalRecord::MapVersion(_) => None,
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
