//! The fence of a partition move (ADR 0023 §2, migration 0029) in a real cell database with a
//! real spot-core: a write that passed the fence holds the freeze until it commits, every write
//! of a frozen partition's users is refused whole (events, FUNDING's journal, deposits) and
//! nothing of it is written, other partitions keep committing, and the moves' records let one
//! move of a partition run at a time.

use std::time::Duration;

use adapters::pg::moves::{is_fenced, PgMoves};
use application::moves::{MoveId, MoveRecord, MoveRecords, MoveStep, Started};
use cells::{partition_of, CellId, Partition};
use domain::{AccountType, UserId};

use crate::helpers::{dec, Stack};

/// Two users of two partitions of cell 1.
fn users() -> (u64, u64) {
    let u = (1..)
        .find(|u| partition_of(UserId::new(*u).unwrap()).get() < 200)
        .unwrap();
    let p = partition_of(UserId::new(u).unwrap());
    let v = (2..)
        .find(|v| {
            let q = partition_of(UserId::new(*v).unwrap());
            q != p && q.get() < 200
        })
        .unwrap();
    (u, v)
}

/// Makes the stack's database cell 1 of a map in which partitions 200 and above are cell 2's.
async fn as_cell_one(stack: &Stack) {
    sqlx::query("INSERT INTO cell_identity (cell_id, partitions) VALUES (1, 256)")
        .execute(&stack.db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO cell_partitions (partition, cell_id)
         SELECT p, CASE WHEN p >= 200 THEN 2 ELSE 1 END FROM generate_series(0, 255) p",
    )
    .execute(&stack.db.pool)
    .await
    .unwrap();
}

fn record(id: &str, p: Partition) -> MoveRecord {
    MoveRecord::new(
        MoveId(id.into()),
        p,
        CellId::ONE,
        CellId::new(2).unwrap(),
        1,
    )
}

