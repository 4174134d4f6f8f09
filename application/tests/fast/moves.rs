//! Moving a partition (`application::moves`, ADR 0023 §4) over `testkit::moves::MemMoves`: the
//! whole move, a crash and a lost answer at every call of every step, a cancel at every step
//! before the switch, two moves of one partition, writes during the copy, and the planted bug
//! "the source accepts a write after the pause began", which the check before the switch finds.
//! After each, the money is exact: no asset's total across the cells changed, and the partition
//! is whole in exactly one cell.

use std::collections::BTreeMap;
use std::sync::Arc;

use application::moves::{MoveError, MoveId, MoveRecord, MoveRunner, MoveSettings, MoveStep};
use application::testkit::moves::{MemMoves, MoveCall, MoveFault, PartState};
use application::testkit::{run, TestClock};
use cells::{partition_of, CellId, Partition};
use domain::UserId;

const SOURCE: CellId = CellId::ONE;

fn target() -> CellId {
    CellId::new(2).unwrap()
}

fn user(n: u64) -> UserId {
    UserId::new(n).unwrap()
}

/// The partition that moves: user 1's.
fn moving() -> Partition {
    partition_of(user(1))
}

/// The first `n` users of partition `p`.
fn users_of(p: Partition, n: usize) -> Vec<UserId> {
    (1..)
        .map(user)
        .filter(|u| partition_of(*u) == p)
        .take(n)
        .collect()
}

/// A user of another partition that the source also owns.
fn bystander() -> UserId {
    (2..)
        .map(user)
        .find(|u| partition_of(*u) != moving() && partition_of(*u).get().is_multiple_of(2))
        .unwrap()
}

/// Two cells: the moving partition and the even ones in the source, the rest in the target;
/// a history of FUNDING movements and SPOT balances for the moving partition's users and a
/// bystander.
fn world() -> MemMoves {
    let p = moving();
    let world = MemMoves::new(2, |q| {
        if q == p || q.get().is_multiple_of(2) {
            1
        } else {
            2
        }
    });
    for (i, u) in users_of(p, 3).into_iter().enumerate() {
        for k in 0..4 {
            let amount = 100 - i64::from(k);
            assert!(world.write(SOURCE, &format!("t{i}-{k}"), u, "USDT", amount));
        }
        assert!(world.write(SOURCE, &format!("b{i}"), u, "BTC", 2));
        world.spot_credit(SOURCE, u, "USDT", 50 + i64::try_from(i).unwrap());
    }
    assert!(world.write(SOURCE, "x", bystander(), "USDT", 7));
    world.spot_credit(SOURCE, bystander(), "USDT", 9);
    world
}

fn runner(world: &MemMoves, settings: MoveSettings) -> MoveRunner {
    let w = Arc::new(world.clone());
    MoveRunner::new(
        w.clone(),
        w.clone(),
        w.clone(),
        w,
        Arc::new(TestClock::default()),
        settings,
    )
}

fn start(world: &MemMoves) -> MoveId {
    let id = MoveId("m1".into());
    let r = runner(world, MoveSettings::default());
    run(r.start(id.clone(), moving(), SOURCE, target(), 1))
        .unwrap()
        .unwrap();
    id
}

/// Every call of the move's ports that a forward move makes, where a fault is armed.
const SITES: [MoveCall; 9] = [
    MoveCall::Save,
    MoveCall::MarkIncoming,
    MoveCall::CopyBatch,
    MoveCall::Freeze,
    MoveCall::MoveOut,
    MoveCall::MoveIn,
    MoveCall::Book,
    MoveCall::Balances,
    MoveCall::Switch,
];

/// Drives `id` to its end, a new process after each crash; answers the end and the crashes.
fn drive_through_crashes(world: &MemMoves, id: &MoveId) -> (MoveRecord, usize) {
    for crashes in 0..50 {
        if let Some(answer) = run(runner(world, MoveSettings::default()).drive(id)) {
            return (answer.expect("a move ends"), crashes);
        }
    }
    panic!("the move never ended");
}

