//! spot-core killed with SIGKILL and started again keeps every acknowledged balance and its memory
//! of processed req_ids.

use domain::{
    AccountPort, AccountType, AdapterOutcome, Amount, AssetSymbol, Movement, ReqId, UserId,
};

use crate::helpers::{dec, Stack};

#[tokio::test]
async fn spot_core_sigkill_restart_keeps_balances_and_req_ids() {
    let mut s = Stack::start().await;
    s.deposit(31, "USDT", "100").await;
    for _ in 0..5 {
        s.transfer(31, AccountType::Funding, AccountType::Spot, "USDT", "10")
            .await;
    }
    let w = Movement {
        req_id: ReqId::generate(),
        user_id: UserId::new(31).unwrap(),
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("3").unwrap(),
    };
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(31, "USDT").await, dec("47"));

    s.spot.restart();
    assert_eq!(s.spot_balance(31, "USDT").await, dec("47"));
    // The processed req_id survived: a retry applies nothing.
    assert_eq!(s.spot_adapter.withdraw(&w).await, AdapterOutcome::Success);
    assert_eq!(s.spot_balance(31, "USDT").await, dec("47"));
    // And transfers keep working after the restart.
    let t = s
        .transfer(31, AccountType::Spot, AccountType::Funding, "USDT", "7")
        .await;
    assert_eq!(t.state, domain::TransferState::Committed);
    assert_eq!(s.spot_balance(31, "USDT").await, dec("40"));
}
