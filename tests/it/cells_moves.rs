//! Whole partition moves between two real cells (ADR 0023): two PostgreSQL databases, two
//! spot-core processes with their WALs, the move runner of `application::moves` over
//! `adapters::pg::move_stores` and `adapters::spot::moves`. Under transfers of the moving
//! partition's users and of others, a move copies, drains, freezes, moves SPOT, checks and
//! switches; both cells' conservation checks stay exact, their feeds dense, a cid retried
//! across the move gets its first answer, and the old cell refuses the moved users. A cancel
//! after the SPOT balances moved leaves the partition whole in its source, and a move resumed by
//! a new runner after each step, or across a spot-core's SIGKILL, ends the same.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use adapters::pg::move_stores::{MoveCell, PgPartitionStores};
use adapters::pg::moves::PgMoves;
use adapters::spot::moves::EngineMoves;
use application::moves::{MoveId, MoveRunner, MoveSettings, MoveStep, NoHold};
use application::{CoordinatorError, NewTransfer, SystemClock};
use cells::{partition_of, CellId, Partition};
use domain::{AccountType, UserId};
use rust_decimal::Decimal;

use crate::helpers::{dec, SpotProcess, Stack};

pub(crate) fn two() -> CellId {
    CellId::new(2).unwrap()
}

/// Partitions below 128 are cell 1's, the rest cell 2's, in both cells' maps.
pub(crate) async fn as_cell(stack: &Stack, cell: u16) {
    sqlx::query("INSERT INTO cell_identity (cell_id, partitions) VALUES ($1, 256)")
        .bind(i32::from(cell))
        .execute(&stack.db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO cell_partitions (partition, cell_id)
         SELECT p, CASE WHEN p >= 128 THEN 2 ELSE 1 END FROM generate_series(0, 255) p",
    )
    .execute(&stack.db.pool)
    .await
    .unwrap();
}

pub(crate) struct Cells {
    pub(crate) one: Stack,
    pub(crate) two: Stack,
}

impl Cells {
    async fn start() -> Self {
        Self::over(Stack::start().await, Stack::start().await).await
    }

    /// Cells 1 and 2 over stacks the test started (one of them on a private cluster).
    pub(crate) async fn over(one: Stack, two: Stack) -> Self {
        as_cell(&one, 1).await;
        as_cell(&two, 2).await;
        Self { one, two }
    }

    pub(crate) fn runner(&self) -> MoveRunner {
        self.runner_with(&[])
    }

    /// The runner over both cells and `more` (cells a test adds, each a stack of its own).
    pub(crate) fn runner_with(&self, more: &[(CellId, &Stack)]) -> MoveRunner {
        let cell = |s: &Stack| MoveCell {
            funding: s.funding.clone(),
            spot: s.spot_adapter.clone(),
        };
        let all: Vec<(CellId, &Stack)> = [(CellId::ONE, &self.one), (two(), &self.two)]
            .into_iter()
            .chain(more.iter().copied())
            .collect();
        let stores = PgPartitionStores::new(all.iter().map(|(id, s)| (*id, cell(s))).collect());
        let engines = EngineMoves::new(all.iter().map(|(id, s)| (*id, client(&s.spot))).collect());
        MoveRunner::new(
            Arc::new(PgMoves::new(self.one.db.pool.clone())),
            Arc::new(stores),
            Arc::new(engines),
            Arc::new(NoHold),
            Arc::new(SystemClock),
            MoveSettings {
                retry: Duration::from_millis(100),
                tail_max: 20,
                ..MoveSettings::default()
            },
        )
    }

    pub(crate) fn stack(&self, cell: CellId) -> &Stack {
        if cell == CellId::ONE {
            &self.one
        } else {
            &self.two
        }
    }

    pub(crate) async fn assert_exact(&self) {
        self.one.assert_invariant_exact().await;
        self.two.assert_invariant_exact().await;
        for s in [&self.one, &self.two] {
            let (count, max): (i64, Option<i64>) =
                sqlx::query_as("SELECT count(*), max(feed_position) FROM events")
                    .fetch_one(&s.db.pool)
                    .await
                    .unwrap();
            assert_eq!(Some(count), max.or(Some(0)), "the feed is dense");
        }
    }
}

fn client(spot: &SpotProcess) -> spot_core::SpotClient {
    spot_core::SpotClient::with_token(
        spot.addr.clone(),
        Duration::from_secs(3),
        Some(spot.token.clone()),
    )
}

/// `n` users of partition `p`.
pub(crate) fn users_of(p: Partition, n: usize) -> Vec<u64> {
    (1..)
        .filter(|u| partition_of(UserId::new(*u).unwrap()) == p)
        .take(n)
        .collect()
}

