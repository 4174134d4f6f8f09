//! The adapter port: what the coordinator asks of an account system, and the outcome it gets.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::values::{AccountType, Amount, AssetSymbol, ReqId, UserId};

/// One movement of money in one account system, keyed by the transfer's `req_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Movement {
    pub req_id: ReqId,
    pub user_id: UserId,
    pub asset: AssetSymbol,
    pub amount: Amount,
}

/// What an adapter call came to. Only `ExplicitFail` proves nothing was applied; every other
/// non-success means the outcome is unknown and the call must be retried, never compensated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterOutcome {
    Success,
    /// A definite business refusal: nothing changed, and a retry would be refused again.
    ExplicitFail {
        code: String,
        message: String,
    },
    Timeout,
    Pending,
    NetworkError(String),
    /// The req_id is already recorded for another movement (other user, asset or amount): a bug
    /// or an attack. Nothing about this movement is known, so it is never retried blind nor
    /// compensated; it waits for an operator.
    Mismatch(String),
    /// Any other answer that proves nothing (an unexpected reply, a store error).
    Unknown(String),
}

impl AdapterOutcome {
    /// True when the call may or may not have been applied.
    pub fn is_unknown(&self) -> bool {
        !matches!(self, Self::Success | Self::ExplicitFail { .. })
    }
}

/// The three movements a transfer asks of an account system. `as_str` is the one spelling
/// (`WITHDRAW`, `DEPOSIT`, `REFUND`: the funding journal's column); reading one back refuses
/// anything else (`UnknownOperation`), never guessing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    Withdraw,
    Deposit,
    Refund,
}

impl Operation {
    /// Every operation, in a transfer's order.
    pub const ALL: [Operation; 3] = [Operation::Withdraw, Operation::Deposit, Operation::Refund];

    /// The canonical name.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Withdraw => "WITHDRAW",
            Operation::Deposit => "DEPOSIT",
            Operation::Refund => "REFUND",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is none of the operations' canonical names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown operation {0:?}")]
pub struct UnknownOperation(pub String);

impl FromStr for Operation {
    type Err = UnknownOperation;

    fn from_str(name: &str) -> Result<Self, UnknownOperation> {
        Operation::ALL
            .into_iter()
            .find(|op| op.as_str() == name)
            .ok_or_else(|| UnknownOperation(name.to_owned()))
    }
}

impl TryFrom<&str> for Operation {
    type Error = UnknownOperation;

    fn try_from(name: &str) -> Result<Self, UnknownOperation> {
        name.parse()
    }
}

/// What an account system's own records say about one (`req_id`, operation): the answer to
/// "what happened to X?" that lets a caller resolve an unknown outcome without a blind retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Applied, with the same user, asset and amount.
    Applied,
    /// Decided and refused; the refusal stands for any repeat.
    Refused { code: String, message: String },
    /// Never decided: nothing was applied under this key (as of the answer).
    NotSeen,
    /// The system could not answer: nothing is known.
    Unavailable(String),
    /// The key is recorded for another movement (other user, asset or amount): a bug or an
    /// attack. Nothing about *this* movement can be concluded, and no resolution may rest on it.
    Mismatch(String),
}

/// An account system seen through one account type. Every method is idempotent by
/// (`req_id`, operation): calling it again returns the first result and changes nothing.
#[async_trait]
pub trait AccountPort: Send + Sync {
    fn account_type(&self) -> AccountType;
    /// Takes money out of the account (the source step).
    async fn withdraw(&self, movement: &Movement) -> AdapterOutcome;
    /// Puts money into the account (the target step); may create a SPOT account.
    async fn deposit(&self, movement: &Movement) -> AdapterOutcome;
    /// Gives back a withdraw of the same `req_id` (compensation). Refused unless that withdraw
    /// was applied with the same user, asset and amount.
    async fn refund(&self, movement: &Movement) -> AdapterOutcome;
    /// Makes `operation` for every movement (the bulk path), one outcome per movement in
    /// order, each with the single call's meaning: only `ExplicitFail` proves nothing was
    /// applied. This default calls them one by one; an account system may share one durable
    /// write among them (the funding ledger decides them in one call of its batch, spot-core's
    /// client pipelines them on one connection).
    async fn movements(&self, operation: Operation, movements: &[Movement]) -> Vec<AdapterOutcome> {
        let mut outcomes = Vec::with_capacity(movements.len());
        for m in movements {
            outcomes.push(match operation {
                Operation::Withdraw => self.withdraw(m).await,
                Operation::Deposit => self.deposit(m).await,
                Operation::Refund => self.refund(m).await,
            });
        }
        outcomes
    }
    /// What the system recorded for `operation` of `movement.req_id`. Changes nothing. A system
    /// that cannot tell answers `Unavailable`, and the caller falls back to an idempotent retry.
    async fn lookup(&self, movement: &Movement, operation: Operation) -> Recorded {
        let _ = (movement, operation);
        Recorded::Unavailable("this account system cannot look up past operations".to_owned())
    }
    /// Settles (`req_id`, `operation`) for good: if the system has not decided it yet, it durably
    /// records a refusal with code `CANCELLED`, so any copy of the call still queued or in flight
    /// is refused when it arrives. Answers what is recorded now (`Refused` after a cancel,
    /// `Applied` if the call got there first). A system that cannot cancel answers `Unavailable`.
    async fn cancel(&self, movement: &Movement, operation: Operation) -> Recorded {
        let _ = (movement, operation);
        Recorded::Unavailable("this account system cannot cancel a movement".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_reads_back_only_its_own_name() {
        for op in Operation::ALL {
            assert_eq!(op.as_str().parse::<Operation>(), Ok(op));
            assert_eq!(Operation::try_from(op.to_string().as_str()), Ok(op));
        }
        for unknown in ["", "withdraw", "Refund", "REFUNDS", "TRANSFER", " DEPOSIT"] {
            assert_eq!(
                unknown.parse::<Operation>(),
                Err(UnknownOperation(unknown.to_owned())),
                "{unknown:?}"
            );
        }
    }
}
