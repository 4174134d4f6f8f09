//! Crash points: a process dropped between two durable steps (a crash fault makes a call that
//! never answers, and the executor drops the process there), and store writes whose outcome is
//! unknown. The ports' state survives; a new process resumes and finishes, each movement applied
//! once.

use domain::TransferState as S;

use crate::prelude::*;

/// Submits the standard request in a process that crashes at the armed fault, then resumes its
/// transfer in a new process; returns the scenario and the transfer's req_id.
fn crash_then_resume(given: Scenario) -> (Scenario, domain::ReqId) {
    let then = given.when_submit(request(None));
    then.crashed();
    let req_id = only_transfer(&given);
    (given, req_id)
}

fn only_transfer(given: &Scenario) -> domain::ReqId {
    let rows = given.world.store.rows();
    let mut ids = rows.streams.keys();
    let id = *ids.next().expect("a transfer was created");
    assert!(ids.next().is_none(), "one transfer");
    id
}

#[test]
fn crash_before_the_withdraw_leaves_it_announced_and_a_new_process_finishes() {
    let given = Scenario::new().given_fault(FUNDING, Call::Withdraw, AccountFault::CrashBefore);
    let (given, req_id) = crash_then_resume(given);
    assert_eq!(given.world.state(req_id), Some(S::SourcePending));
    given
        .when_resume_of(req_id)
        .finished(S::Committed)
        .appended(&HAPPY[2..])
        .funding_calls(&[Call::Lookup(Operation::Withdraw), Call::Withdraw])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn crash_after_the_withdraw_is_applied_resumes_by_lookup_without_a_second_withdraw() {
    let given = Scenario::new().given_fault(FUNDING, Call::Withdraw, AccountFault::CrashAfter);
    let (given, req_id) = crash_then_resume(given);
    assert_eq!(given.world.state(req_id), Some(S::SourcePending));
    given
        .when_resume_of(req_id)
        .finished(S::Committed)
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .balances("90", Some("10"));
}

#[test]
fn crash_before_the_withdrawn_commit_resumes_by_lookup() {
    let given = Scenario::new()
        .given_store_fault(StoreCall::Append(S::TargetPending), StoreFault::CrashBefore);
    let (given, req_id) = crash_then_resume(given);
    assert_eq!(given.world.state(req_id), Some(S::SourcePending));
    given
        .when_resume_of(req_id)
        .finished(S::Committed)
        .appended(&HAPPY[2..])
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .balances("90", Some("10"));
}

#[test]
fn crash_after_the_withdrawn_commit_leaves_the_deposit_announced_and_never_called() {
    let given = Scenario::new()
        .given_store_fault(StoreCall::Append(S::TargetPending), StoreFault::CrashAfter);
    let then = given.when_submit(request(None));
    then.crashed().appended(&HAPPY[..4]).spot_calls(&[]);
    let req_id = only_transfer(&given);
    given
        .when_resume_of(req_id)
        .finished(S::Committed)
        .appended(&[TransferCommitted])
        .funding_calls(&[])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn crash_after_the_deposit_is_applied_commits_without_a_second_deposit() {
    let given = Scenario::new().given_fault(SPOT, Call::Deposit, AccountFault::CrashAfter);
    let (given, req_id) = crash_then_resume(given);
    assert_eq!(given.world.state(req_id), Some(S::TargetPending));
    given
        .when_resume_of(req_id)
        .finished(S::Committed)
        .spot_calls(&[Call::Lookup(Operation::Deposit)])
        .balances("90", Some("10"));
}

#[test]
fn crash_after_the_compensation_commit_refunds_in_the_next_process() {
    let given = Scenario::new()
        .given_fault(SPOT, Call::Deposit, refuse("ACCOUNT_DISABLED"))
        .given_store_fault(StoreCall::Append(S::Compensating), StoreFault::CrashAfter);
    let (given, req_id) = crash_then_resume(given);
    assert_eq!(given.world.state(req_id), Some(S::Compensating));
    given
        .when_resume_of(req_id)
        .finished(S::RolledBack)
        .appended(&[TransferRolledBack])
        .funding_calls(&[Call::Lookup(Operation::Refund), Call::Refund])
        .spot_calls(&[])
        .balances("100", None);
}

#[test]
fn crash_after_the_refund_is_applied_rolls_back_without_a_second_refund() {
    let given = Scenario::new()
        .given_fault(SPOT, Call::Deposit, refuse("ACCOUNT_DISABLED"))
        .given_fault(FUNDING, Call::Refund, AccountFault::CrashAfter);
    let (given, req_id) = crash_then_resume(given);
    assert_eq!(given.world.state(req_id), Some(S::Compensating));
    given
        .when_resume_of(req_id)
        .finished(S::RolledBack)
        .funding_calls(&[Call::Lookup(Operation::Refund)])
        .balances("100", None);
}

#[test]
fn crash_before_the_creation_commit_leaves_nothing() {
    let given = Scenario::new()
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::CrashBefore);
    given
        .when_submit(request(None))
        .crashed()
        .nothing_appended()
        .funding_calls(&[])
        .spot_calls(&[]);
}

/// The separate steps (a log without claims of its own, ADR 0022): the claim is durable before
/// the creation, so a crash between them leaves an orphan claim. (Written together, a crash
/// before the write leaves nothing: `together.rs`.)
#[test]
fn a_repeat_after_a_crash_before_creation_creates_under_the_claimed_req_id() {
    let given = Scenario::new()
        .given_log_apart()
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::CrashBefore);
    given.when_submit(request(Some("c1"))).crashed();
    let claimed = given.world.store.rows().claims.values().next().cloned();
    let claimed = claimed
        .expect("the cid was claimed before the crash")
        .req_id;
    let then = given.when_submit(request(Some("c1")));
    then.answered(S::Committed).appended(&HAPPY);
    assert_eq!(then.req_id(), claimed);
}

