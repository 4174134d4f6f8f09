//! A creation written with its client key's claim and its daily charge (ADR 0022): all three
//! durable together or none of them, whatever the write meets; and the separate steps, kept for
//! a log without claims and counters of its own, still hold their own rules.

use std::collections::BTreeMap;

use application::DailyLimits;
use domain::TransferState as S;

use crate::prelude::*;

/// The one transfer the scenario's log holds.
fn only(given: &Scenario) -> domain::ReqId {
    let rows = given.world.store.rows();
    assert_eq!(rows.streams.len(), 1, "one transfer");
    *rows.streams.keys().next().expect("one transfer")
}

fn count_max(n: u64) -> DailyLimits {
    DailyLimits {
        count_max: Some(n),
        amount_max: BTreeMap::new(),
    }
}

#[test]
fn a_creation_is_claimed_and_charged_with_it() {
    let given = Scenario::new().given_daily_limits(count_max(5));
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed)
        .appended(&HAPPY)
        .claimed("c1", true)
        .charged(1);
}

#[test]
fn a_creation_a_limit_refuses_leaves_neither_its_claim_nor_a_charge() {
    let given = Scenario::new().given_daily_limits(count_max(1));
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed);
    given
        .when_submit(request(Some("c2")))
        .refused(ErrorCode::DailyLimitExceeded)
        .nothing_appended()
        .funding_calls(&[])
        .claimed("c2", false)
        .charged(1);
}

#[test]
fn a_write_that_failed_before_its_effect_leaves_nothing_and_the_retry_creates_once() {
    let given = Scenario::new()
        .given_daily_limits(count_max(5))
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::FailBefore);
    given
        .when_submit(request(Some("c1")))
        .failed()
        .nothing_appended()
        .claimed("c1", false)
        .charged(0);
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed)
        .appended(&HAPPY)
        .claimed("c1", true)
        .charged(1);
}

#[test]
fn a_write_whose_answer_was_lost_holds_all_three_and_the_repeat_finds_it() {
    let given = Scenario::new()
        .given_daily_limits(count_max(5))
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::FailAfter);
    let first = given.when_submit(request(Some("c1")));
    first
        .failed()
        .appended(&HAPPY[..2])
        .claimed("c1", true)
        .charged(1);
    // The recovery worker finishes it; the repeat is answered with it and creates nothing.
    given.when_resume_of(only(&given)).finished(S::Committed);
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed)
        .nothing_appended()
        .charged(1);
}

#[test]
fn a_crash_before_the_write_leaves_nothing() {
    let given = Scenario::new()
        .given_daily_limits(count_max(5))
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::CrashBefore);
    given
        .when_submit(request(Some("c1")))
        .crashed()
        .nothing_appended()
        .claimed("c1", false)
        .charged(0);
}

#[test]
fn a_crash_after_the_write_leaves_all_three_and_no_call() {
    let given = Scenario::new()
        .given_daily_limits(count_max(5))
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::CrashAfter);
    given
        .when_submit(request(Some("c1")))
        .crashed()
        .appended(&HAPPY[..2])
        .funding_calls(&[])
        .claimed("c1", true)
        .charged(1);
    given.when_resume_of(only(&given)).finished(S::Committed);
}

#[test]
fn the_separate_steps_keep_a_refused_requests_claim_and_its_retry_creates_once() {
    let given = Scenario::new()
        .given_log_apart()
        .given_daily_limits(count_max(1));
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed)
        .claimed("c1", true)
        .charged(1);
    given
        .when_submit(request(Some("c2")))
        .refused(ErrorCode::DailyLimitExceeded)
        .nothing_appended()
        .claimed("c2", true)
        .charged(1);
}

#[test]
fn the_separate_steps_answer_a_repeat_with_the_first_transfer() {
    let given = Scenario::new()
        .given_log_apart()
        .given_daily_limits(count_max(5));
    let first = given.when_submit(request(Some("c1")));
    first.answered(S::Committed).charged(1);
    let again = given.when_submit(request(Some("c1")));
    again.answered(S::Committed).nothing_appended().charged(1);
    assert_eq!(again.req_id(), first.req_id());
}