/// What the source held before: its book of the partition, the SPOT balances, every total.
struct Before {
    book: application::moves::PartitionBook,
    spot: BTreeMap<(UserId, String), rust_decimal::Decimal>,
    total: BTreeMap<String, rust_decimal::Decimal>,
}

fn before(world: &MemMoves) -> Before {
    let spot = world
        .cell(SOURCE)
        .spot
        .into_iter()
        .filter(|((u, _), _)| partition_of(*u) == moving())
        .collect();
    Before {
        book: world.book(SOURCE, moving()),
        spot,
        total: world.total(),
    }
}

/// `cell`'s engine's non-zero SPOT balances of the moving partition.
fn spot_of(world: &MemMoves, cell: CellId) -> BTreeMap<(UserId, String), rust_decimal::Decimal> {
    let spot = world.cell(cell).spot;
    spot.into_iter()
        .filter(|((u, _), v)| partition_of(*u) == moving() && !v.is_zero())
        .collect()
}

/// The partition is the target's, whole, and nothing else changed.
fn moved(world: &MemMoves, was: &Before) {
    let p = moving();
    assert_eq!(world.total(), was.total, "no asset's total changed");
    assert_eq!(
        world.book(target(), p),
        was.book,
        "the target holds the source's book"
    );
    assert_eq!(
        world.book(SOURCE, p),
        Default::default(),
        "the source counts nothing of it"
    );
    assert_eq!(spot_of(world, target()), was.spot, "SPOT balances arrived");
    assert!(spot_of(world, SOURCE).is_empty(), "no SPOT left behind");
    assert_eq!(world.cell(SOURCE).parts.get(&p), Some(&PartState::Moved));
    assert_eq!(world.cell(target()).parts.get(&p), Some(&PartState::Owned));
    for cell in [SOURCE, target()] {
        assert_eq!(world.cell(cell).map_version, 2);
        assert_eq!(
            world.cell(cell).moved_logged.len(),
            1,
            "one PartitionMoved in each log"
        );
    }
    assert!(world.held().0.is_empty(), "the front holds nothing");
    let u = users_of(p, 1)[0];
    assert!(
        !world.write(SOURCE, "late", u, "USDT", 1),
        "the old cell refuses the moved users"
    );
    assert_eq!(world.owner(u), Some(target()));
    assert_eq!(world.owner(bystander()), Some(SOURCE));
}

/// The partition is whole in the source, as before the move.
fn stayed(world: &MemMoves, was: &Before) {
    let p = moving();
    assert_eq!(world.total(), was.total, "no asset's total changed");
    assert_eq!(
        world.book(SOURCE, p),
        was.book,
        "the source's book is whole"
    );
    assert_eq!(
        world.book(target(), p),
        Default::default(),
        "the target counts nothing of it"
    );
    assert_eq!(spot_of(world, SOURCE), was.spot, "SPOT balances are back");
    assert!(spot_of(world, target()).is_empty());
    assert_eq!(world.cell(SOURCE).parts.get(&p), Some(&PartState::Owned));
    assert_eq!(world.cell(target()).parts.get(&p), None);
    for cell in [SOURCE, target()] {
        assert_eq!(world.cell(cell).map_version, 1, "the map did not change");
    }
    assert!(world.held().0.is_empty(), "the front holds nothing");
    assert!(
        world.write(SOURCE, "after", users_of(p, 1)[0], "USDT", 0),
        "the source writes again"
    );
}

#[test]
fn a_move_copies_the_history_moves_spot_and_switches_the_map() {
    let world = world();
    let was = before(&world);
    let id = start(&world);
    let end = run(runner(&world, MoveSettings::default()).drive(&id))
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Done);
    assert_eq!(end.copied, 15, "every row of the partition copied once");
    moved(&world, &was);
    let holds = world.held().1;
    assert_eq!(
        holds,
        vec![(moving(), true), (moving(), false)],
        "held once, released once"
    );
}

#[test]
fn a_crash_before_or_after_any_call_of_any_step_resumes_to_the_same_end() {
    for site in SITES {
        for fault in [MoveFault::CrashBefore, MoveFault::CrashAfter] {
            for skip in 0..4 {
                let world = world();
                let was = before(&world);
                let id = start(&world);
                world.faults.arm_after(site, skip, fault);
                let (end, _) = drive_through_crashes(&world, &id);
                assert_eq!(end.step, MoveStep::Done, "{site:?} {fault:?} after {skip}");
                moved(&world, &was);
            }
        }
    }
}