fn a_user_of(cell: u16, not: Partition) -> u64 {
    (1..)
        .find(|u| {
            let q = partition_of(UserId::new(*u).unwrap());
            q != not && (q.get() >= 128) == (cell == 2)
        })
        .unwrap()
}

fn moving() -> Partition {
    Partition::new(5).unwrap()
}

pub(crate) fn transfer(
    user: u64,
    from: AccountType,
    amount: &str,
    cid: Option<String>,
) -> NewTransfer {
    NewTransfer {
        user_id: UserId::new(user).unwrap(),
        from,
        to: if from == AccountType::Funding {
            AccountType::Spot
        } else {
            AccountType::Funding
        },
        asset: domain::AssetSymbol::parse("USDT").unwrap(),
        amount: domain::Amount::parse(amount).unwrap(),
        cid,
    }
}

/// A user's FUNDING + SPOT in `stack`.
pub(crate) async fn held(stack: &Stack, user: u64) -> Decimal {
    stack.funding_balance(user, "USDT").await + stack.spot_balance(user, "USDT").await
}

/// What the load saw.
#[derive(Default)]
struct Load {
    committed: AtomicU64,
    fenced: AtomicU64,
    /// Every answered transfer of the moving users: req_id → the cell that answered it.
    answered: std::sync::Mutex<BTreeMap<String, CellId>>,
}

