//! `Coordinator::resume` (the recovery worker's drive) of a transfer some process left in each
//! open state: every pending call is looked up before it is retried, and a recorded decision is
//! taken as the call's answer without a new call. Terminal states are left alone.

use domain::{Movement, Recorded, TransferState as S};

use crate::prelude::*;

#[test]
fn from_init_announces_the_withdraw_then_goes_all_the_way() {
    Scenario::new()
        .given_transfer_in(S::Init)
        .when_resume()
        .finished(S::Committed)
        .appended(&HAPPY[1..])
        .funding_calls(&[Call::Lookup(Operation::Withdraw), Call::Withdraw])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn from_source_pending_never_called_looks_up_then_withdraws() {
    Scenario::new()
        .given_transfer_in(S::SourcePending)
        .when_resume()
        .finished(S::Committed)
        .appended(&HAPPY[2..])
        .funding_calls(&[Call::Lookup(Operation::Withdraw), Call::Withdraw])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn from_source_pending_applied_records_the_withdraw_without_a_second_call() {
    Scenario::new()
        .given_transfer_in(S::SourcePending)
        .given_applied(FUNDING, Operation::Withdraw)
        .when_resume()
        .finished(S::Committed)
        .appended(&HAPPY[2..])
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn from_source_pending_refused_fails_without_a_second_call() {
    Scenario::new()
        .given_transfer_in(S::SourcePending)
        .given_decided(FUNDING, Operation::Withdraw, Some("INSUFFICIENT_BALANCE"))
        .when_resume()
        .finished(S::Failed)
        .appended(&[TransferFailed])
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .spot_calls(&[])
        .balances("100", None);
}

#[test]
fn a_lookup_that_cannot_answer_falls_back_to_the_idempotent_call() {
    // The withdraw was applied; the repeat is answered from the journal, applied once.
    Scenario::new()
        .given_transfer_in(S::SourcePending)
        .given_applied(FUNDING, Operation::Withdraw)
        .given_fault(
            FUNDING,
            Call::Lookup(Operation::Withdraw),
            AccountFault::Unavailable,
        )
        .when_resume()
        .finished(S::Committed)
        .funding_calls(&[Call::Lookup(Operation::Withdraw), Call::Withdraw])
        .balances("90", Some("10"));
}

#[test]
fn a_req_id_recorded_for_another_movement_stays_open_and_is_never_retried() {
    let given = Scenario::new().given_transfer_in(S::SourcePending);
    let other = Movement {
        amount: domain::Amount::parse("11").unwrap(),
        ..movement(given_req_id())
    };
    given
        .world
        .funding
        .decide(Operation::Withdraw, &other, None);
    given
        .when_resume()
        .still_open(S::SourcePending, Operation::Withdraw)
        .nothing_appended()
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .spot_calls(&[]);
}

#[test]
fn from_source_done_announces_the_deposit_and_commits() {
    Scenario::new()
        .given_transfer_in(S::SourceDone)
        .when_resume()
        .finished(S::Committed)
        .appended(&HAPPY[3..])
        .funding_calls(&[])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn from_target_pending_never_called_looks_up_then_deposits() {
    Scenario::new()
        .given_transfer_in(S::TargetPending)
        .when_resume()
        .finished(S::Committed)
        .appended(&[TransferCommitted])
        .funding_calls(&[])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn from_target_pending_applied_commits_without_a_second_deposit() {
    Scenario::new()
        .given_transfer_in(S::TargetPending)
        .given_applied(SPOT, Operation::Deposit)
        .when_resume()
        .finished(S::Committed)
        .appended(&[TransferCommitted])
        .spot_calls(&[Call::Lookup(Operation::Deposit)])
        .balances("90", Some("10"));
}

#[test]
fn from_target_pending_refused_compensates_and_refunds() {
    Scenario::new()
        .given_transfer_in(S::TargetPending)
        .given_decided(SPOT, Operation::Deposit, Some("ACCOUNT_DISABLED"))
        .when_resume()
        .finished(S::RolledBack)
        .appended(&[CompensationStarted, TransferRolledBack])
        .spot_calls(&[Call::Lookup(Operation::Deposit)])
        .funding_calls(&[Call::Lookup(Operation::Refund), Call::Refund])
        .balances("100", None);
}

#[test]
fn from_target_pending_still_unreachable_stays_open() {
    Scenario::new()
        .given_transfer_in(S::TargetPending)
        .given_fault(
            SPOT,
            Call::Lookup(Operation::Deposit),
            AccountFault::Unavailable,
        )
        .given_fault(SPOT, Call::Deposit, AccountFault::Unavailable)
        .when_resume()
        .still_open(S::TargetPending, Operation::Deposit)
        .nothing_appended()
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit]);
}

#[test]
fn from_compensating_never_refunded_looks_up_then_refunds() {
    Scenario::new()
        .given_transfer_in(S::Compensating)
        .when_resume()
        .finished(S::RolledBack)
        .appended(&[TransferRolledBack])
        .funding_calls(&[Call::Lookup(Operation::Refund), Call::Refund])
        .spot_calls(&[])
        .balances("100", None);
}

#[test]
fn from_compensating_refunded_rolls_back_without_a_second_refund() {
    Scenario::new()
        .given_transfer_in(S::Compensating)
        .given_applied(FUNDING, Operation::Refund)
        .when_resume()
        .finished(S::RolledBack)
        .appended(&[TransferRolledBack])
        .funding_calls(&[Call::Lookup(Operation::Refund)])
        .balances("100", None);
}

#[test]
fn a_refund_is_never_given_up_even_when_refused() {
    let given = Scenario::new()
        .given_transfer_in(S::Compensating)
        .given_fault(FUNDING, Call::Refund, refuse("ACCOUNT_DISABLED"));
    given
        .when_resume()
        .still_open(S::Compensating, Operation::Refund)
        .nothing_appended();
    assert_eq!(
        given.world.funding.books().journal.len(),
        2,
        "the withdraw and the refused refund"
    );
}

#[test]
fn terminal_transfers_are_left_as_they_are() {
    for state in [S::Committed, S::Failed, S::RolledBack] {
        Scenario::new()
            .given_transfer_in(state)
            .when_resume()
            .finished(state)
            .nothing_appended()
            .funding_calls(&[])
            .spot_calls(&[]);
    }
}

#[test]
fn drive_without_lookup_repeats_the_idempotent_call() {
    // `drive` (a request's own drive) retries the call: the journal answers the repeat.
    Scenario::new()
        .given_transfer_in(S::TargetPending)
        .given_applied(SPOT, Operation::Deposit)
        .when_drive()
        .answered(S::Committed)
        .appended(&[TransferCommitted])
        .spot_calls(&[Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn resume_of_an_unknown_transfer_is_not_found() {
    let given = Scenario::new();
    let then = given.when_resume();
    assert_eq!(
        then.answer().as_ref().err(),
        Some(&application::CoordinatorError::NotFound)
    );
    then.nothing_appended().funding_calls(&[]);
}

#[test]
fn lookups_read_what_the_system_recorded() {
    // The testkit's own account system answers lookups from its journal.
    let given = Scenario::new().given_transfer_in(S::SourceDone);
    let m = movement(given_req_id());
    let recorded = application::testkit::run(async {
        use domain::AccountPort;
        given.world.funding.lookup(&m, Operation::Withdraw).await
    });
    assert_eq!(recorded, Some(Recorded::Applied));
}