#[test]
fn a_failed_call_or_a_lost_answer_at_any_step_is_retried_until_it_answers() {
    for site in SITES {
        for fault in [MoveFault::Fail, MoveFault::LoseAnswer] {
            let world = world();
            let was = before(&world);
            let id = start(&world);
            world.faults.arm_after(site, 1, fault);
            world.faults.arm(site, fault);
            let end = run(runner(&world, MoveSettings::default()).drive(&id))
                .unwrap()
                .unwrap();
            assert_eq!(end.step, MoveStep::Done, "{site:?} {fault:?}");
            moved(&world, &was);
        }
    }
}

/// Steps move `id` until its record is at `at`.
fn step_until(world: &MemMoves, id: &MoveId, at: MoveStep) {
    let r = runner(world, MoveSettings::default());
    while world.record(id).unwrap().step != at {
        let record = world.record(id).unwrap();
        assert!(!record.step.is_end(), "{at:?} never reached");
        run(r.step(record)).unwrap().unwrap();
    }
}

#[test]
fn a_cancel_at_any_step_before_the_switch_leaves_the_partition_whole_in_its_source() {
    let steps = [
        MoveStep::Planned,
        MoveStep::Copying,
        MoveStep::CatchingUp,
        MoveStep::Pausing,
        MoveStep::MovingSpot,
        MoveStep::Verifying,
    ];
    for at in steps {
        for mid_step in [false, true] {
            let world = world();
            let was = before(&world);
            let id = start(&world);
            step_until(&world, &id, at);
            if mid_step {
                // the step's work ran, and the process died before recording the next step
                let record = world.record(&id).unwrap();
                world.faults.arm(MoveCall::Save, MoveFault::CrashBefore);
                assert!(run(runner(&world, MoveSettings::default()).step(record)).is_none());
                world.faults.heal_all();
            }
            let r = runner(&world, MoveSettings::default());
            let cancelling = run(r.cancel(&id, "operator")).unwrap().unwrap();
            assert_eq!(cancelling.step, MoveStep::Cancelling);
            assert_eq!(cancelling.cancelled_at, Some(at));
            world
                .faults
                .arm_after(MoveCall::MoveIn, 1, MoveFault::CrashAfter);
            let (end, _) = drive_through_crashes(&world, &id);
            assert_eq!(end.step, MoveStep::Cancelled, "cancel at {at:?}");
            stayed(&world, &was);
            let again = run(r.start(MoveId("m2".into()), moving(), SOURCE, target(), 1)).unwrap();
            assert!(again.is_ok(), "a cancelled move frees its partition");
        }
    }
}

#[test]
fn a_move_that_has_begun_its_switch_cannot_be_cancelled() {
    let world = world();
    let was = before(&world);
    let id = start(&world);
    step_until(&world, &id, MoveStep::Switching);
    let r = runner(&world, MoveSettings::default());
    let refused = run(r.cancel(&id, "too late")).unwrap();
    assert!(
        matches!(refused, Err(MoveError::NotCancellable(_, "SWITCHING"))),
        "{refused:?}"
    );
    run(r.drive(&id)).unwrap().unwrap();
    moved(&world, &was);
    assert!(matches!(
        run(r.cancel(&id, "x")).unwrap(),
        Err(MoveError::NotCancellable(_, "DONE"))
    ));
}

#[test]
fn two_moves_of_one_partition_never_run_at_once() {
    let world = world();
    let id = start(&world);
    let r = runner(&world, MoveSettings::default());
    let second = run(r.start(MoveId("m2".into()), moving(), SOURCE, target(), 1)).unwrap();
    assert!(
        matches!(second, Err(MoveError::Busy(_, ref other)) if *other == id),
        "{second:?}"
    );
    let same = run(r.start(MoveId("m3".into()), moving(), SOURCE, SOURCE, 1)).unwrap();
    assert!(matches!(same, Err(MoveError::SameCell(_))));
}

