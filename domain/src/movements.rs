//! What a transfer's state says about the movements its account systems may have applied, the
//! other half of the transition table (`Transfer::decide`): the conservation check holds each
//! system's record of applied movements against these rules.

use crate::port::Operation;
use crate::transfer::TransferState;

impl TransferState {
    /// True when a transfer in this state must have had `operation` applied: the state is only
    /// reached by recording that movement's success (or an operator's confirmation of it).
    pub fn requires(self, operation: Operation) -> bool {
        use TransferState as S;
        match operation {
            Operation::Withdraw => matches!(
                self,
                S::SourceDone | S::TargetPending | S::Committed | S::Compensating | S::RolledBack
            ),
            Operation::Deposit => self == S::Committed,
            Operation::Refund => self == S::RolledBack,
        }
    }

    /// True when a transfer in this state may have had `operation` applied: the call has been
    /// announced (or its success recorded). A movement applied outside these states contradicts
    /// the events.
    pub fn allows(self, operation: Operation) -> bool {
        use TransferState as S;
        match operation {
            Operation::Withdraw => !matches!(self, S::Init | S::Failed),
            Operation::Deposit => matches!(self, S::TargetPending | S::Committed),
            Operation::Refund => matches!(self, S::Compensating | S::RolledBack),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransferState as S;

    const OPS: [Operation; 3] = Operation::ALL;

    #[test]
    fn what_is_required_is_always_allowed() {
        for state in TransferState::ALL {
            for op in OPS {
                if state.requires(op) {
                    assert!(state.allows(op), "{state} requires but refuses {op:?}");
                }
            }
        }
    }

    #[test]
    fn each_state_requires_exactly_the_movements_that_reached_it() {
        let required = |s: TransferState| -> Vec<Operation> {
            OPS.into_iter().filter(|op| s.requires(*op)).collect()
        };
        assert_eq!(required(S::Init), []);
        assert_eq!(required(S::SourcePending), []);
        assert_eq!(required(S::SourceDone), [Operation::Withdraw]);
        assert_eq!(required(S::TargetPending), [Operation::Withdraw]);
        assert_eq!(
            required(S::Committed),
            [Operation::Withdraw, Operation::Deposit]
        );
        assert_eq!(required(S::Failed), []);
        assert_eq!(required(S::Compensating), [Operation::Withdraw]);
        assert_eq!(
            required(S::RolledBack),
            [Operation::Withdraw, Operation::Refund]
        );
    }

    #[test]
    fn a_movement_is_allowed_only_once_announced() {
        let allowed = |s: TransferState| -> Vec<Operation> {
            OPS.into_iter().filter(|op| s.allows(*op)).collect()
        };
        assert_eq!(allowed(S::Init), []);
        assert_eq!(allowed(S::SourcePending), [Operation::Withdraw]);
        assert_eq!(allowed(S::SourceDone), [Operation::Withdraw]);
        assert_eq!(
            allowed(S::TargetPending),
            [Operation::Withdraw, Operation::Deposit]
        );
        assert_eq!(
            allowed(S::Committed),
            [Operation::Withdraw, Operation::Deposit]
        );
        assert_eq!(allowed(S::Failed), []);
        assert_eq!(
            allowed(S::Compensating),
            [Operation::Withdraw, Operation::Refund]
        );
        assert_eq!(
            allowed(S::RolledBack),
            [Operation::Withdraw, Operation::Refund]
        );
    }

    #[test]
    fn terminal_ids_are_listed_for_sql() {
        assert_eq!(TransferState::terminal_ids_sql(), "40, -10, -30");
    }
}
