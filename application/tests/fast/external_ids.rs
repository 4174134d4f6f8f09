//! The claim on a deposit's external_id across cells (`application::external_ids`): the first
//! user holds it, a retry of theirs goes on, another user's deposit is refused with the code a
//! reused external_id gets, and a claim store that does not answer credits nothing.

use application::external_ids::{claim, Claim};
use application::testkit::{run, MemClaims};
use domain::{ErrorCode, UserId};

fn user(raw: u64) -> UserId {
    UserId::new(raw).expect("a user id")
}

fn claimed(claims: &MemClaims, external_id: &str, who: u64) -> Result<Claim, String> {
    run(claim(claims, external_id, user(who)))
        .expect("a claim finishes")
        .map_err(|e| e.to_string())
}

#[test]
fn the_first_user_holds_an_external_id_and_a_retry_of_theirs_goes_on() {
    let claims = MemClaims::default();
    assert_eq!(claimed(&claims, "wire-1", 7), Ok(Claim::Held));
    assert_eq!(claimed(&claims, "wire-1", 7), Ok(Claim::Held));
    assert_eq!(Claim::Held.refusal(), None);
    assert_eq!(claims.holder("wire-1"), Some(user(7)));
}

#[test]
fn another_users_deposit_naming_a_held_external_id_is_refused_as_reused() {
    let claims = MemClaims::default();
    assert_eq!(claimed(&claims, "wire-2", 7), Ok(Claim::Held));
    let other = claimed(&claims, "wire-2", 8);
    assert_eq!(other, Ok(Claim::OtherUser(user(7))));
    assert_eq!(
        other.unwrap().refusal(),
        Some(ErrorCode::IdempotencyKeyReused)
    );
    // The refusal takes nothing from the holder.
    assert_eq!(claims.holder("wire-2"), Some(user(7)));
}

#[test]
fn a_claim_store_that_does_not_answer_takes_nothing_and_a_retry_claims_again() {
    let claims = MemClaims::default();
    claims.fail(true);
    assert!(claimed(&claims, "wire-3", 8).is_err());
    assert_eq!(claims.holder("wire-3"), None);
    claims.fail(false);
    assert_eq!(claimed(&claims, "wire-3", 9), Ok(Claim::Held));
    assert_eq!(claims.holder("wire-3"), Some(user(9)));
}
