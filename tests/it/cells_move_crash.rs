//! A partition move across a crash of every other process at every step (ADR 0023 §4, issue 51):
//! the spot-core of the source, the spot-core of the target (SIGKILL, started again on its WAL),
//! the PostgreSQL of the source and of the target (a private cluster each time, stopped with
//! `-m immediate` and started again; the machine's server is never touched). For each step of
//! the move a partition of its own is moved from cell 1 to cell 2: the move is run up to that
//! step by the runner, the process dies as the step's work is about to run, the move is driven
//! on (a failed step runs again, as the move worker does) and the process comes back. Then the
//! move has ended DONE or CANCELLED, the partition is owned by exactly one cell (both maps say
//! so, STEADY; the other cell's fence refuses its users), every user's money is whole in the
//! owner, a cid sent before the move and retried after it gets its original req_id there, both
//! cells' conservation checks are exact and both feeds dense.

use std::time::Duration;

use application::moves::{MoveError, MoveId, MoveRecord, MoveRunner, MoveStep};
use cells::{partition_of, CellId, Partition};
use domain::{AccountType, UserId};
use rust_decimal::Decimal;
use tests::pg_solo::PgSolo;

use crate::cells_moves::{held, owner, transfer, two, users_of, Cells};
use crate::helpers::{dec, SpotProcess, Stack, TestDb};

/// The steps a move's work runs at, in order (a crash is injected at each one).
const STEPS: [MoveStep; 7] = [
    MoveStep::Planned,
    MoveStep::Copying,
    MoveStep::CatchingUp,
    MoveStep::Pausing,
    MoveStep::MovingSpot,
    MoveStep::Verifying,
    MoveStep::Switching,
];

/// The process a test kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    SourceSpot,
    TargetSpot,
    SourcePg,
    TargetPg,
}

/// How long the killed process stays down while the move goes on.
const DOWN: Duration = Duration::from_millis(400);

/// The two cells, the database of the victim's side on a private cluster when it is a
/// PostgreSQL (the cluster is returned, to live as long as the test).
async fn cells_for(victim: Victim) -> (Cells, Option<PgSolo>) {
    let cluster = match victim {
        Victim::SourcePg | Victim::TargetPg => Some(
            tokio::task::spawn_blocking(PgSolo::start)
                .await
                .unwrap()
                .expect("a private PostgreSQL cluster"),
        ),
        _ => None,
    };
    let db = |private: bool| {
        let cluster = cluster.as_ref();
        async move {
            match cluster {
                Some(c) if private => TestDb::on_cluster(c).await,
                _ => TestDb::new().await,
            }
        }
    };
    let one = Stack::over(db(victim == Victim::SourcePg).await, SpotProcess::start());
    let two = Stack::over(db(victim == Victim::TargetPg).await, SpotProcess::start());
    (Cells::over(one, two).await, cluster)
}

/// Kills the victim and starts it again after [`DOWN`], while `drive` runs.
async fn crash_during<T>(
    cells: &mut Cells,
    cluster: Option<&PgSolo>,
    victim: Victim,
    drive: tokio::task::JoinHandle<T>,
) -> T {
    match victim {
        Victim::SourceSpot => cells.one.spot.kill(),
        Victim::TargetSpot => cells.two.spot.kill(),
        Victim::SourcePg | Victim::TargetPg => {
            cluster.expect("the cluster").stop_immediate().unwrap();
        }
    }
    tokio::time::sleep(DOWN).await;
    match victim {
        Victim::SourceSpot => cells.one.spot.restart(),
        Victim::TargetSpot => cells.two.spot.restart(),
        Victim::SourcePg | Victim::TargetPg => {
            let c = cluster.expect("the cluster");
            c.start_again()
                .unwrap_or_else(|e| panic!("restart: {e:#}\n{}", c.log()));
        }
    }
    tokio::time::timeout(Duration::from_secs(60), drive)
        .await
        .expect("the move ends within 60 s of the process coming back")
        .unwrap()
}

/// Drives move `id` to its end as the move worker does: a step that fails runs again (inside
/// `drive`), and a `drive` that could not even read the record (its database down) is started
/// again.
async fn drive_to_end(runner: MoveRunner, id: MoveId) -> MoveRecord {
    loop {
        match runner.drive(&id).await {
            Ok(end) => return end,
            Err(MoveError::Store(_) | MoveError::Superseded(_)) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("move {id}: {other}"),
        }
    }
}

/// The steps of `record` run one at a time until `at` is recorded (its work not yet run).
async fn run_up_to(runner: &MoveRunner, mut record: MoveRecord, at: MoveStep) -> MoveRecord {
    while record.step != at {
        assert!(!record.step.is_end(), "{record:?} ended before {at:?}");
        record = runner.step(record).await.unwrap();
    }
    record
}

/// The map version cell 1 holds now (the next move is planned on it).
async fn version(stack: &Stack) -> u64 {
    let v: i64 = sqlx::query_scalar("SELECT map_version FROM cell_identity")
        .fetch_one(&stack.db.pool)
        .await
        .unwrap();
    u64::try_from(v).unwrap()
}

