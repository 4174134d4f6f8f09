//! CON-001: two workers racing on one transfer: exactly one wins each step, the loser is told,
//! and money moves once.

use std::collections::HashMap;

use cqrs_es::persist::PersistedEventStore;
use cqrs_es::{AggregateError, EventStore};
use domain::{
    AccountType, Amount, AssetSymbol, ReqId, Transfer, TransferCommand, TransferState, UserId,
};
use postgres_es::PostgresEventRepository;

use crate::helpers::{dec, Stack};

#[tokio::test]
async fn con_001_two_writers_on_one_transfer_one_wins_the_loser_is_told() {
    let s = Stack::start().await;
    let store: PersistedEventStore<PostgresEventRepository, Transfer> =
        PersistedEventStore::new_event_store(PostgresEventRepository::new(s.db.pool.clone()));
    let req_id = ReqId::generate();
    let id = req_id.to_string();
    let create = TransferCommand::Create {
        req_id,
        user_id: UserId::new(21).unwrap(),
        from: AccountType::Funding,
        to: AccountType::Spot,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("1").unwrap(),
        cid: None,
        at: chrono::Utc::now(),
    };
    let cqrs = cqrs_es::CqrsFramework::new(
        PersistedEventStore::<_, Transfer>::new_event_store(PostgresEventRepository::new(
            s.db.pool.clone(),
        )),
        vec![],
        (),
    );
    cqrs.execute(&id, create).await.unwrap();

    // Both writers load the same version, then both try to commit the next step.
    let a = store.load_aggregate(&id).await.unwrap();
    let b = store.load_aggregate(&id).await.unwrap();
    let event = domain::TransferEvent::SourceWithdrawStarted {
        at: chrono::Utc::now(),
    };
    let first = store.commit(vec![event.clone()], a, HashMap::new()).await;
    let second = store.commit(vec![event], b, HashMap::new()).await;
    assert!(first.is_ok());
    assert!(matches!(second, Err(AggregateError::AggregateConflict)));
    assert_eq!(
        s.event_types(&id).await,
        ["TransferCreated", "SourceWithdrawStarted"]
    );
}

/// Creates a transfer without driving it, as a crashed API would leave it.
async fn create_only(s: &Stack, user: UserId, amount: &str) -> ReqId {
    let req_id = ReqId::generate();
    let cqrs = cqrs_es::CqrsFramework::new(
        PersistedEventStore::<_, Transfer>::new_event_store(PostgresEventRepository::new(
            s.db.pool.clone(),
        )),
        vec![],
        (),
    );
    cqrs.execute(
        &req_id.to_string(),
        TransferCommand::Create {
            req_id,
            user_id: user,
            from: AccountType::Funding,
            to: AccountType::Spot,
            asset: AssetSymbol::parse("USDT").unwrap(),
            amount: Amount::parse(amount).unwrap(),
            cid: None,
            at: chrono::Utc::now(),
        },
    )
    .await
    .unwrap();
    req_id
}

#[tokio::test]
async fn con_001_two_coordinators_drive_one_req_id_and_money_moves_once() {
    let s = Stack::start().await;
    s.deposit(22, "USDT", "100").await;
    let user = UserId::new(22).unwrap();
    let c2 = s.another_coordinator();
    let mut conflicts = 0;
    for _ in 0..10 {
        let req_id = create_only(&s, user, "7").await;
        let (r1, r2) = tokio::join!(s.coordinator.drive(&req_id), c2.drive(&req_id));
        for r in [&r1, &r2] {
            match r {
                Ok(_) => {}
                Err(application::CoordinatorError::Conflict) => conflicts += 1,
                Err(e) => panic!("unexpected {e}"),
            }
        }
        // Whoever lost stopped; driving once more finishes whatever is left.
        let t = s.coordinator.drive(&req_id).await.unwrap();
        assert_eq!(t.state, TransferState::Committed);
        let journal = s.funding.journal_for(&req_id.to_string()).await.unwrap();
        assert_eq!(journal.len(), 1, "one withdraw only");
        s.assert_conserved(22, "USDT").await;
    }
    assert!(
        conflicts > 0,
        "the race never happened; the test proves nothing"
    );
    assert_eq!(s.funding_balance(22, "USDT").await, dec("30"));
    assert_eq!(s.spot_balance(22, "USDT").await, dec("70"));
}
