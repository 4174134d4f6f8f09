//! A new transfer through `Coordinator::submit`: every effect of the transition table that a
//! first drive meets, and the coordinator's own refusals before anything is created.

use application::NewTransfer;
use domain::{AssetSymbol, TransferData};

use crate::prelude::*;

#[test]
fn success_withdraws_then_deposits_and_commits() {
    Scenario::new()
        .when_submit(request(None))
        .answered(TransferState::Committed)
        .appended(&HAPPY)
        .funding_calls(&[Call::Withdraw])
        .spot_calls(&[Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn the_first_commit_holds_the_creation_and_the_withdraws_announcement() {
    // Three event commits for a happy transfer: nothing is called before its announcement.
    let given = Scenario::new().given_fault(FUNDING, Call::Withdraw, AccountFault::CrashBefore);
    let then = given.when_submit(request(None));
    then.crashed()
        .appended(&[TransferCreated, SourceWithdrawStarted]);
}

#[test]
fn refusal_at_source_fails_the_transfer_and_calls_no_target() {
    Scenario::new()
        .given_funding_balance("5")
        .when_submit(request(None))
        .answered(TransferState::Failed)
        .appended(&[TransferCreated, SourceWithdrawStarted, TransferFailed])
        .funding_calls(&[Call::Withdraw])
        .spot_calls(&[])
        .balances("5", None);
}

#[test]
fn a_frozen_source_refuses_and_its_code_is_the_failure() {
    let given = Scenario::new();
    given.world.funding.set_status(
        user(),
        &request(None).asset,
        application::testkit::Status::Frozen,
    );
    let then = given.when_submit(request(None));
    then.answered(TransferState::Failed)
        .funding_calls(&[Call::Withdraw])
        .spot_calls(&[]);
    let failure = then.answer().as_ref().map(|d| d.failure.clone());
    assert_eq!(
        failure.unwrap().map(|(code, _)| code).as_deref(),
        Some("ACCOUNT_FROZEN")
    );
}

#[test]
fn refusal_at_target_compensates_refunds_and_rolls_back() {
    Scenario::new()
        .given_fault(SPOT, Call::Deposit, refuse("ACCOUNT_DISABLED"))
        .when_submit(request(None))
        .answered(TransferState::RolledBack)
        .appended(&[
            TransferCreated,
            SourceWithdrawStarted,
            SourceWithdrawn,
            TargetDepositStarted,
            CompensationStarted,
            TransferRolledBack,
        ])
        .funding_calls(&[Call::Withdraw, Call::Refund])
        .spot_calls(&[Call::Deposit])
        .balances("100", None);
}

#[test]
fn unknown_withdraw_outcome_records_nothing_and_the_transfer_stays_source_pending() {
    Scenario::new()
        .given_fault(FUNDING, Call::Withdraw, AccountFault::Unavailable)
        .when_submit(request(None))
        .answered(TransferState::SourcePending)
        .appended(&[TransferCreated, SourceWithdrawStarted])
        .funding_calls(&[Call::Withdraw])
        .spot_calls(&[])
        .balances("100", None);
}

#[test]
fn a_lost_withdraw_answer_is_unknown_too_though_the_money_left() {
    Scenario::new()
        .given_fault(FUNDING, Call::Withdraw, AccountFault::AnswerLost)
        .when_submit(request(None))
        .answered(TransferState::SourcePending)
        .appended(&[TransferCreated, SourceWithdrawStarted])
        .spot_calls(&[])
        .balances("90", None);
}

#[test]
fn an_unknown_outcome_is_resumed_later_with_a_lookup_before_any_retry() {
    let given = Scenario::new().given_fault(FUNDING, Call::Withdraw, AccountFault::AnswerLost);
    let first = given.when_submit(request(None));
    first.answered(TransferState::SourcePending);
    given
        .when_resume_of(first.req_id())
        .finished(TransferState::Committed)
        .appended(&HAPPY[2..])
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn unknown_deposit_outcome_stays_target_pending_and_is_never_compensated() {
    Scenario::new()
        .given_fault(SPOT, Call::Deposit, AccountFault::AnswerLost)
        .when_submit(request(None))
        .answered(TransferState::TargetPending)
        .appended(&HAPPY[..4])
        .funding_calls(&[Call::Withdraw])
        .spot_calls(&[Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn unknown_refund_outcome_stays_compensating() {
    Scenario::new()
        .given_fault(SPOT, Call::Deposit, refuse("ACCOUNT_DISABLED"))
        .given_fault(FUNDING, Call::Refund, AccountFault::Unavailable)
        .when_submit(request(None))
        .answered(TransferState::Compensating)
        .appended(&[
            TransferCreated,
            SourceWithdrawStarted,
            SourceWithdrawn,
            TargetDepositStarted,
            CompensationStarted,
        ])
        .funding_calls(&[Call::Withdraw, Call::Refund])
        .balances("90", None);
}

#[test]
fn a_refused_request_creates_nothing_and_calls_nobody() {
    let cases: [(NewTransfer, ErrorCode); 3] = [
        (
            NewTransfer {
                to: FUNDING,
                ..request(None)
            },
            ErrorCode::SameAccount,
        ),
        (
            NewTransfer {
                asset: AssetSymbol::parse("DOGE").unwrap(),
                ..request(None)
            },
            ErrorCode::InvalidAsset,
        ),
        (
            request(Some("not a key!")),
            ErrorCode::InvalidIdempotencyKey,
        ),
    ];
    for (request, code) in cases {
        Scenario::new()
            .when_submit(request)
            .refused(code)
            .nothing_appended()
            .funding_calls(&[])
            .spot_calls(&[]);
    }
}

#[test]
fn a_batch_drives_each_transfer_on_its_own_outcome() {
    // The second asks for more than is left after the first: refused at the source alone.
    let given = Scenario::new().given_funding_balance("15");
    let then =
        given.when(|c| async move { c.submit_many(vec![request(None), request(None)]).await });
    let states: Vec<_> = then
        .answer()
        .iter()
        .map(|a| a.as_ref().map(|d: &TransferData| d.state))
        .collect();
    assert_eq!(
        states,
        [Ok(TransferState::Committed), Ok(TransferState::Failed)]
    );
    then.funding_calls(&[Call::Withdraw, Call::Withdraw])
        .spot_calls(&[Call::Deposit])
        .balances("5", Some("10"));
}