#[test]
fn a_repeat_after_a_crash_after_creation_answers_the_transfer_as_it_stands() {
    let given = Scenario::new()
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::CrashAfter);
    given.when_submit(request(Some("c1"))).crashed();
    given
        .when_submit(request(Some("c1")))
        .answered(S::SourcePending)
        .nothing_appended()
        .funding_calls(&[]);
}

#[test]
fn a_lost_commit_answer_stops_the_drive_and_answers_the_durable_state() {
    // The SourceWithdrawn commit is durable but its answer is lost: the drive stops without
    // calling the target on a guess, and the request answers what the log holds (once created,
    // a request always gets its transfer back, never an error inviting a second one).
    let given = Scenario::new()
        .given_store_fault(StoreCall::Append(S::TargetPending), StoreFault::FailAfter);
    let then = given.when_submit(request(None));
    then.answered(S::TargetPending)
        .appended(&HAPPY[..4])
        .spot_calls(&[]);
    let req_id = only_transfer(&given);
    given
        .when_resume_of(req_id)
        .finished(S::Committed)
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn a_failed_commit_leaves_the_call_unrecorded_and_the_lookup_finds_it() {
    let given = Scenario::new()
        .given_store_fault(StoreCall::Append(S::TargetPending), StoreFault::FailBefore);
    let then = given.when_submit(request(None));
    then.answered(S::SourcePending)
        .appended(&HAPPY[..2])
        .funding_calls(&[Call::Withdraw])
        .spot_calls(&[]);
    let req_id = only_transfer(&given);
    given
        .when_resume_of(req_id)
        .finished(S::Committed)
        .funding_calls(&[Call::Lookup(Operation::Withdraw)])
        .balances("90", Some("10"));
}

#[test]
fn a_store_that_cannot_load_leaves_the_transfer_untouched() {
    Scenario::new()
        .given_transfer_in(S::TargetPending)
        .given_store_fault(StoreCall::Load, StoreFault::FailBefore)
        .when_resume()
        .failed()
        .nothing_appended()
        .spot_calls(&[])
        .state(S::TargetPending);
}
