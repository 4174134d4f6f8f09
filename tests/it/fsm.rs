//! FSM-001..004 and INV-001..003: every path of the state machine, end to end, with balances and
//! conservation checked after each.

use domain::AccountType::{Funding, Spot};
use domain::{AssetSymbol, TransferState, UserId};

use crate::helpers::{dec, Stack};

const HAPPY: [&str; 5] = [
    "TransferCreated",
    "SourceWithdrawStarted",
    "SourceWithdrawn",
    "TargetDepositStarted",
    "TransferCommitted",
];

#[tokio::test]
async fn fsm_001_inv_001_funding_to_spot_commits() {
    let s = Stack::start().await;
    s.deposit(1, "USDT", "100").await;
    let t = s.transfer(1, Funding, Spot, "USDT", "40.5").await;
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(s.event_types(&t.req_id.to_string()).await, HAPPY);
    assert_eq!(s.funding_balance(1, "USDT").await, dec("59.5"));
    assert_eq!(s.spot_balance(1, "USDT").await, dec("40.5"));
    assert_eq!(s.in_flight(1, "USDT").await, dec("0"));
    s.assert_conserved(1, "USDT").await;
}

#[tokio::test]
async fn fsm_002_inv_001_spot_to_funding_commits() {
    let s = Stack::start().await;
    s.deposit(2, "BTC", "3").await;
    s.transfer(2, Funding, Spot, "BTC", "2").await;
    let t = s.transfer(2, Spot, Funding, "BTC", "0.75").await;
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(s.event_types(&t.req_id.to_string()).await, HAPPY);
    assert_eq!(s.funding_balance(2, "BTC").await, dec("1.75"));
    assert_eq!(s.spot_balance(2, "BTC").await, dec("1.25"));
    s.assert_conserved(2, "BTC").await;
}

#[tokio::test]
async fn fsm_003_inv_002_source_refusal_fails_and_moves_nothing() {
    let s = Stack::start().await;
    s.deposit(3, "USDT", "10").await;
    let t = s.transfer(3, Funding, Spot, "USDT", "10.00000001").await;
    assert_eq!(t.state, TransferState::Failed);
    assert_eq!(
        t.failure.as_ref().map(|f| f.0.as_str()),
        Some("INSUFFICIENT_BALANCE")
    );
    assert_eq!(
        s.event_types(&t.req_id.to_string()).await,
        ["TransferCreated", "SourceWithdrawStarted", "TransferFailed"]
    );
    assert_eq!(s.funding_balance(3, "USDT").await, dec("10"));
    assert_eq!(s.spot_balance(3, "USDT").await, dec("0"));
    s.assert_conserved(3, "USDT").await;

    // The SPOT side refuses for real too: no SPOT account yet.
    let t = s.transfer(3, Spot, Funding, "USDT", "1").await;
    assert_eq!(t.state, TransferState::Failed);
    assert_eq!(
        t.failure.as_ref().map(|f| f.0.as_str()),
        Some("SOURCE_ACCOUNT_NOT_FOUND")
    );
    s.assert_conserved(3, "USDT").await;
}

const ROLLED_BACK: [&str; 6] = [
    "TransferCreated",
    "SourceWithdrawStarted",
    "SourceWithdrawn",
    "TargetDepositStarted",
    "CompensationStarted",
    "TransferRolledBack",
];

#[tokio::test]
async fn fsm_004_inv_003_spot_target_refusal_compensates_and_rolls_back() {
    let s = Stack::start().await;
    s.deposit(4, "ETH", "5").await;
    // spot-core refuses deposits into a DISABLED account: a real, explicit target refusal.
    s.spot_adapter
        .set_status(
            UserId::new(4).unwrap(),
            &AssetSymbol::parse("ETH").unwrap(),
            adapters::AccountStatus::Disabled,
        )
        .await
        .unwrap();
    let t = s.transfer(4, Funding, Spot, "ETH", "2").await;
    assert_eq!(t.state, TransferState::RolledBack);
    assert_eq!(
        t.failure.as_ref().map(|f| f.0.as_str()),
        Some("ACCOUNT_DISABLED")
    );
    assert_eq!(s.event_types(&t.req_id.to_string()).await, ROLLED_BACK);
    assert_eq!(s.funding_balance(4, "ETH").await, dec("5"));
    assert_eq!(s.spot_balance(4, "ETH").await, dec("0"));
    s.assert_conserved(4, "ETH").await;
    let journal = s.funding.journal_for(&t.req_id.to_string()).await.unwrap();
    let ops: Vec<_> = journal
        .iter()
        .map(|j| (j.operation.as_str(), j.applied))
        .collect();
    assert_eq!(ops, [("WITHDRAW", true), ("REFUND", true)]);
}

#[tokio::test]
async fn fsm_004_inv_003_funding_target_refusal_refunds_spot() {
    let s = Stack::start().await;
    s.deposit(5, "USDT", "50").await;
    s.transfer(5, Funding, Spot, "USDT", "30").await;
    s.funding
        .set_status(
            UserId::new(5).unwrap(),
            &AssetSymbol::parse("USDT").unwrap(),
            adapters::AccountStatus::Disabled,
        )
        .await
        .unwrap();
    let t = s.transfer(5, Spot, Funding, "USDT", "12").await;
    assert_eq!(t.state, TransferState::RolledBack);
    assert_eq!(s.event_types(&t.req_id.to_string()).await, ROLLED_BACK);
    assert_eq!(s.spot_balance(5, "USDT").await, dec("30"));
    assert_eq!(s.funding_balance(5, "USDT").await, dec("20"));
    s.assert_conserved(5, "USDT").await;
}