#[test]
fn writes_during_the_copy_are_caught_up_and_writes_after_the_pause_are_refused() {
    let world = world();
    let id = start(&world);
    let p = moving();
    let mover = users_of(p, 1)[0];
    let r = runner(
        &world,
        MoveSettings {
            tail_max: 0,
            ..MoveSettings::default()
        },
    );
    let mut n = 0;
    let mut refused_after_pause = 0;
    loop {
        let record = world.record(&id).unwrap();
        if record.step.is_end() {
            break;
        }
        n += 1;
        let wrote = world.write(SOURCE, &format!("live{n}"), mover, "USDT", 1);
        let frozen = world.cell(SOURCE).parts.get(&p) == Some(&PartState::Frozen);
        assert_eq!(
            wrote,
            !frozen && record.step < MoveStep::Switching,
            "at {:?}",
            record.step
        );
        if !wrote {
            refused_after_pause += 1;
        }
        assert!(
            world.write(SOURCE, &format!("other{n}"), bystander(), "USDT", 1),
            "others write"
        );
        run(r.step(record)).unwrap().unwrap();
    }
    assert!(refused_after_pause > 0);
    let end = world.record(&id).unwrap();
    assert_eq!(end.step, MoveStep::Done, "{:?}", end.reason);
    let live: usize = world.book(target(), p).history[&mover]
        .matches("live")
        .count();
    assert_eq!(
        live,
        n - refused_after_pause,
        "every write before the pause moved, once"
    );
}

#[test]
fn the_check_before_the_switch_finds_a_write_the_source_accepted_after_the_pause() {
    let mut world = world();
    world.plant_write_after_freeze = true;
    let was = before(&world);
    let id = start(&world);
    step_until(&world, &id, MoveStep::MovingSpot);
    let mover = users_of(moving(), 1)[0];
    assert!(
        world.write(SOURCE, "after-pause", mover, "USDT", 5),
        "the planted bug takes it"
    );
    let end = run(runner(&world, MoveSettings::default()).drive(&id))
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Cancelled, "the switch never happens");
    let reason = end.reason.unwrap();
    assert!(
        reason.contains("FUNDING") && reason.contains("history"),
        "{reason}"
    );
    assert_eq!(world.cell(SOURCE).map_version, 1);
    assert_eq!(world.owner(mover), Some(SOURCE));
    let mut total = was.total.clone();
    *total.get_mut("USDT").unwrap() += rust_decimal::Decimal::from(5);
    assert_eq!(
        world.total(),
        total,
        "the late write is counted once, in the source"
    );
}

#[test]
fn the_pause_drains_the_partitions_open_transfers_before_it_freezes() {
    use application::moves::{Freeze, PartitionStores};
    let world = world();
    let was = before(&world);
    let u = users_of(moving(), 1)[0];
    world.open_transfers(SOURCE, u, 1);
    let id = start(&world);
    step_until(&world, &id, MoveStep::Pausing);
    let record = world.record(&id).unwrap();
    assert_eq!(
        run(PartitionStores::freeze(&world, &record))
            .unwrap()
            .unwrap(),
        Freeze::Draining { open: 1 },
        "an open transfer keeps the partition draining"
    );
    assert!(
        !world.write(SOURCE, "new", u, "USDT", 1),
        "nothing new starts while draining"
    );
    assert!(
        world.write(SOURCE, "y", bystander(), "USDT", 0),
        "other partitions write on"
    );
    world.open_transfers(SOURCE, u, -1);
    let end = run(runner(&world, MoveSettings::default()).drive(&id))
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Done, "{:?}", end.reason);
    moved(&world, &was);
}

#[test]
fn a_partition_whose_transfers_do_not_end_within_the_drain_is_rolled_back_whole() {
    let world = world();
    let was = before(&world);
    let u = users_of(moving(), 1)[0];
    world.open_transfers(SOURCE, u, 1);
    let id = start(&world);
    let settings = MoveSettings {
        drain_max: std::time::Duration::from_millis(200),
        ..MoveSettings::default()
    };
    let end = run(runner(&world, settings).drive(&id)).unwrap().unwrap();
    assert_eq!(end.step, MoveStep::Cancelled);
    assert_eq!(end.cancelled_at, Some(MoveStep::Pausing));
    assert!(
        end.reason.as_deref().unwrap_or("").contains("still open"),
        "{:?}",
        end.reason
    );
    stayed(&world, &was);
}

