//! One pass of the recovery worker: which transfers it takes (stale, due, not leased), how it
//! resumes each (the coordinator's lookup before any retry), and what it records (attempts,
//! backoff, the lease's release, alerts), including a worker that dies mid-drive.

use std::time::Duration;

use application::testkit::scenario::request;
use application::testkit::{AccountFault, Call, EventKind, Scenario, StoreCall, StoreFault};
use application::Clock;
use domain::{AccountType, Operation, TransferState as S};
use recovery::worker::PassReport;

use crate::{config, report, WorkerScenario};

const FUNDING: AccountType = AccountType::Funding;
const SPOT: AccountType = AccountType::Spot;

fn finished_one() -> PassReport {
    PassReport {
        driven: 1,
        finished: 1,
        alerts: 0,
    }
}

#[test]
fn a_pass_finishes_a_transfer_left_in_each_open_state() {
    let ends = [
        (S::Init, S::Committed),
        (S::SourcePending, S::Committed),
        (S::SourceDone, S::Committed),
        (S::TargetPending, S::Committed),
        (S::Compensating, S::RolledBack),
    ];
    for (left, end) in ends {
        let w = WorkerScenario::left_in(Scenario::new(), left);
        let then = w.when_pass();
        assert_eq!(report(&then), finished_one(), "from {left}");
        then.state(end);
        let attempts = w.attempts();
        assert_eq!(attempts.len(), 1, "from {left}");
        assert_eq!(attempts[0].state_before, left);
        assert_eq!(attempts[0].outcome, Some("TERMINAL"));
        let row = w.retry_row();
        assert_eq!(row.lease_owner, None, "lease released");
        assert_eq!(row.attempts, 1);
    }
}

#[test]
fn a_pass_looks_up_before_it_retries_and_never_repeats_an_applied_call() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_applied(FUNDING, Operation::Withdraw),
        S::SourcePending,
    );
    let then = w.when_pass();
    assert_eq!(report(&then), finished_one());
    then.appended(&[
        EventKind::SourceWithdrawn,
        EventKind::TargetDepositStarted,
        EventKind::TransferCommitted,
    ])
    .funding_calls(&[Call::Lookup(Operation::Withdraw)])
    .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
    .balances("90", Some("10"));
}

#[test]
fn a_transfer_not_yet_stale_is_left_to_its_request() {
    let given = Scenario::new().given_transfer_in(S::SourcePending);
    let w = WorkerScenario::new(given);
    let then = w.when_pass();
    assert_eq!(report(&then), PassReport::default());
    then.nothing_appended().funding_calls(&[]).spot_calls(&[]);
    assert!(w.attempts().is_empty());
}

#[test]
fn terminal_transfers_are_never_due() {
    for state in [S::Committed, S::Failed, S::RolledBack] {
        let w = WorkerScenario::left_in(Scenario::new(), state);
        let then = w.when_pass();
        assert_eq!(report(&then), PassReport::default(), "{state}");
        then.nothing_appended().funding_calls(&[]).spot_calls(&[]);
    }
}

#[test]
fn an_unknown_outcome_is_recorded_and_retried_after_its_backoff() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_fault_always(SPOT, Call::Deposit, AccountFault::Unavailable),
        S::TargetPending,
    );
    let then = w.when_pass();
    assert_eq!(
        report(&then),
        PassReport {
            driven: 1,
            finished: 0,
            alerts: 0
        }
    );
    then.nothing_appended()
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .state(S::TargetPending);
    let attempt = &w.attempts()[0];
    assert_eq!(
        (attempt.outcome, attempt.category),
        (Some("UNKNOWN"), Some(recovery::worker::NETWORK))
    );

    // Not due again before its backoff: the next pass leaves it alone.
    let then = w.when_pass();
    then.nothing_appended().spot_calls(&[]);

    // The account system is back, the backoff has passed: the retry looks up first.
    w.given.world.spot.faults.heal_all();
    w.wait(Duration::from_millis(config().backoff_ms(1)));
    let then = w.when_pass();
    assert_eq!(report(&then), finished_one());
    then.appended(&[EventKind::TransferCommitted])
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .balances("90", Some("10"));
    assert_eq!(w.retry_row().attempts, 2);
}

#[test]
fn the_backoff_doubles_per_attempt_up_to_its_cap() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_fault_always(SPOT, Call::Deposit, AccountFault::Unavailable),
        S::TargetPending,
    );
    let mut delays = Vec::new();
    for _ in 0..6 {
        let now = w.given.world.clock().now_ms();
        let then = w.when_pass();
        assert_eq!(report(&then).driven, 1);
        let next = w.retry_row().next_retry_at_ms;
        delays.push(next - now);
        w.wait(Duration::from_millis(next - now));
    }
    assert_eq!(delays, [500, 1_000, 2_000, 4_000, 8_000, 8_000]);
}

#[test]
fn a_transfer_leased_by_another_worker_is_skipped_until_the_lease_ends() {
    let w = WorkerScenario::left_in(Scenario::new(), S::SourcePending);
    let lease_until = w.given.world.clock().now_ms() + 30_000;
    w.given.world.store.rows().retries.insert(
        application::testkit::scenario::given_req_id(),
        application::testkit::RetryRow {
            state: Some(S::SourcePending),
            next_retry_at_ms: 0,
            lease_owner: Some("another".to_owned()),
            lease_until_ms: Some(lease_until),
            ..Default::default()
        },
    );
    let then = w.when_pass();
    assert_eq!(report(&then), PassReport::default());
    then.nothing_appended().funding_calls(&[]);

    w.wait(Duration::from_secs(31));
    let then = w.when_pass();
    assert_eq!(report(&then), finished_one());
    then.state(S::Committed);
}