/// An unknown outcome leaves the state where it is; once the target answers again, driving the
/// transfer finishes it without moving money twice.
#[tokio::test]
async fn unknown_target_outcome_keeps_target_pending_until_spot_core_returns() {
    let mut s = Stack::start().await;
    s.deposit(6, "USDT", "10").await;
    s.spot.kill();
    let t = s.transfer(6, Funding, Spot, "USDT", "4").await;
    assert_eq!(t.state, TransferState::TargetPending);
    assert_eq!(s.funding_balance(6, "USDT").await, dec("6"));
    assert_eq!(s.in_flight(6, "USDT").await, dec("4"));

    s.spot.restart();
    let t = s.coordinator.drive(&t.req_id).await.unwrap();
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(s.spot_balance(6, "USDT").await, dec("4"));
    assert_eq!(s.in_flight(6, "USDT").await, dec("0"));
    s.assert_conserved(6, "USDT").await;
    // A further drive of a terminal transfer changes nothing.
    let again = s.coordinator.drive(&t.req_id).await.unwrap();
    assert_eq!(again.state, TransferState::Committed);
    assert_eq!(s.event_types(&t.req_id.to_string()).await, HAPPY);
}

/// An unknown source outcome keeps SOURCE_PENDING: nothing is recorded as failed.
#[tokio::test]
async fn unknown_source_outcome_keeps_source_pending() {
    let mut s = Stack::start().await;
    s.deposit(7, "USDT", "10").await;
    s.transfer(7, Funding, Spot, "USDT", "5").await;
    s.spot.kill();
    let t = s.transfer(7, Spot, Funding, "USDT", "2").await;
    assert_eq!(t.state, TransferState::SourcePending);
    s.spot.restart();
    let t = s.coordinator.drive(&t.req_id).await.unwrap();
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(s.spot_balance(7, "USDT").await, dec("3"));
    assert_eq!(s.funding_balance(7, "USDT").await, dec("7"));
    s.assert_conserved(7, "USDT").await;
}

/// Once a transfer exists, the caller always gets its req_id back: a store failure while driving
/// answers with the last known state, not an error that would invite a second transfer.
#[tokio::test]
async fn a_store_failure_after_creation_still_answers_with_the_transfer() {
    let s = Stack::start().await;
    s.deposit(8, "USDT", "10").await;
    // A real database error on the commit after the withdraw, injected by a trigger. (The
    // create's commit holds TransferCreated and SourceWithdrawStarted together, so the first
    // commit after creation is the one recording the withdraw.)
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_step() RETURNS trigger AS $$
         BEGIN RAISE EXCEPTION 'injected store failure'; END $$ LANGUAGE plpgsql;
         CREATE TRIGGER refuse_step BEFORE INSERT ON events FOR EACH ROW
         WHEN (NEW.event_type = 'SourceWithdrawn') EXECUTE FUNCTION refuse_step();",
    )
    .execute(&s.db.pool)
    .await
    .unwrap();
    let t = s.transfer(8, Funding, Spot, "USDT", "3").await;
    assert_eq!(t.state, TransferState::SourcePending);
    // The withdraw was applied; its record was not, so the repeat below is answered from the
    // journal, never applied twice.
    assert_eq!(s.funding_balance(8, "USDT").await, dec("7"));

    sqlx::raw_sql("DROP TRIGGER refuse_step ON events")
        .execute(&s.db.pool)
        .await
        .unwrap();
    let t = s.coordinator.drive(&t.req_id).await.unwrap();
    assert_eq!(t.state, TransferState::Committed);
    assert_eq!(s.funding_balance(8, "USDT").await, dec("7"));
    let journal = s.funding.journal_for(&t.req_id.to_string()).await.unwrap();
    assert_eq!(journal.len(), 1, "one withdraw only");
    s.assert_conserved(8, "USDT").await;
}

/// A repeat of a cid returns the original transfer even after conditions changed (here the
/// asset was suspended), instead of a refusal the first request never got.
#[tokio::test]
async fn a_cid_repeat_returns_the_original_even_after_the_asset_is_suspended() {
    let s = Stack::start().await;
    s.deposit(10, "ETH", "5").await;
    let request = application::NewTransfer {
        user_id: UserId::new(10).unwrap(),
        from: Funding,
        to: Spot,
        asset: domain::AssetSymbol::parse("ETH").unwrap(),
        amount: domain::Amount::parse("1").unwrap(),
        cid: Some("once-1".into()),
    };
    let first = s.coordinator.submit(request.clone()).await.unwrap();
    assert_eq!(first.state, TransferState::Committed);
    {
        let mut assets = s.assets.write().unwrap();
        let mut eth = assets.get("ETH").unwrap().clone();
        eth.status = domain::AssetStatus::Suspended;
        assets.upsert(eth);
    }
    let again = s.coordinator.submit(request.clone()).await.unwrap();
    assert_eq!(again.req_id, first.req_id);
    let mut other = request;
    other.cid = Some("once-2".into());
    assert_eq!(
        s.coordinator.submit(other).await,
        Err(application::CoordinatorError::Refused(
            domain::ErrorCode::AssetSuspended
        ))
    );
    assert_eq!(s.funding_balance(10, "ETH").await, dec("4"));
}