/// Partition `p`'s row in `stack`'s map: its cell and state.
async fn row(stack: &Stack, p: Partition) -> (i32, String) {
    sqlx::query_as("SELECT cell_id, state FROM cell_partitions WHERE partition = $1")
        .bind(i16::from(p.get()))
        .fetch_one(&stack.db.pool)
        .await
        .unwrap()
}

/// One move of a partition of its own per step, the victim killed as that step's work is
/// about to run; every check of the module's doc after each.
async fn crash_at_every_step(victim: Victim) {
    let (mut cells, cluster) = cells_for(victim).await;
    let (mut done, mut cancelled) = (0, 0);
    for (k, at) in STEPS.into_iter().enumerate() {
        // Partitions 20.. are cell 1's (below 128) and hold no other test user.
        let p = Partition::new(20 + k as u64).unwrap();
        let u = users_of(p, 1)[0];
        assert_eq!(partition_of(UserId::new(u).unwrap()), p);
        cells.one.deposit(u, "USDT", "100").await;
        cells
            .one
            .transfer(u, AccountType::Funding, AccountType::Spot, "USDT", "30")
            .await;
        let cid = format!("across-{k}");
        let first = cells
            .one
            .coordinator
            .submit(transfer(u, AccountType::Funding, "7", Some(cid.clone())))
            .await
            .unwrap();
        assert!(first.state.is_terminal(), "{first:?}");

        let runner = cells.runner();
        let id = MoveId(format!("m-crash-{k}"));
        let planned = version(&cells.one).await;
        let record = runner
            .start(id.clone(), p, CellId::ONE, two(), planned)
            .await
            .unwrap();
        run_up_to(&runner, record, at).await;
        let driving = tokio::spawn(drive_to_end(runner.clone(), id.clone()));
        let crashed = std::time::Instant::now();
        let end = crash_during(&mut cells, cluster.as_ref(), victim, driving).await;
        eprintln!(
            "{victim:?} killed at {}: {} after {:.1} s",
            at.as_str(),
            end.step.as_str(),
            crashed.elapsed().as_secs_f64()
        );
        let ended = match end.step {
            MoveStep::Done => {
                done += 1;
                two()
            }
            MoveStep::Cancelled => {
                cancelled += 1;
                CellId::ONE
            }
            other => panic!("{victim:?} at {at:?}: the move is {other:?}"),
        };

        // One owner, in both maps, STEADY; the other cell refuses the partition's users.
        let expected = (i32::from(ended.get()), "STEADY".to_owned());
        for s in [&cells.one, &cells.two] {
            assert_eq!(row(s, p).await, expected, "{victim:?} at {at:?}");
            assert_eq!(owner(s, u).await, ended);
        }
        let other = if ended == CellId::ONE {
            two()
        } else {
            CellId::ONE
        };
        // The first tries may meet a pooled connection that the restarted PostgreSQL closed
        // (an unknown outcome that wrote nothing): tried again, bounded, until the cell answers.
        let mut tries = 0;
        let stale = loop {
            let answer = cells
                .stack(other)
                .coordinator
                .submit(transfer(u, AccountType::Funding, "1", None))
                .await;
            let dead_connection = matches!(&answer, Err(e) if format!("{e:?}").contains("communicating with database"));
            tries += 1;
            if !dead_connection || tries == 10 {
                break answer;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        assert!(
            stale
                .as_ref()
                .is_err_and(application::CoordinatorError::is_fenced),
            "{victim:?} at {at:?}: cell {other} took a write of a partition it does not own: \
             {stale:?}"
        );
        // Nothing created, lost or applied twice: the user's money whole in the owner.
        let home = cells.stack(ended);
        assert_eq!(held(home, u).await, dec("100"), "{victim:?} at {at:?}");
        assert_eq!(home.spot_balance(u, "USDT").await, dec("37"));
        assert_eq!(home.in_flight(u, "USDT").await, Decimal::ZERO);
        // The cid sent before the move, retried after it: the original answer.
        let again = home
            .coordinator
            .submit(transfer(u, AccountType::Funding, "7", Some(cid)))
            .await
            .unwrap();
        assert_eq!(again.req_id, first.req_id, "{victim:?} at {at:?}");
        assert_eq!(held(home, u).await, dec("100"), "not applied twice");
        // The owner takes new writes of the user.
        let next = home
            .coordinator
            .submit(transfer(u, AccountType::Spot, "2", None))
            .await
            .unwrap();
        assert!(next.state.is_terminal(), "{next:?}");
        cells.assert_exact().await;
    }
    // Every crash is ridden through: the move goes on, never back (nothing it checks differs
    // after a crash, and no transfer of the partition is open to hold its drain).
    assert_eq!(
        (done, cancelled),
        (STEPS.len(), 0),
        "{victim:?}: moves DONE and CANCELLED"
    );
}

#[tokio::test]
async fn cells_move_020_the_sources_spot_core_sigkilled_at_every_step_of_a_move() {
    crash_at_every_step(Victim::SourceSpot).await;
}

#[tokio::test]
async fn cells_move_021_the_targets_spot_core_sigkilled_at_every_step_of_a_move() {
    crash_at_every_step(Victim::TargetSpot).await;
}

#[tokio::test]
async fn cells_move_022_the_sources_postgresql_killed_at_every_step_of_a_move() {
    crash_at_every_step(Victim::SourcePg).await;
}

#[tokio::test]
async fn cells_move_023_the_targets_postgresql_killed_at_every_step_of_a_move() {
    crash_at_every_step(Victim::TargetPg).await;
}

/// Containment during a move (DESIGN §16, ADR 0023 §1): a third cell's PostgreSQL, no part of
/// a move of cell 1's partition to cell 2, is down when the move reaches its switch. The switch
/// writes the target and the source first ("a cell that is down gets it before it serves
/// again"), so the partition's users are the target's, and trade there, while the third cell
/// is down; the move ends DONE once it is back.
///
/// Ignored because it fails today: `PgPartitionStores::switch` reads every cell's map version
/// (`next_version`) before it writes any, so the third cell's outage keeps the partition
/// FROZEN in its source, and its users refused (503), for as long as that cell is down.
#[tokio::test]
#[ignore = "known containment bug: the switch reads every cell's map version first (next_version)"]
async fn cells_move_024_a_third_cells_postgresql_down_at_the_switch_holds_no_user_of_the_move() {
    let cluster = tokio::task::spawn_blocking(PgSolo::start)
        .await
        .unwrap()
        .expect("a private PostgreSQL cluster");
    let cells = Cells::over(Stack::start().await, Stack::start().await).await;
    let three = Stack::over(TestDb::on_cluster(&cluster).await, SpotProcess::start());
    crate::cells_moves::as_cell(&three, 3).await;
    let three_id = CellId::new(3).unwrap();
    let runner = cells.runner_with(&[(three_id, &three)]);
    let p = Partition::new(40).unwrap();
    let u = users_of(p, 1)[0];
    cells.one.deposit(u, "USDT", "100").await;
    let id = MoveId("m-third-down".into());
    let record = runner
        .start(id.clone(), p, CellId::ONE, two(), 1)
        .await
        .unwrap();
    run_up_to(&runner, record, MoveStep::Switching).await;
    cluster.stop_immediate().unwrap();
    let driving = tokio::spawn(drive_to_end(runner.clone(), id.clone()));
    // The target and the source switched while the third cell is down.
    let mut switched = false;
    for _ in 0..50 {
        if row(&cells.one, p).await == (2, "STEADY".to_owned())
            && row(&cells.two, p).await == (2, "STEADY".to_owned())
        {
            switched = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let source_row = row(&cells.one, p).await;
    cluster.start_again().unwrap();
    let end = tokio::time::timeout(Duration::from_secs(60), driving)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Done);
    assert!(
        switched,
        "5 s into the third cell's outage the partition is still {source_row:?} in its source"
    );
    cells.assert_exact().await;
}

/// A process that did not reach every cell of the map (a cell's database down when it started)
/// neither pauses nor switches a move: it would write the new map version into the cells it
/// has and leave the others on the old map, under a version it computed without them (found
/// by the chaos run with network faults: two maps under one version). The step fails and is
/// retried, the partition stays live; a process that reaches every cell ends the move.
#[tokio::test]
async fn cells_move_025_a_process_missing_a_cell_of_the_map_neither_pauses_nor_switches_a_move() {
    let cells = Cells::over(Stack::start().await, Stack::start().await).await;
    let three = Stack::start().await;
    crate::cells_moves::as_cell(&three, 3).await;
    // The map names cell 3 too: partition 255 is its own, in every cell's map.
    for s in [&cells.one, &cells.two, &three] {
        sqlx::query("UPDATE cell_partitions SET cell_id = 3 WHERE partition = 255")
            .execute(&s.db.pool)
            .await
            .unwrap();
    }
    let p = Partition::new(41).unwrap();
    let u = users_of(p, 1)[0];
    cells.one.deposit(u, "USDT", "100").await;
    let id = MoveId("m-missing-cell".into());
    let partial = cells.runner();
    let record = partial
        .start(id.clone(), p, CellId::ONE, two(), 1)
        .await
        .unwrap();
    let record = run_up_to(&partial, record, MoveStep::Pausing).await;
    let refused = partial.step(record).await;
    assert!(
        matches!(&refused, Err(MoveError::Store(e)) if e.to_string().contains("not reached")),
        "{refused:?}"
    );
    assert_eq!(row(&cells.one, p).await, (1, "STEADY".to_owned()));
    let whole = cells.runner_with(&[(CellId::new(3).unwrap(), &three)]);
    let end = tokio::time::timeout(Duration::from_secs(60), drive_to_end(whole, id))
        .await
        .unwrap();
    assert_eq!(end.step, MoveStep::Done, "{:?}", end.reason);
    for s in [&cells.one, &cells.two, &three] {
        assert_eq!(row(s, p).await, (2, "STEADY".to_owned()));
    }
    assert_eq!(held(&cells.two, u).await, dec("100"));
    cells.assert_exact().await;
}