async fn events_of(stack: &Stack, user: u64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events WHERE user_id = $1")
        .bind(i64::try_from(user).unwrap())
        .fetch_one(&stack.db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn cells_move_001_a_frozen_partition_takes_no_write_and_the_freeze_waits_for_writes_in_flight(
) {
    let stack = Stack::start().await;
    as_cell_one(&stack).await;
    let (u, v) = users();
    let p = partition_of(UserId::new(u).unwrap());
    stack.deposit(u, "USDT", "100").await;
    stack.deposit(v, "USDT", "100").await;
    stack
        .transfer(u, AccountType::Funding, AccountType::Spot, "USDT", "10")
        .await;

    // A move at PAUSING, and a write of u's that has passed the fence and not committed.
    let moves = PgMoves::new(stack.db.pool.clone());
    let m = record("m-fence", p);
    assert_eq!(moves.start(&m).await.unwrap(), Started::Recorded);
    let mut at = m.clone();
    for (from, to) in [
        (MoveStep::Planned, MoveStep::Copying),
        (MoveStep::Copying, MoveStep::CatchingUp),
        (MoveStep::CatchingUp, MoveStep::Pausing),
    ] {
        at.step = to;
        assert!(moves.save(from, &at).await.unwrap());
    }
    let mut in_flight = stack.db.pool.begin().await.unwrap();
    sqlx::query("SELECT partition_fence($1)")
        .bind(vec![i64::try_from(u).unwrap()])
        .execute(&mut *in_flight)
        .await
        .unwrap();
    let freezing = {
        let moves = moves.clone();
        let id = m.id.clone();
        tokio::spawn(async move { moves.freeze(p, &id).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !freezing.is_finished(),
        "the freeze waits for the write that passed the fence"
    );
    in_flight.commit().await.unwrap();
    let state = tokio::time::timeout(Duration::from_secs(10), freezing)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.unwrap(), "FROZEN");

    // Every write of u's is refused whole now; v's go on.
    let before = (
        stack.funding_balance(u, "USDT").await,
        stack.spot_balance(u, "USDT").await,
    );
    let events = events_of(&stack, u).await;
    let refused = stack
        .coordinator
        .submit(application::NewTransfer {
            user_id: UserId::new(u).unwrap(),
            from: AccountType::Funding,
            to: AccountType::Spot,
            asset: domain::AssetSymbol::parse("USDT").unwrap(),
            amount: domain::Amount::parse("5").unwrap(),
            cid: None,
        })
        .await;
    assert!(
        refused.is_err(),
        "a frozen partition's transfer is not created: {refused:?}"
    );
    assert_eq!(
        events_of(&stack, u).await,
        events,
        "no event of u's was written"
    );
    let after = (
        stack.funding_balance(u, "USDT").await,
        stack.spot_balance(u, "USDT").await,
    );
    assert_eq!(after, before, "no money of u's moved");
    let journal = sqlx::query(
        "INSERT INTO funding_journal (req_id, operation, user_id, asset, amount, outcome)
         VALUES ('r-late', 'DEPOSIT', $1, 'USDT', 1, 'APPLIED')",
    )
    .bind(i64::try_from(u).unwrap())
    .execute(&stack.db.pool)
    .await
    .unwrap_err();
    assert!(is_fenced(&journal), "{journal}");
    let deposit = sqlx::query(
        "INSERT INTO external_deposits (external_id, user_id, asset, amount) VALUES ('x-late', $1, 'USDT', 1)",
    )
    .bind(i64::try_from(u).unwrap())
    .execute(&stack.db.pool)
    .await
    .unwrap_err();
    assert!(is_fenced(&deposit), "{deposit}");
    let done = stack
        .transfer(v, AccountType::Funding, AccountType::Spot, "USDT", "10")
        .await;
    assert_eq!(
        done.state,
        domain::TransferState::Committed,
        "other partitions commit"
    );

    // A cancel releases it: u writes again, and the books are exact.
    moves.release(p, &m.id).await.unwrap();
    assert_eq!(moves.state(p).await.unwrap(), "STEADY");
    let again = stack
        .transfer(u, AccountType::Funding, AccountType::Spot, "USDT", "5")
        .await;
    assert_eq!(again.state, domain::TransferState::Committed);
    assert_eq!(stack.funding_balance(u, "USDT").await, dec("85"));
    stack.assert_conserved(u, "USDT").await;
    stack.assert_conserved(v, "USDT").await;
}

#[tokio::test]
async fn cells_move_002_one_move_of_a_partition_at_a_time_and_a_partition_of_another_cell_is_fenced(
) {
    let stack = Stack::start().await;
    as_cell_one(&stack).await;
    let moves = PgMoves::new(stack.db.pool.clone());
    let p = Partition::new(7).unwrap();
    let first = record("m-1", p);
    assert_eq!(moves.start(&first).await.unwrap(), Started::Recorded);
    assert_eq!(
        moves.start(&first).await.unwrap(),
        Started::Recorded,
        "a retried start"
    );
    let second = record("m-2", p);
    assert_eq!(
        moves.start(&second).await.unwrap(),
        Started::Busy(first.id.clone())
    );
    assert_eq!(moves.unfinished().await.unwrap(), vec![first.clone()]);

    // Compare and set: a save from a step the record has left does nothing.
    let mut cancelled = first.clone();
    cancelled.step = MoveStep::Cancelling;
    cancelled.cancelled_at = Some(MoveStep::Planned);
    assert!(moves.save(MoveStep::Planned, &cancelled).await.unwrap());
    let mut late = first.clone();
    late.step = MoveStep::Copying;
    assert!(
        !moves.save(MoveStep::Planned, &late).await.unwrap(),
        "the runner's late save loses"
    );
    cancelled.step = MoveStep::Cancelled;
    assert!(moves.save(MoveStep::Cancelling, &cancelled).await.unwrap());
    assert_eq!(moves.load(&first.id).await.unwrap(), Some(cancelled));
    assert_eq!(
        moves.start(&second).await.unwrap(),
        Started::Recorded,
        "an ended move frees it"
    );

    // A partition this cell does not own takes no write, and only its move's copy writes into
    // it while it is incoming.
    let theirs = (1..)
        .find(|u| partition_of(UserId::new(*u).unwrap()).get() >= 200)
        .unwrap();
    let q = partition_of(UserId::new(theirs).unwrap());
    let insert = "INSERT INTO funding_journal (req_id, operation, user_id, asset, amount, outcome)
                  VALUES ($2, 'DEPOSIT', $1, 'USDT', 1, 'APPLIED')";
    let user = i64::try_from(theirs).unwrap();
    let refused = sqlx::query(insert)
        .bind(user)
        .bind("r1")
        .execute(&stack.db.pool)
        .await
        .unwrap_err();
    assert!(is_fenced(&refused));
    assert_eq!(moves.state(q).await.unwrap(), "MOVED");
    let incoming = MoveId("m-in".into());
    assert_eq!(moves.mark_incoming(q, &incoming).await.unwrap(), "INCOMING");
    let mut tx = stack.db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL ledger.move_copy = 'm-in'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(insert)
        .bind(user)
        .bind("r2")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let other_copy = sqlx::query(insert)
        .bind(user)
        .bind("r3")
        .execute(&stack.db.pool)
        .await
        .unwrap_err();
    assert!(is_fenced(&other_copy), "outside the copy it stays fenced");
}