/// Transfers back and forth for `user` until `stop`: to the cell the map names (cell 1 first,
/// cell 2 once cell 1 refuses it as moved), as a front that reloads its map would.
async fn keep_trading(
    cells: Arc<Cells>,
    user: u64,
    mover: bool,
    load: Arc<Load>,
    stop: Arc<AtomicBool>,
) {
    let mut at = if partition_of(UserId::new(user).unwrap()).get() >= 128 {
        two()
    } else {
        CellId::ONE
    };
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let from = if k % 2 == 1 {
            AccountType::Funding
        } else {
            AccountType::Spot
        };
        let answer = cells
            .stack(at)
            .coordinator
            .submit(transfer(user, from, "1", Some(format!("c{user}-{k}"))))
            .await;
        match answer {
            Ok(t) => {
                if t.state.is_terminal() {
                    load.committed.fetch_add(1, Ordering::Relaxed);
                }
                if mover {
                    load.answered
                        .lock()
                        .unwrap()
                        .insert(t.req_id.to_string(), at);
                }
            }
            Err(e) if e.is_fenced() => {
                load.fenced.fetch_add(1, Ordering::Relaxed);
                k -= 1;
                if at == CellId::ONE && owner(&cells.one, user).await == two() {
                    at = two();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("user {user}: {e:?}"),
        }
    }
}

/// The cell that owns `user`'s partition in `stack`'s map.
pub(crate) async fn owner(stack: &Stack, user: u64) -> CellId {
    let p = partition_of(UserId::new(user).unwrap());
    let cell: i32 = sqlx::query_scalar("SELECT cell_id FROM cell_partitions WHERE partition = $1")
        .bind(i16::from(p.get()))
        .fetch_one(&stack.db.pool)
        .await
        .unwrap();
    CellId::new(u64::try_from(cell).unwrap()).unwrap()
}

#[tokio::test]
async fn cells_move_010_a_partition_moves_under_load_and_both_cells_stay_exact() {
    let cells = Arc::new(Cells::start().await);
    let p = moving();
    let movers = users_of(p, 3);
    let bystander = a_user_of(1, p);
    let other = a_user_of(2, p);
    for u in &movers {
        cells.one.deposit(*u, "USDT", "1000").await;
        for k in 0..5 {
            cells
                .one
                .coordinator
                .submit(transfer(
                    *u,
                    AccountType::Funding,
                    "3",
                    Some(format!("h{u}-{k}")),
                ))
                .await
                .unwrap();
        }
    }
    cells.one.deposit(bystander, "USDT", "1000").await;
    cells.two.deposit(other, "USDT", "1000").await;
    // A transfer with a cid before the move, retried after it.
    let first = cells
        .one
        .coordinator
        .submit(transfer(
            movers[0],
            AccountType::Funding,
            "7",
            Some("across".into()),
        ))
        .await
        .unwrap();

    let load = Arc::new(Load::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for u in movers.iter().copied().chain([bystander, other]) {
        tasks.push(tokio::spawn(keep_trading(
            cells.clone(),
            u,
            movers.contains(&u),
            load.clone(),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runner = cells.runner();
    let id = MoveId("m-load".into());
    runner
        .start(id.clone(), p, CellId::ONE, two(), 1)
        .await
        .unwrap();
    let Ok(end) = tokio::time::timeout(Duration::from_secs(60), runner.drive(&id)).await else {
        let stored = PgMoves::new(cells.one.db.pool.clone());
        let at = application::moves::MoveRecords::load(&stored, &id).await;
        panic!("the move did not end: {at:?}");
    };
    let end = end.unwrap();
    assert_eq!(end.step, MoveStep::Done, "{:?}", end.reason);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(load.committed.load(Ordering::Relaxed) > 0);

    // The map: version 2 in both cells, the partition cell 2's.
    for s in [&cells.one, &cells.two] {
        let version: i64 = sqlx::query_scalar("SELECT map_version FROM cell_identity")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
        assert_eq!(version, 2);
        assert_eq!(owner(s, movers[0]).await, two());
        let moved: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM events WHERE aggregate_type = 'Partition'
               AND event_type = 'PartitionMoved' AND aggregate_id = 'm-load'",
        )
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
        assert_eq!(moved, 1, "PartitionMoved stands in both feeds");
    }
    cells.assert_exact().await;

    // Every moved user's money is in cell 2 now, all of it, and every answer is there.
    for u in &movers {
        assert_eq!(held(&cells.two, *u).await, dec("1000"), "user {u}");
        assert_eq!(cells.two.in_flight(*u, "USDT").await, Decimal::ZERO);
    }
    let answered = load.answered.lock().unwrap().clone();
    assert!(
        answered.values().any(|c| *c == CellId::ONE) && answered.values().any(|c| *c == two()),
        "the moved users traded in both cells: {answered:?}"
    );
    for req_id in answered.keys() {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM events WHERE aggregate_type = 'Transfer' AND aggregate_id = $1",
        )
        .bind(req_id)
        .fetch_one(&cells.two.db.pool)
        .await
        .unwrap();
        assert!(
            n > 0,
            "{req_id}, answered by cell {}, is in cell 2",
            answered[req_id]
        );
    }

    // A cid sent before the move and retried after it: the first answer, from the new cell.
    let again = cells
        .two
        .coordinator
        .submit(transfer(
            movers[0],
            AccountType::Funding,
            "7",
            Some("across".into()),
        ))
        .await
        .unwrap();
    assert_eq!(again.req_id, first.req_id, "the original answer");
    // The old cell takes no write of the moved users: its process with the old map is refused.
    let stale = cells
        .one
        .coordinator
        .submit(transfer(movers[1], AccountType::Funding, "1", None))
        .await;
    assert!(
        stale.as_ref().is_err_and(CoordinatorError::is_fenced),
        "{stale:?}"
    );
    cells.assert_exact().await;
}

#[tokio::test]
async fn cells_move_011_a_cancel_after_spot_moved_leaves_the_partition_whole_in_its_source() {
    let cells = Cells::start().await;
    let p = moving();
    let movers = users_of(p, 2);
    for u in &movers {
        cells.one.deposit(*u, "USDT", "100").await;
        cells
            .one
            .transfer(*u, AccountType::Funding, AccountType::Spot, "USDT", "40")
            .await;
    }
    let runner = cells.runner();
    let id = MoveId("m-cancel".into());
    let mut record = runner
        .start(id.clone(), p, CellId::ONE, two(), 1)
        .await
        .unwrap();
    while record.step != MoveStep::Verifying {
        record = runner.step(record).await.unwrap();
    }
    runner
        .cancel(&id, "the operator changed their mind")
        .await
        .unwrap();
    let end = runner.drive(&id).await.unwrap();
    assert_eq!(end.step, MoveStep::Cancelled);
    for u in &movers {
        assert_eq!(cells.one.funding_balance(*u, "USDT").await, dec("60"));
        assert_eq!(cells.one.spot_balance(*u, "USDT").await, dec("40"));
        cells
            .one
            .transfer(*u, AccountType::Spot, AccountType::Funding, "USDT", "1")
            .await;
    }
    assert_eq!(owner(&cells.one, movers[0]).await, CellId::ONE);
    cells.assert_exact().await;
}

#[tokio::test]
async fn cells_move_012_a_move_resumed_by_a_new_runner_after_every_step_and_a_spot_core_sigkill_ends_the_same(
) {
    let mut cells = Cells::start().await;
    let p = moving();
    let movers = users_of(p, 2);
    for u in &movers {
        cells.one.deposit(*u, "USDT", "100").await;
        cells
            .one
            .transfer(*u, AccountType::Funding, AccountType::Spot, "USDT", "25")
            .await;
    }
    let id = MoveId("m-resume".into());
    let mut record = cells
        .runner()
        .start(id.clone(), p, CellId::ONE, two(), 1)
        .await
        .unwrap();
    // A new runner (a restarted process) for every step, from the record alone.
    while record.step != MoveStep::MovingSpot {
        let runner = cells.runner();
        let stored = PgMoves::new(cells.one.db.pool.clone());
        let reloaded = application::moves::MoveRecords::load(&stored, &id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reloaded, record, "the record is what the last step saved");
        record = runner.step(reloaded).await.unwrap();
    }
    // The target's engine dies at the SPOT step; the move waits for it and then goes on.
    cells.two.spot.kill();
    let runner = cells.runner();
    let driving = tokio::spawn({
        let id = id.clone();
        async move { runner.drive(&id).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!driving.is_finished(), "waits for the engine");
    cells.two.spot.restart();
    let end = tokio::time::timeout(Duration::from_secs(60), driving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Done, "{:?}", end.reason);
    for u in &movers {
        assert_eq!(held(&cells.two, *u).await, dec("100"));
        assert_eq!(cells.two.spot_balance(*u, "USDT").await, dec("25"));
    }
    cells.assert_exact().await;
}

#[tokio::test]
async fn cells_move_015_a_move_cancelled_mid_copy_leaves_no_open_copy_behind_in_its_target() {
    let mut cells = Cells::start().await;
    let p = moving();
    let u = users_of(p, 1)[0];
    cells.one.deposit(u, "USDT", "100").await;
    // The source's engine down: the transfer stays open, copied as it is.
    cells.one.spot.kill();
    let open = cells
        .one
        .coordinator
        .submit(transfer(u, AccountType::Funding, "10", None))
        .await
        .unwrap();
    assert!(!open.state.is_terminal(), "{open:?}");
    let runner = cells.runner();
    let id = MoveId("m-void".into());
    let mut record = runner
        .start(id.clone(), p, CellId::ONE, two(), 1)
        .await
        .unwrap();
    while record.step != MoveStep::CatchingUp {
        record = runner.step(record).await.unwrap();
    }
    let copied: i64 = sqlx::query_scalar("SELECT count(*) FROM open_transfers")
        .fetch_one(&cells.two.db.pool)
        .await
        .unwrap();
    assert_eq!(copied, 1, "the open transfer was copied as it is");
    runner.cancel(&id, "test").await.unwrap();
    assert_eq!(runner.drive(&id).await.unwrap().step, MoveStep::Cancelled);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM open_transfers")
        .fetch_one(&cells.two.db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "no open copy holds the target's horizon");
    cells.one.spot.restart();
    let ended = cells.one.coordinator.resume(&open.req_id).await.unwrap();
    assert!(ended.data.state.is_terminal(), "{ended:?}");
    assert_eq!(held(&cells.one, u).await, dec("100"));
    cells.assert_exact().await;
}

#[tokio::test]
async fn cells_move_019_a_copied_event_that_differs_is_found_before_the_pause_and_nothing_switches()
{
    let cells = Cells::start().await;
    let p = moving();
    let movers = users_of(p, 2);
    for u in &movers {
        cells.one.deposit(*u, "USDT", "100").await;
        cells
            .one
            .transfer(*u, AccountType::Funding, AccountType::Spot, "USDT", "40")
            .await;
    }
    let runner = cells.runner();
    let id = MoveId("m-forged".into());
    let mut record = runner
        .start(id.clone(), p, CellId::ONE, two(), 1)
        .await
        .unwrap();
    while record.step != MoveStep::Pausing {
        record = runner.step(record).await.unwrap();
    }
    // One event of the history the copy carried, as the target holds it, is not the source's:
    // its key's sequence differs. The pause compares the copied prefix before it freezes.
    let forged = sqlx::query(
        "UPDATE events SET sequence = sequence + 100 WHERE feed_position =
             (SELECT min(feed_position) FROM events WHERE user_id = $1)",
    )
    .bind(i64::try_from(movers[0]).unwrap())
    .execute(&cells.two.db.pool)
    .await
    .unwrap();
    assert_eq!(forged.rows_affected(), 1);
    let end = runner.drive(&id).await.unwrap();
    assert_eq!(end.step, MoveStep::Cancelled, "{end:?}");
    assert_eq!(end.cancelled_at, Some(MoveStep::Pausing));
    let reason = end.reason.unwrap();
    assert!(
        reason.contains(&format!("history of {} differs", movers[0])),
        "{reason}"
    );
    assert_eq!(owner(&cells.one, movers[0]).await, CellId::ONE);
    for u in &movers {
        assert_eq!(cells.one.funding_balance(*u, "USDT").await, dec("60"));
        assert_eq!(cells.one.spot_balance(*u, "USDT").await, dec("40"));
    }
    cells.one.assert_invariant_exact().await;
}
