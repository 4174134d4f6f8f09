//! IDP-001..003: each adapter called twice with one req_id applies once and answers the same.

use domain::{AccountPort, AdapterOutcome, Amount, AssetSymbol, Movement, ReqId, UserId};

use crate::helpers::{dec, Stack};

fn movement(user: u64, asset: &str, amount: &str) -> Movement {
    Movement {
        req_id: ReqId::generate(),
        user_id: UserId::new(user).unwrap(),
        asset: AssetSymbol::parse(asset).unwrap(),
        amount: Amount::parse(amount).unwrap(),
    }
}

#[tokio::test]
async fn idp_001_withdraw_twice_debits_once() {
    let s = Stack::start().await;
    s.deposit(11, "USDT", "10").await;
    let m = movement(11, "USDT", "3");
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding_balance(11, "USDT").await, dec("7"));

    let d = movement(11, "USDT", "5");
    assert_eq!(s.spot_adapter.deposit(&d).await, AdapterOutcome::Success);
    let w = movement(11, "USDT", "2");
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(11, "USDT").await, dec("3"));

    // A refusal is remembered too: the same req_id stays refused even once money arrives.
    let big = movement(11, "USDT", "100");
    let first = s.funding.withdraw(&big).await;
    assert!(
        matches!(&first, AdapterOutcome::ExplicitFail { code, .. } if code == "INSUFFICIENT_BALANCE")
    );
    s.deposit(11, "USDT", "1000").await;
    assert_eq!(s.funding.withdraw(&big).await, first);
}

#[tokio::test]
async fn idp_002_deposit_twice_credits_once() {
    let s = Stack::start().await;
    s.deposit(12, "BTC", "1").await;
    let m = movement(12, "BTC", "0.5");
    assert_eq!(s.funding.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding_balance(12, "BTC").await, dec("1.5"));

    let m = movement(12, "BTC", "0.25");
    assert_eq!(s.spot_adapter.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.deposit(&m).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(12, "BTC").await, dec("0.25"));
}

#[tokio::test]
async fn idp_003_refund_twice_credits_once_and_needs_a_withdraw() {
    let s = Stack::start().await;
    s.deposit(13, "ETH", "4").await;
    let m = movement(13, "ETH", "1");
    // No withdraw under this req_id yet: a refund would mint money, so it is refused.
    assert!(
        matches!(s.funding.refund(&m).await, AdapterOutcome::ExplicitFail { code, .. } if code == "NO_MATCHING_WITHDRAW")
    );
    let m = movement(13, "ETH", "1");
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.refund(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding.refund(&m).await, AdapterOutcome::Success);
    assert_eq!(s.funding_balance(13, "ETH").await, dec("4"));

    let d = movement(13, "ETH", "2");
    assert_eq!(s.spot_adapter.deposit(&d).await, AdapterOutcome::Success);
    let w = movement(13, "ETH", "1.5");
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.refund(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_adapter.refund(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(13, "ETH").await, dec("2"));
}

#[tokio::test]
async fn a_used_req_id_with_other_details_is_never_a_clean_answer() {
    let s = Stack::start().await;
    s.deposit(14, "USDT", "10").await;
    let m = movement(14, "USDT", "1");
    assert_eq!(s.funding.withdraw(&m).await, AdapterOutcome::Success);
    let mut other = m.clone();
    other.amount = Amount::parse("2").unwrap();
    assert!(s.funding.withdraw(&other).await.is_unknown());
    assert_eq!(s.funding_balance(14, "USDT").await, dec("9"));
}
