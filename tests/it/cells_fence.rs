//! The fence of a partition move (ADR 0023 §2, migration 0029) in a real cell database with a
//! real spot-core: a write that passed the fence holds the freeze until it commits, every write
//! of a frozen partition's users is refused whole (events, FUNDING's journal, deposits) and
//! nothing of it is written, other partitions keep committing, the moves' records let one
//! move of a partition run at a time, and the copy appends a partition's history to another
//! cell's feed densely, once, and only while that cell expects it.

use std::time::Duration;

use adapters::pg::move_copy::{copy_events, copy_state};
use adapters::pg::moves::{is_fenced, PgMoves};
use application::moves::{MoveId, MoveRecord, MoveRecords, MoveStep, Started};
use cells::{partition_of, CellId, Partition};
use domain::{AccountType, UserId};

use adapters::spot::moves::EngineMoves;
use application::moves::SpotMoves;

use crate::helpers::{dec, SpotProcess, Stack, TestDb};

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

/// A FUNDING→SPOT transfer of `amount` USDT for `user`, with no cid.
fn funding_to_spot(user: u64, amount: &str) -> application::NewTransfer {
    application::NewTransfer {
        user_id: UserId::new(user).unwrap(),
        from: AccountType::Funding,
        to: AccountType::Spot,
        asset: domain::AssetSymbol::parse("USDT").unwrap(),
        amount: domain::Amount::parse(amount).unwrap(),
        cid: None,
    }
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
    assert_eq!(state.unwrap(), ("FROZEN".to_owned(), 0));

    // Every write of u's is refused whole now; v's go on.
    let before = (
        stack.funding_balance(u, "USDT").await,
        stack.spot_balance(u, "USDT").await,
    );
    let events = events_of(&stack, u).await;
    let refused = stack.coordinator.submit(funding_to_spot(u, "5")).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(application::CoordinatorError::is_fenced),
        "a frozen partition's transfer is refused at the fence: {refused:?}"
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
    // Refused alone: in a group commit shared with other partitions' transfers, only the
    // frozen partition's commits fail.
    let mixed: Vec<_> = (0..12)
        .map(|k| {
            let coordinator = stack.coordinator.clone();
            let user = if k % 4 == 0 { u } else { v };
            tokio::spawn(async move {
                let request = funding_to_spot(user, "1");
                (user, coordinator.submit(request).await)
            })
        })
        .collect();
    for answer in mixed {
        let (user, answer) = answer.await.unwrap();
        if user == u {
            assert!(answer.is_err_and(|e| e.is_fenced()), "u's is fenced");
        } else {
            assert_eq!(
                answer.unwrap().state,
                domain::TransferState::Committed,
                "v's commits"
            );
        }
    }
    let done = stack
        .transfer(v, AccountType::Funding, AccountType::Spot, "USDT", "1")
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
    stack.wait_for_projections().await;
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

/// Makes `db` cell 2 of the same map as `as_cell_one`.
async fn as_cell_two(db: &TestDb) {
    sqlx::query("INSERT INTO cell_identity (cell_id, partitions) VALUES (2, 256)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO cell_partitions (partition, cell_id)
         SELECT p, CASE WHEN p >= 200 THEN 2 ELSE 1 END FROM generate_series(0, 255) p",
    )
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The events of `users` in a cell, in feed order: key, type and payload.
async fn history(pool: &sqlx::PgPool, users: &[i64]) -> Vec<(String, i64, String, String)> {
    sqlx::query_as(
        "SELECT aggregate_id, sequence, event_type, payload::text FROM events
         WHERE user_id = ANY($1) ORDER BY feed_position",
    )
    .bind(users)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn cells_move_003_the_copy_appends_a_partitions_history_densely_once_and_only_while_incoming()
{
    let stack = Stack::start().await;
    as_cell_one(&stack).await;
    let target = TestDb::new().await;
    as_cell_two(&target).await;
    let (u, v) = users();
    let p = partition_of(UserId::new(u).unwrap());
    let w = (u + 1..)
        .find(|w| partition_of(UserId::new(*w).unwrap()) == p)
        .unwrap();
    for user in [u, v, w] {
        stack.deposit(user, "USDT", "100").await;
        for amount in ["1", "2", "3"] {
            stack
                .transfer(
                    user,
                    AccountType::Funding,
                    AccountType::Spot,
                    "USDT",
                    amount,
                )
                .await;
        }
    }
    stack
        .transfer(w, AccountType::Spot, AccountType::Funding, "USDT", "1")
        .await;
    let moved = [i64::try_from(u).unwrap(), i64::try_from(w).unwrap()];
    let id = MoveId("m-copy".into());
    let copy = |mark: i64| copy_events(&stack.db.pool, &target.pool, &id, p, CellId::ONE, mark, 4);

    // Nothing is written before the target expects the partition.
    assert_eq!(copy(0).await.unwrap().rows, 0);
    let target_moves = PgMoves::new(target.pool.clone());
    assert_eq!(
        target_moves.mark_incoming(p, &id).await.unwrap(),
        "INCOMING"
    );
    let mut mark = 0;
    let mut written = 0;
    loop {
        let step = copy(mark).await.unwrap();
        written += step.rows;
        assert!(step.mark >= mark);
        mark = step.mark;
        if step.at_end {
            break;
        }
    }
    let source_history = history(&stack.db.pool, &moved).await;
    assert!(!source_history.is_empty());
    assert_eq!(written, u64::try_from(source_history.len()).unwrap());
    assert_eq!(
        history(&target.pool, &moved).await,
        source_history,
        "same events, same order"
    );
    assert!(
        history(&target.pool, &[i64::try_from(v).unwrap()])
            .await
            .is_empty(),
        "only the partition"
    );
    let (count, head): (i64, i64) =
        sqlx::query_as("SELECT count(*), max(feed_position) FROM events")
            .fetch_one(&target.pool)
            .await
            .unwrap();
    assert_eq!(count, head, "the target's feed stays dense");
    let origins: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT (metadata->>'origin_cell')::int, e.feed_position - (metadata->>'origin_position')::bigint
         FROM events e ORDER BY feed_position",
    )
    .fetch_all(&target.pool)
    .await
    .unwrap();
    assert!(
        origins.iter().all(|(cell, _)| *cell == 1),
        "each copy names its source cell"
    );

    // A copy run again writes nothing; new events are a tail; a void target takes none.
    assert_eq!(copy(0).await.unwrap().rows, 0, "idempotent");
    stack
        .transfer(u, AccountType::Funding, AccountType::Spot, "USDT", "4")
        .await;
    let mut tail = 0;
    loop {
        let step = copy(mark).await.unwrap();
        (tail, mark) = (tail + step.rows, step.mark);
        if step.at_end {
            break;
        }
    }
    assert_eq!(tail, 5, "the new transfer's five events, and nothing else");
    assert_eq!(
        history(&target.pool, &moved).await,
        history(&stack.db.pool, &moved).await
    );
    target_moves.release(p, &id).await.unwrap();
    stack
        .transfer(u, AccountType::Funding, AccountType::Spot, "USDT", "5")
        .await;
    assert_eq!(
        copy(mark).await.unwrap().rows,
        0,
        "a void move copies nothing more"
    );
}

fn client(spot: &SpotProcess) -> spot_core::SpotClient {
    spot_core::SpotClient::with_token(
        spot.addr.clone(),
        Duration::from_secs(3),
        Some(spot.token.clone()),
    )
}

#[tokio::test]
async fn cells_move_004_spot_balances_move_between_two_real_engines_once() {
    let stack = Stack::start().await;
    let (u, v) = users();
    let p = partition_of(UserId::new(u).unwrap());
    for user in [u, v] {
        stack.deposit(user, "USDT", "100").await;
        stack
            .transfer(user, AccountType::Funding, AccountType::Spot, "USDT", "30")
            .await;
    }
    let target = SpotProcess::start();
    let two = CellId::new(2).unwrap();
    let engines =
        EngineMoves::new([(CellId::ONE, client(&stack.spot)), (two, client(&target))].into());
    let out = engines.move_out(CellId::ONE, "m-spot", p).await.unwrap();
    let key = (UserId::new(u).unwrap(), "USDT".to_owned());
    assert_eq!(out.balances, [(key.clone(), dec("30"))].into());
    assert_eq!(
        engines.move_out(CellId::ONE, "m-spot", p).await.unwrap(),
        out,
        "a repeat answers the same"
    );
    engines.move_in(two, "m-spot", p, &out).await.unwrap();
    engines.move_in(two, "m-spot", p, &out).await.unwrap();
    let users = [UserId::new(u).unwrap(), UserId::new(v).unwrap()];
    let there = engines.balances(two, p, &users[..1]).await.unwrap();
    assert_eq!(there, [(key, dec("30"))].into(), "moved in once");
    assert!(
        engines
            .balances(CellId::ONE, p, &users[..1])
            .await
            .unwrap()
            .is_empty(),
        "MOVED in the source"
    );
    assert_eq!(
        stack.spot_balance(v, "USDT").await,
        dec("30"),
        "another partition stays"
    );
    // The source's engine refuses the moved user's movements, as an unknown outcome to retry
    // under the new map, never as a refusal.
    let moved = stack.coordinator.submit(funding_to_spot(u, "1")).await;
    assert!(
        !matches!(moved, Ok(ref t) if t.state == domain::TransferState::Committed || t.state == domain::TransferState::Failed),
        "neither committed nor refused in the old cell: {moved:?}"
    );
}

#[tokio::test]
async fn cells_move_005_a_partition_drains_its_open_transfers_before_it_freezes_and_recovery_drives_only_its_own(
) {
    let mut stack = Stack::start().await;
    as_cell_one(&stack).await;
    let (u, _) = users();
    let p = partition_of(UserId::new(u).unwrap());
    stack.deposit(u, "USDT", "100").await;
    // spot-core down: the transfer stays open, its deposit's outcome unknown.
    stack.spot.kill();
    let open = stack
        .coordinator
        .submit(funding_to_spot(u, "10"))
        .await
        .unwrap();
    assert!(!open.state.is_terminal(), "{open:?}");
    let book = recovery::book::PgRetryBook::new(stack.db.pool.clone());
    let due = || async {
        recovery::book::RetryBook::due(&book, 0, 10)
            .await
            .unwrap()
            .len()
    };
    assert_eq!(due().await, 1, "its own partition's open transfer is due");
    let moves = PgMoves::new(stack.db.pool.clone());
    let mut m = record("m-open", p);
    moves.start(&m).await.unwrap();
    m.step = MoveStep::Pausing;
    assert!(moves.save(MoveStep::Planned, &m).await.unwrap());

    // The drain: nothing new starts, the open transfer is still driven.
    assert_eq!(
        moves.freeze(p, &m.id).await.unwrap(),
        ("DRAINING".to_owned(), 1)
    );
    assert_eq!(due().await, 1, "a draining partition's transfer is driven");
    let refused = stack.coordinator.submit(funding_to_spot(u, "5")).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(application::CoordinatorError::is_fenced),
        "no new transfer while draining: {refused:?}"
    );
    stack.spot.restart();
    let ended = stack.coordinator.resume(&open.req_id).await.unwrap();
    assert!(ended.data.state.is_terminal(), "{ended:?}");
    assert_eq!(
        moves.freeze(p, &m.id).await.unwrap(),
        ("FROZEN".to_owned(), 0),
        "frozen once no transfer is open"
    );
    assert_eq!(
        due().await,
        0,
        "a frozen partition's transfer waits for the move"
    );
    stack.assert_invariant_exact().await;
    moves.release(p, &m.id).await.unwrap();
    sqlx::query("UPDATE cell_partitions SET cell_id = 2 WHERE partition = $1")
        .bind(i16::from(p.get()))
        .execute(&stack.db.pool)
        .await
        .unwrap();
    let mut again = stack.coordinator.submit(funding_to_spot(u, "1")).await;
    assert!(
        again
            .as_mut()
            .is_err_and(|e| application::CoordinatorError::is_fenced(e)),
        "a partition moved away takes no write here: {again:?}"
    );
    assert_eq!(due().await, 0, "and is never driven here again");
}

/// A table's rows of `users` in a cell, as text, in a fixed order, without the columns a cell
/// numbers itself (ids, transaction ids) and the move a copy names.
async fn rows_of(pool: &sqlx::PgPool, table: &str, users: &[i64]) -> Vec<String> {
    let sql = format!(
        "SELECT (to_jsonb(t) - 'id' - 'tx_id' - 'move_id')::text AS r FROM {table} t
         WHERE user_id = ANY($1) ORDER BY 1"
    );
    sqlx::query_scalar(&sql)
        .bind(users)
        .fetch_all(pool)
        .await
        .unwrap()
}

const STATE_TABLES: [&str; 6] = [
    "funding_accounts",
    "funding_journal",
    "external_deposits",
    "transfer_cids",
    "daily_transfer_counts",
    "daily_transfer_amounts",
];

#[tokio::test]
async fn cells_move_006_the_copy_brings_a_partitions_state_rows_once_and_keeps_them_current() {
    let stack = Stack::start().await;
    as_cell_one(&stack).await;
    let target = TestDb::new().await;
    as_cell_two(&target).await;
    let (u, v) = users();
    let p = partition_of(UserId::new(u).unwrap());
    for user in [u, v] {
        stack.deposit(user, "USDT", "100").await;
        stack
            .transfer(user, AccountType::Funding, AccountType::Spot, "USDT", "10")
            .await;
        let with_cid = application::NewTransfer {
            user_id: UserId::new(user).unwrap(),
            from: AccountType::Spot,
            to: AccountType::Funding,
            asset: domain::AssetSymbol::parse("USDT").unwrap(),
            amount: domain::Amount::parse("4").unwrap(),
            cid: Some("cid-1".into()),
        };
        stack.coordinator.submit(with_cid).await.unwrap();
    }
    let id = MoveId("m-state".into());
    let ours = [i64::try_from(u).unwrap()];
    let copy = |mark: i64| copy_state(&stack.db.pool, &target.pool, &id, p, mark);
    assert_eq!(
        copy(0).await.unwrap().rows,
        0,
        "nothing before the target expects it"
    );
    PgMoves::new(target.pool.clone())
        .mark_incoming(p, &id)
        .await
        .unwrap();
    let first = copy(0).await.unwrap();
    assert!(first.rows > 0 && first.journal_mark > 0, "{first:?}");
    for table in STATE_TABLES {
        let source = rows_of(&stack.db.pool, table, &ours).await;
        assert!(
            !source.is_empty() || table.starts_with("daily"),
            "{table} has rows"
        );
        assert_eq!(rows_of(&target.pool, table, &ours).await, source, "{table}");
        let theirs = [i64::try_from(v).unwrap()];
        assert!(
            rows_of(&target.pool, table, &theirs).await.is_empty(),
            "{table}: only the partition"
        );
    }
    for table in ["funding_journal", "external_deposits"] {
        let unnamed: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE move_id IS DISTINCT FROM 'm-state'"
        ))
        .fetch_one(&target.pool)
        .await
        .unwrap();
        assert_eq!(
            unnamed, 0,
            "{table}: every copy names its move, so no check counts it"
        );
    }
    assert_eq!(
        copy(first.journal_mark).await.unwrap().rows,
        0,
        "a repeat changes nothing"
    );
    assert_eq!(copy(0).await.unwrap().rows, 0, "even from the start");

    // The source moves on: the next copy brings the new records and the current balances.
    stack
        .transfer(u, AccountType::Funding, AccountType::Spot, "USDT", "7")
        .await;
    let second = copy(first.journal_mark).await.unwrap();
    assert!(second.journal_mark > first.journal_mark, "{second:?}");
    for table in STATE_TABLES {
        let source = rows_of(&stack.db.pool, table, &ours).await;
        assert_eq!(
            rows_of(&target.pool, table, &ours).await,
            source,
            "{table} after a tail"
        );
    }
    PgMoves::new(target.pool.clone())
        .release(p, &id)
        .await
        .unwrap();
    stack.deposit(u, "USDT", "1").await;
    assert_eq!(
        copy(second.journal_mark).await.unwrap().rows,
        0,
        "a void move copies nothing"
    );
}