#[test]
fn a_worker_that_dies_mid_drive_keeps_the_lease_until_it_ends_then_another_finishes() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_fault(SPOT, Call::Deposit, AccountFault::CrashAfter),
        S::TargetPending,
    );
    // The deposit is applied, then the worker process dies before it records anything.
    let then = w.when_pass();
    then.crashed()
        .nothing_appended()
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit]);
    assert_eq!(w.attempts()[0].outcome, None, "the attempt never ended");
    assert!(
        w.retry_row().lease_owner.is_some(),
        "the dead worker's lease"
    );

    // Another worker, while the dead one's lease lasts: nothing.
    let then = w.when_pass();
    assert_eq!(report(&then), PassReport::default());
    then.spot_calls(&[]);

    // Once it has expired: taken, looked up, committed without a second deposit (and, a
    // minute in TARGET_PENDING by then, alerted as stuck first).
    w.wait(config().lease + Duration::from_secs(1));
    let then = w.when_pass();
    assert_eq!(
        report(&then),
        PassReport {
            alerts: 1,
            ..finished_one()
        }
    );
    then.appended(&[EventKind::TransferCommitted])
        .spot_calls(&[Call::Lookup(Operation::Deposit)])
        .balances("90", Some("10"));
}

#[test]
fn a_refused_refund_stays_compensating_and_is_alerted_at_once() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_fault_always(
            FUNDING,
            Call::Refund,
            AccountFault::Refuse("ACCOUNT_DISABLED".to_owned()),
        ),
        S::Compensating,
    );
    let then = w.when_pass();
    then.nothing_appended().state(S::Compensating);
    let row = w.retry_row();
    assert_eq!(row.refund_failures, 1);
    assert!(row.refund_alerted, "MON-002 at once for a refusal");
    assert_eq!(
        row.last_error_category,
        Some(recovery::worker::REFUSED_BY_TARGET)
    );
}

#[test]
fn a_refund_that_keeps_failing_is_alerted_after_the_threshold() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_fault_always(FUNDING, Call::Refund, AccountFault::Unavailable),
        S::Compensating,
    );
    let mut alerted = Vec::new();
    for _ in 0..3 {
        w.when_pass().nothing_appended();
        alerted.push(w.retry_row().refund_alerted);
        w.wait(Duration::from_millis(config().backoff_ms_max));
    }
    assert_eq!(alerted, [false, false, true]);
    assert_eq!(w.retry_row().refund_failures, 3);
}

#[test]
fn a_transfer_stuck_in_target_pending_is_alerted_once() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_fault_always(SPOT, Call::Deposit, AccountFault::Unavailable),
        S::TargetPending,
    );
    w.wait(config().target_pending_alert_after);
    let first = w.when_pass();
    assert_eq!(report(&first).alerts, 1);
    w.wait(Duration::from_millis(config().backoff_ms_max));
    let second = w.when_pass();
    assert_eq!(report(&second).alerts, 0);
    assert!(w.retry_row().stuck_alerted);
}

#[test]
fn a_store_error_mid_drive_is_an_error_attempt_with_backoff() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_store_fault(StoreCall::Append(S::Committed), StoreFault::FailBefore),
        S::TargetPending,
    );
    let then = w.when_pass();
    then.nothing_appended()
        .spot_calls(&[Call::Lookup(Operation::Deposit), Call::Deposit])
        .state(S::TargetPending);
    let attempt = &w.attempts()[0];
    assert_eq!(attempt.outcome, Some("ERROR"));
    assert!(w.retry_row().next_retry_at_ms > w.given.world.clock().now_ms());

    w.wait(Duration::from_millis(config().backoff_ms(1)));
    let then = w.when_pass();
    assert_eq!(report(&then), finished_one());
    then.spot_calls(&[Call::Lookup(Operation::Deposit)])
        .balances("90", Some("10"));
}

#[test]
fn a_pass_whose_book_cannot_answer_fails_and_touches_nothing() {
    let w = WorkerScenario::left_in(
        Scenario::new().given_store_fault(StoreCall::RetryBook, StoreFault::FailBefore),
        S::SourcePending,
    );
    let then = w.when_pass();
    assert!(then.answer().is_err());
    then.nothing_appended().funding_calls(&[]);
}

#[test]
fn one_pass_drives_every_due_transfer() {
    // Three requests left SOURCE_PENDING by an unreachable FUNDING.
    let given = Scenario::new();
    given
        .world
        .funding
        .faults
        .arm_always(Call::Withdraw, AccountFault::Unavailable);
    for _ in 0..3 {
        given.when_submit(request(None)).answered(S::SourcePending);
    }
    given.world.funding.faults.heal_all();
    let w = WorkerScenario::new(given);
    w.wait(config().stale_after);
    let then = w.when_pass();
    assert_eq!(
        report(&then),
        PassReport {
            driven: 3,
            finished: 3,
            alerts: 0
        }
    );
    then.balances("70", Some("30"));
    assert_eq!(w.book.rows().heartbeats, 1);
}
