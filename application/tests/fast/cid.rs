//! Client keys (`cid`): a repeat answers the first transfer whatever happened since, another body
//! under the same key is refused, and a claim left without a transfer is created under (or, once
//! too old for the idempotency horizon, re-keyed from) its req_id.

use application::testkit::scenario::given_req_id;
use application::{ClientKey, NewTransfer};
use domain::{Amount, TransferState as S};

use crate::prelude::*;

#[test]
fn a_repeat_answers_the_first_transfer_and_does_nothing() {
    let given = Scenario::new();
    let first = given.when_submit(request(Some("c1")));
    first.answered(S::Committed);
    let then = given.when_submit(request(Some("c1")));
    then.answered(S::Committed)
        .nothing_appended()
        .funding_calls(&[])
        .spot_calls(&[])
        .balances("90", Some("10"));
    assert_eq!(then.req_id(), first.req_id());
}

#[test]
fn a_repeat_answers_even_when_the_first_is_still_open() {
    let given = Scenario::new().given_fault(SPOT, Call::Deposit, AccountFault::Unavailable);
    let first = given.when_submit(request(Some("c1")));
    first.answered(S::TargetPending);
    given
        .when_submit(request(Some("c1")))
        .answered(S::TargetPending)
        .nothing_appended()
        .spot_calls(&[]);
}

#[test]
fn another_body_under_the_same_key_is_refused() {
    let given = Scenario::new();
    given
        .when_submit(request(Some("c1")))
        .answered(S::Committed);
    let other = NewTransfer {
        amount: Amount::parse("11").unwrap(),
        ..request(Some("c1"))
    };
    given
        .when_submit(other)
        .refused(ErrorCode::IdempotencyKeyReused)
        .nothing_appended()
        .funding_calls(&[]);
}

#[test]
fn the_same_key_of_another_user_is_another_transfer() {
    let given = Scenario::new();
    let mine = given.when_submit(request(Some("c1")));
    mine.answered(S::Committed);
    let other_user = domain::UserId::new(8).unwrap();
    given.world.funding.open(
        other_user,
        &request(None).asset,
        rust_decimal::Decimal::from(50),
    );
    let theirs = given.when_submit(NewTransfer {
        user_id: other_user,
        ..request(Some("c1"))
    });
    theirs.answered(S::Committed).appended(&HAPPY);
    assert_ne!(theirs.req_id(), mine.req_id());
}

/// The cid `c1` was claimed for the standard body under `GIVEN` by a request that died before
/// it created the transfer.
fn orphan_claim(given: Scenario) -> Scenario {
    let claim = ClientKey {
        req_id: given_req_id(),
        fingerprint: "FUNDING|SPOT|USDT|10".to_owned(),
    };
    let key = (user(), "c1".to_owned());
    given.world.store.rows().claims.insert(key, claim);
    given
}

#[test]
fn an_orphan_claim_is_created_under_its_req_id() {
    let given = orphan_claim(Scenario::new());
    let then = given.when_submit(request(Some("c1")));
    then.answered(S::Committed).appended(&HAPPY);
    assert_eq!(then.req_id(), given_req_id());
}

#[test]
fn an_orphan_claim_too_old_for_the_horizon_is_re_keyed() {
    // A claim older than half the idempotency retention may name a req_id the horizon has
    // passed: the transfer is created under a fresh req_id, and the claim names it.
    let given = orphan_claim(Scenario::new());
    given
        .world
        .clock()
        .advance(application::horizon::RETENTION_DEFAULT);
    let then = given.when_submit(request(Some("c1")));
    then.answered(S::Committed).appended(&HAPPY);
    assert_ne!(then.req_id(), given_req_id(), "re-keyed to a fresh req_id");
    let claim = given.world.store.rows().claims[&(user(), "c1".to_owned())].clone();
    assert_eq!(claim.req_id, then.req_id());
}
