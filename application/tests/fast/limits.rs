//! The daily limits: a transfer past its user's count or amount for the UTC day is refused
//! before anything is created, a repeat is never charged, and a charge is given back when the
//! creation is known not to have happened.

use std::collections::BTreeMap;
use std::time::Duration;

use application::DailyLimits;
use domain::{AssetSymbol, TransferState as S};
use rust_decimal::Decimal;

use crate::prelude::*;

fn count_max(n: u64) -> DailyLimits {
    DailyLimits {
        count_max: Some(n),
        amount_max: BTreeMap::new(),
    }
}

#[test]
fn past_the_daily_count_a_request_is_refused_and_creates_nothing() {
    let given = Scenario::new().given_daily_limits(count_max(1));
    given.when_submit(request(None)).answered(S::Committed);
    given
        .when_submit(request(None))
        .refused(ErrorCode::DailyLimitExceeded)
        .nothing_appended()
        .funding_calls(&[])
        .spot_calls(&[])
        .balances("90", Some("10"));
}

#[test]
fn past_the_daily_amount_a_request_is_refused() {
    let limits = DailyLimits {
        count_max: None,
        amount_max: BTreeMap::from([(AssetSymbol::parse("USDT").unwrap(), Decimal::from(15))]),
    };
    let given = Scenario::new().given_daily_limits(limits);
    given.when_submit(request(None)).answered(S::Committed);
    given
        .when_submit(request(None))
        .refused(ErrorCode::DailyAmountExceeded)
        .nothing_appended();
}

#[test]
fn the_counters_roll_over_at_utc_midnight() {
    let given = Scenario::new().given_daily_limits(count_max(1));
    given.when_submit(request(None)).answered(S::Committed);
    given.world.clock().advance(Duration::from_secs(24 * 3600));
    given
        .when_submit(request(None))
        .answered(S::Committed)
        .appended(&HAPPY);
}

#[test]
fn a_repeat_of_a_key_is_answered_without_a_charge() {
    let given = Scenario::new().given_daily_limits(count_max(1));
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed);
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed)
        .nothing_appended();
}

#[test]
fn a_refused_source_still_counts_against_the_day() {
    // The charge is for the transfer created, whatever its end.
    let given = Scenario::new()
        .given_daily_limits(count_max(1))
        .given_funding_balance("5");
    given.when_submit(request(None)).answered(S::Failed);
    given
        .when_submit(request(None))
        .refused(ErrorCode::DailyLimitExceeded);
}

#[test]
fn a_creation_known_not_to_have_happened_gives_its_charge_back() {
    let given = Scenario::new()
        .given_daily_limits(count_max(1))
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::FailBefore);
    given.when_submit(request(None)).failed().nothing_appended();
    given
        .when_submit(request(None))
        .answered(S::Committed)
        .appended(&HAPPY);
}

#[test]
fn a_creation_whose_outcome_is_unknown_keeps_its_charge() {
    // The commit was durable, its answer lost: the transfer exists, so the day is charged.
    let given = Scenario::new()
        .given_daily_limits(count_max(1))
        .given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::FailAfter);
    given
        .when_submit(request(None))
        .failed()
        .appended(&HAPPY[..2]);
    given
        .when_submit(request(None))
        .refused(ErrorCode::DailyLimitExceeded);
}