#[test]
fn a_move_out_the_engine_refuses_rolls_the_move_back_instead_of_retrying_it_frozen() {
    let mut world = world();
    world.refuse_move_out = true;
    let was = before(&world);
    let id = start(&world);
    let end = run(runner(&world, MoveSettings::default()).drive(&id))
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Cancelled);
    assert_eq!(end.cancelled_at, Some(MoveStep::MovingSpot));
    assert!(
        end.reason
            .as_deref()
            .unwrap_or("")
            .contains("refused the move-out"),
        "{:?}",
        end.reason
    );
    stayed(&world, &was);
}

/// The position of the target's copy of `user`'s row keyed `key`.
fn copy_of(world: &MemMoves, key: &str) -> u64 {
    world
        .cell(target())
        .rows
        .iter()
        .find(|r| r.key == key && r.copied_by.is_some())
        .map(|r| r.pos)
        .expect("the row was copied")
}

#[test]
fn a_copied_event_that_differs_before_the_cut_is_found_before_the_pause() {
    let world = world();
    let was = before(&world);
    let id = start(&world);
    step_until(&world, &id, MoveStep::Pausing);
    // The first event of the history, as the target holds it, is not the source's.
    world.rewrite_key(target(), copy_of(&world, "t0-0"), "forged");
    let end = run(runner(&world, MoveSettings::default()).drive(&id))
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Cancelled, "the switch never happens");
    assert_eq!(
        end.cancelled_at,
        Some(MoveStep::Pausing),
        "found before the freeze"
    );
    let reason = end.reason.unwrap();
    assert!(
        reason.contains("before the pause") && reason.contains("history of"),
        "{reason}"
    );
    stayed(&world, &was);
}

#[test]
fn a_copied_event_that_differs_after_the_cut_is_found_by_the_check_before_the_switch() {
    let world = world();
    let id = start(&world);
    step_until(&world, &id, MoveStep::Pausing);
    // Written while the pause compares the prefixes: after the cut, copied under the pause.
    let mover = users_of(moving(), 1)[0];
    assert!(world.write(SOURCE, "late", mover, "USDT", 1));
    step_until(&world, &id, MoveStep::Verifying);
    let cut = world
        .record(&id)
        .unwrap()
        .history_cut
        .expect("the pause cut");
    let forged = copy_of(&world, "late");
    assert!(
        i64::try_from(forged).unwrap() > cut.target,
        "the late event is in the tail"
    );
    world.rewrite_key(target(), forged, "forged");
    let end = run(runner(&world, MoveSettings::default()).drive(&id))
        .unwrap()
        .unwrap();
    assert_eq!(end.step, MoveStep::Cancelled, "the switch never happens");
    assert_eq!(end.cancelled_at, Some(MoveStep::Verifying));
    let reason = end.reason.unwrap();
    assert!(
        reason.contains(&format!("history of {mover} differs")),
        "{reason}"
    );
}

#[test]
fn a_record_without_a_cut_is_checked_over_the_whole_history() {
    let world = world();
    let id = start(&world);
    step_until(&world, &id, MoveStep::Verifying);
    // A record written before the cut existed: the check reads every event again, and so
    // finds a difference in the prefix too.
    let mut record = world.record(&id).unwrap();
    record.history_cut = None;
    let r = runner(&world, MoveSettings::default());
    assert!(run(application::moves::MoveRecords::save(
        &world,
        MoveStep::Verifying,
        &record
    ))
    .unwrap()
    .unwrap());
    world.rewrite_key(target(), copy_of(&world, "t1-2"), "forged");
    let end = run(r.drive(&id)).unwrap().unwrap();
    assert_eq!(end.step, MoveStep::Cancelled);
    assert!(end.reason.unwrap().contains("history of"));
}
