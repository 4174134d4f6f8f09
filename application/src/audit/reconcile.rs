//! The per-req_id reconciliation, pure: what a transfer's events require and allow against the
//! movements the account systems applied under its req_id, and when a transfer is settled (its
//! records can never disagree again unless a new movement appears under its req_id), so that the
//! checkpoint may forget it.

use crate::books::AppliedMovement;
use crate::stores::AuditTransfer;
use domain::{AccountType, Operation, TransferEvent, TransferState};
use rust_decimal::Decimal;
use serde::Serialize;

/// A transfer (or a req_id with no transfer) whose records disagree with its events.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Disagreement {
    pub req_id: String,
    pub state: Option<String>,
    pub problem: String,
}

/// The three operations, in the order missing ones are reported.
pub(super) const OPERATIONS: [Operation; 3] =
    [Operation::Withdraw, Operation::Deposit, Operation::Refund];

/// A transfer's details and state, from its events.
#[derive(Debug, Clone)]
pub(super) struct Known {
    pub user_id: i64,
    pub from: AccountType,
    pub to: AccountType,
    pub asset: String,
    pub amount: Decimal,
    pub state: TransferState,
    /// The transaction that wrote its `TransferCreated`.
    pub created_tx: u64,
}

impl Known {
    pub fn from_log(t: &AuditTransfer) -> Option<Self> {
        let TransferEvent::TransferCreated {
            user_id,
            from,
            to,
            asset,
            amount,
            ..
        } = &t.created
        else {
            return None;
        };
        Some(Self {
            user_id: user_id.as_i64(),
            from: *from,
            to: *to,
            asset: asset.as_str().to_owned(),
            amount: amount.value(),
            state: t.state,
            created_tx: t.created_tx,
        })
    }

    /// The system `operation` must be applied in.
    fn system_of(&self, operation: Operation) -> AccountType {
        if operation == Operation::Deposit {
            self.to
        } else {
            self.from
        }
    }

    /// The movements a terminal transfer whose records were settled had applied: exactly one
    /// per operation its state requires, in the right system, with its details (the definition
    /// of settled, [`is_settled`]).
    pub fn settled_movements(&self, req_id: &str) -> Vec<AppliedMovement> {
        OPERATIONS
            .into_iter()
            .filter(|op| self.state.requires(*op))
            .map(|operation| AppliedMovement {
                req_id: req_id.to_owned(),
                system: self.system_of(operation),
                operation,
                user_id: self.user_id,
                asset: self.asset.clone(),
                amount: self.amount,
            })
            .collect()
    }
}

pub(super) fn op_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Withdraw => "withdraw",
        Operation::Deposit => "deposit",
        Operation::Refund => "refund",
    }
}

/// What is wrong with one applied movement given its transfer (`None`: nothing).
fn movement_problem(op: &AppliedMovement, t: &Known) -> Option<String> {
    let name = op_name(op.operation);
    let expected = t.system_of(op.operation);
    if op.system != expected {
        Some(format!(
            "{name} applied in {} instead of {}",
            op.system.as_str(),
            expected.as_str()
        ))
    } else if op.user_id != t.user_id || op.asset != t.asset || op.amount != t.amount {
        Some(format!("{name} applied with other user, asset or amount"))
    } else if !t.state.allows(op.operation) {
        Some(format!("{name} applied but the transfer is {}", t.state))
    } else {
        None
    }
}

/// Every movement under `req_id` its transfer's (later) events do not allow, or all of them
/// when it names no transfer.
pub(super) fn applied_disagreements(
    req_id: &str,
    applied: &[AppliedMovement],
    known: Option<&Known>,
    into: &mut Vec<Disagreement>,
) {
    let Some(t) = known else {
        if !applied.is_empty() {
            into.push(Disagreement {
                req_id: req_id.to_owned(),
                state: None,
                problem: "money moved under a req_id that names no transfer".into(),
            });
        }
        return;
    };
    for op in applied {
        if let Some(problem) = movement_problem(op, t) {
            into.push(Disagreement {
                req_id: req_id.to_owned(),
                state: Some(t.state.as_str().to_owned()),
                problem,
            });
        }
    }
}

/// Every movement the (earlier) events' state `before` requires that no record shows applied.
pub(super) fn missing_movements(
    req_id: &str,
    before: TransferState,
    applied: &[AppliedMovement],
    known: &Known,
    into: &mut Vec<Disagreement>,
) {
    for op in OPERATIONS {
        if before.requires(op) && !applied.iter().any(|a| a.operation == op) {
            into.push(Disagreement {
                req_id: req_id.to_owned(),
                state: Some(known.state.as_str().to_owned()),
                problem: format!(
                    "the events say {before}, but no {} was applied",
                    op_name(op)
                ),
            });
        }
    }
}

/// Settled: the transfer is terminal (no event will change what it requires or allows), its
/// `TransferCreated` is below the event-log watermark being stored (so a later run that meets it
/// again knows it was settled, see `audit::run`), and its applied movements are exactly one
/// correct movement per operation its state requires and nothing else. Such a transfer can
/// only disagree again if a new movement appears under its req_id, which a later run reads as
/// new work and checks against [`Known::settled_movements`] plus the new one.
pub(super) fn is_settled(
    known: Option<&Known>,
    applied: &[AppliedMovement],
    events_watermark: u64,
) -> bool {
    let Some(t) = known else { return false };
    t.state.is_terminal()
        && t.created_tx < events_watermark
        && applied.iter().all(|a| movement_problem(a, t).is_none())
        && OPERATIONS.into_iter().all(|op| {
            let n = applied.iter().filter(|a| a.operation == op).count();
            n == usize::from(t.state.requires(op))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(state: TransferState) -> Known {
        Known {
            user_id: 7,
            from: AccountType::Funding,
            to: AccountType::Spot,
            asset: "USDT".into(),
            amount: Decimal::new(5, 0),
            state,
            created_tx: 10,
        }
    }

    #[test]
    fn a_terminal_transfer_settles_only_with_exactly_its_required_movements() {
        for state in TransferState::TERMINAL {
            let t = known(state);
            let exact = t.settled_movements("r");
            assert!(is_settled(Some(&t), &exact, 11), "{state}");
            assert!(
                !is_settled(Some(&t), &exact, 10),
                "above the horizon: {state}"
            );
            let mut more = exact.clone();
            more.push(AppliedMovement {
                req_id: "r".into(),
                system: AccountType::Spot,
                operation: Operation::Refund,
                user_id: 7,
                asset: "USDT".into(),
                amount: Decimal::new(5, 0),
            });
            assert!(
                !is_settled(Some(&t), &more, 11),
                "an extra movement: {state}"
            );
            if !exact.is_empty() {
                assert!(
                    !is_settled(Some(&t), &exact[1..], 11),
                    "one missing: {state}"
                );
            }
        }
        let open = known(TransferState::SourceDone);
        assert!(!is_settled(Some(&open), &open.settled_movements("r"), 11));
        assert!(!is_settled(None, &[], 11));
    }

    #[test]
    fn settled_movements_pass_the_checks_they_stand_for() {
        for state in TransferState::TERMINAL {
            let t = known(state);
            let mut found = Vec::new();
            applied_disagreements("r", &t.settled_movements("r"), Some(&t), &mut found);
            missing_movements("r", state, &t.settled_movements("r"), &t, &mut found);
            assert!(found.is_empty(), "{state}: {found:?}");
        }
    }
}
