//! Manual resolution (`Coordinator::manually_resolve`): the table's ManuallyResolve rows, each
//! taken only where the account system's record backs the operator, then driven on.

use application::{ManualResolutionError, Resumed};
use domain::{Resolution, TransferState as S};

use crate::prelude::*;

type Answer = Result<Resumed, ManualResolutionError>;

fn resolve(given: &Scenario, resolution: Resolution) -> application::testkit::Then<'_, Answer> {
    let req_id = given_req_id();
    given.when(|c| async move {
        c.manually_resolve(&req_id, resolution, "ops", "checked by hand", false)
            .await
    })
}

fn ended(answer: &Answer) -> Option<S> {
    answer.as_ref().ok().map(|r| r.data.state)
}

#[test]
fn source_pending_applied_goes_to_source_done_and_on_to_the_deposit() {
    let given = Scenario::new()
        .given_transfer_in(S::SourcePending)
        .given_applied(FUNDING, Operation::Withdraw);
    let then = resolve(&given, Resolution::Applied);
    assert_eq!(ended(then.answer()), Some(S::Committed));
    then.appended(&[
        TransferManuallyResolved,
        TargetDepositStarted,
        TransferCommitted,
    ])
    .funding_calls(&[Call::Lookup(Operation::Withdraw)])
    .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
    .balances("90", Some("10"));
}

#[test]
fn source_pending_not_applied_cancels_the_withdraw_and_fails() {
    let given = Scenario::new().given_transfer_in(S::SourcePending);
    let then = resolve(&given, Resolution::NotApplied);
    assert_eq!(ended(then.answer()), Some(S::Failed));
    then.appended(&[TransferManuallyResolved])
        .funding_calls(&[Call::Cancel(Operation::Withdraw)])
        .balances("100", None);
}

#[test]
fn target_pending_applied_commits() {
    let given = Scenario::new()
        .given_transfer_in(S::TargetPending)
        .given_applied(SPOT, Operation::Deposit);
    let then = resolve(&given, Resolution::Applied);
    assert_eq!(ended(then.answer()), Some(S::Committed));
    then.appended(&[TransferManuallyResolved])
        .spot_calls(&[Call::Lookup(Operation::Deposit)]);
}

#[test]
fn target_pending_not_applied_compensates_and_refunds() {
    let given = Scenario::new().given_transfer_in(S::TargetPending);
    let then = resolve(&given, Resolution::NotApplied);
    assert_eq!(ended(then.answer()), Some(S::RolledBack));
    then.appended(&[TransferManuallyResolved, TransferRolledBack])
        .spot_calls(&[Call::Cancel(Operation::Deposit)])
        .funding_calls(&[Call::Lookup(Operation::Refund), Call::Refund])
        .balances("100", None);
}

#[test]
fn compensating_applied_rolls_back() {
    let given = Scenario::new()
        .given_transfer_in(S::Compensating)
        .given_applied(FUNDING, Operation::Refund);
    let then = resolve(&given, Resolution::Applied);
    assert_eq!(ended(then.answer()), Some(S::RolledBack));
    then.appended(&[TransferManuallyResolved]);
}

#[test]
fn compensating_not_applied_proves_nothing_and_is_refused() {
    let given = Scenario::new().given_transfer_in(S::Compensating);
    let then = resolve(&given, Resolution::NotApplied);
    assert!(matches!(
        then.answer(),
        Err(ManualResolutionError::Refused(_))
    ));
    then.nothing_appended().funding_calls(&[]);
}

#[test]
fn a_claim_the_records_contradict_is_refused_and_recorded_nowhere() {
    let given = Scenario::new().given_transfer_in(S::SourcePending);
    let then = resolve(&given, Resolution::Applied);
    assert!(matches!(
        then.answer(),
        Err(ManualResolutionError::Contradicted(_))
    ));
    then.nothing_appended()
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .state(S::SourcePending);
}

#[test]
fn states_without_a_pending_call_are_refused() {
    for state in [S::SourceDone, S::Committed, S::Failed, S::RolledBack] {
        let given = Scenario::new().given_transfer_in(state);
        let then = resolve(&given, Resolution::Applied);
        assert!(
            matches!(then.answer(), Err(ManualResolutionError::Refused(_))),
            "{state}: {:?}",
            then.answer()
        );
        then.nothing_appended().funding_calls(&[]).spot_calls(&[]);
    }
}
