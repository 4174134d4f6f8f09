//! One moves seed, scheduled by its random source: the cells and users set up, the fault phase
//! (steps and whole drives of moves by runners that may crash, users' writes and transfers,
//! starts, cancels, faults armed on the move's calls), then quiescence (faults healed, every
//! transfer ended, every move driven to its end) and the checks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use application::moves::{MoveError, MoveId, MoveRecord, MoveRunner, MoveSettings, MoveStep};
use application::testkit::faults::Script;
use application::testkit::moves::{MemMoves, MoveCall, MoveFault};
use application::testkit::{run, TestClock};
use cells::partition_of;
use domain::{ReqId, UserId};

use super::check::after_seed;
use super::config::{Config, Report};
use super::engines::{Engines, Leg};
use super::ports::{Hook, Interleaved};
use super::scene::{cell_id, Scene, ASSETS, START_MS};
use crate::rng::Rng;

/// Users per seed (their partitions are the ones that move).
const USERS: u64 = 24;
/// Scheduling rounds of the fault phase.
const ROUNDS: u32 = 300;
/// Moves at once, at most.
const AT_ONCE: usize = 2;

const SITES: [MoveCall; 11] = [
    MoveCall::Save,
    MoveCall::MarkIncoming,
    MoveCall::CopyBatch,
    MoveCall::Freeze,
    MoveCall::Unfreeze,
    MoveCall::VoidIncoming,
    MoveCall::Book,
    MoveCall::Switch,
    MoveCall::MoveOut,
    MoveCall::MoveIn,
    MoveCall::Balances,
];

const FAULTS: [(MoveFault, &str); 4] = [
    (MoveFault::Fail, "armed-fail"),
    (MoveFault::LoseAnswer, "armed-answer-lost"),
    (MoveFault::CrashBefore, "armed-crash-before"),
    (MoveFault::CrashAfter, "armed-crash-after"),
];

type Shared = Arc<Mutex<Scene>>;

fn lock(scene: &Shared) -> MutexGuard<'_, Scene> {
    // One thread: a poisoned lock only means a panic, which ends the seed anyway.
    scene.lock().unwrap_or_else(|e| e.into_inner())
}

/// The seed's run: what `moves::run` catches invariants around.
pub fn run_seed(seed: u64, config: &Config) -> Report {
    let mut rng = Rng::new(seed);
    let cells = config.cells.max(2);
    let world = MemMoves::new(cells, |p| u16::from(p.get()) % cells + 1);
    let mut world = world;
    world.batch = usize::try_from(rng.between(1, 4)).unwrap_or(1);
    let settings = MoveSettings {
        tail_max: rng.between(0, 3),
        max_passes: u32::try_from(rng.between(1, 5)).unwrap_or(1),
        retry: Duration::from_secs(1),
        drain_max: Duration::from_millis(rng.between(200, 1_500)),
        drain_poll: Duration::from_millis(20),
    };
    let clock = TestClock::default();
    let engines = Engines::new((1..=u64::from(cells)).map(cell_id), clock.clone());
    let scene: Shared = Arc::new(Mutex::new(Scene {
        rng,
        world: world.clone(),
        cells,
        users: (1..=USERS).filter_map(|n| UserId::new(n).ok()).collect(),
        expected: BTreeMap::new(),
        spot: BTreeMap::new(),
        open: Vec::new(),
        keys: 0,
        active: Vec::new(),
        operator: None,
        engines: engines.clone(),
        faults_on: true,
        violations: Vec::new(),
        counts: BTreeMap::new(),
        trace: config
            .trace
            .then(|| vec![format!("seed {seed}: {settings:?}")]),
    }));
    seed_users(&mut lock(&scene));
    let total = lock(&scene).total();
    let hooked = scene.clone();
    let hook: Hook = Arc::new(move |call| lock(&hooked).interleave(call));
    let runner = runner_over(&world, &engines, hook, &clock, &settings);
    // The operator's cancels mid-step: no faults, no hook (they run inside it).
    let mut clean = world.clone();
    clean.faults = Script::default();
    let operator = runner_over(&clean, &engines, Arc::new(|_| {}), &clock, &settings);
    lock(&scene).operator = Some(operator);
    let mut moves = Vec::new();
    for _ in 0..ROUNDS {
        act(&scene, &runner, &mut moves);
    }
    quiesce(&scene, &runner, &moves);
    let mut s = lock(&scene);
    let violations = after_seed(&mut s, &moves, &total);
    let mut report = tally(&world, &moves, seed);
    report.violations.append(&mut s.violations);
    report.violations.extend(violations);
    for v in &report.violations {
        s.note(|| format!("VIOLATION {v}"));
    }
    report.counts = std::mem::take(&mut s.counts);
    report.trace = s.trace.take().unwrap_or_default();
    report
}

/// Every user starts with a history of FUNDING writes and SPOT balances in their cell.
fn seed_users(s: &mut Scene) {
    for user in s.users.clone() {
        let Some(cell) = s.world.owner(user) else {
            continue;
        };
        for asset in ASSETS {
            let key = format!("seed-{user}-{asset}");
            if s.world.write(cell, &key, user, asset, 1_000) {
                s.expected
                    .entry(user)
                    .or_default()
                    .push((key, asset, 1_000));
            }
            s.keys += 1;
            let id = ReqId::from_parts(START_MS - 1, u128::from(s.keys)).to_string();
            if s.engines.leg(cell, &id, user, asset, 500) == Leg::Applied {
                *s.spot.entry((user, asset)).or_default() += 500;
            }
        }
    }
}

/// A runner over `world`'s cells and their `engines`, `hook` before each call.
fn runner_over(
    world: &MemMoves,
    engines: &Engines,
    hook: Hook,
    clock: &TestClock,
    settings: &MoveSettings,
) -> MoveRunner {
    let ports = Arc::new(Interleaved {
        inner: world.clone(),
        engines: engines.clone(),
        hook,
    });
    MoveRunner::new(
        ports.clone(),
        ports.clone(),
        ports.clone(),
        ports,
        Arc::new(clock.clone()),
        settings.clone(),
    )
}

/// One round of the fault phase: what the seed's source draws.
fn act(scene: &Shared, runner: &MoveRunner, moves: &mut Vec<MoveId>) {
    let (roll, target) = {
        let mut s = lock(scene);
        let active = s.active.clone();
        let pick = (!active.is_empty()).then(|| active[s.rng.index(active.len())].clone());
        (s.rng.below(100), pick)
    };
    match (roll, target) {
        (0..=39, Some(id)) => step(scene, runner, &id),
        (40..=57, _) => {
            let mut s = lock(scene);
            let n = s.rng.between(1, 3);
            for _ in 0..n {
                s.user_op();
            }
        }
        (58..=67, _) => start(scene, runner, moves),
        (68..=69, Some(id)) => {
            let answer = run(runner.cancel(&id, "operator"));
            let took = matches!(answer, Some(Ok(_)));
            lock(scene).note(|| format!("operator cancels {id}: {}", ended_as(took)));
            lock(scene).count(if took { "cancels" } else { "cancels-refused" });
        }
        (72..=83, _) => arm(&mut lock(scene)),
        (84..=87, Some(id)) => {
            let answer = run(runner.drive(&id));
            answered(scene, &id, answer.map(|a| a.map(|_| ())));
        }
        _ => lock(scene).close_some(300),
    }
}

fn ended_as(took: bool) -> &'static str {
    if took {
        "recorded"
    } else {
        "refused"
    }
}

/// One step of move `id` by a runner that may crash in it.
fn step(scene: &Shared, runner: &MoveRunner, id: &MoveId) {
    let Some(record) = lock(scene).world.record(id) else {
        return;
    };
    if record.step.is_end() {
        lock(scene).active.retain(|m| m != id);
        return;
    }
    let at = record.step;
    let answer = run(runner.step(record));
    lock(scene).note(|| format!("{id} step {}", at.as_str()));
    answered(scene, id, answer.map(|a| a.map(|_| ())));
}

/// What a runner's process came to: crashed (`None`), a failed call (the step runs again), or
/// the record moved on; an ended move leaves the active ones.
fn answered(scene: &Shared, id: &MoveId, answer: Option<Result<(), MoveError>>) {
    let mut s = lock(scene);
    match answer {
        None => {
            s.count("crashes");
            s.note(|| format!("{id}: the runner's process crashed"));
        }
        Some(Err(MoveError::Store(e))) => {
            s.count("calls-failed");
            s.note(|| format!("{id}: a call failed: {e}"));
        }
        Some(Err(MoveError::Superseded(_))) => s.count("superseded"),
        Some(Err(other)) => s.note(|| format!("{id}: {other}")),
        Some(Ok(())) => {}
    }
    let ended = s.world.record(id).is_none_or(|r| r.step.is_end());
    if ended {
        s.active.retain(|m| m != id);
        let step = s.world.record(id).map(|r| r.step);
        s.note(|| format!("{id} ended {step:?}"));
    }
}

/// Starts a move of a random user's partition from its owner to another cell, under the map
/// version the cells hold.
fn start(scene: &Shared, runner: &MoveRunner, moves: &mut Vec<MoveId>) {
    let (id, p, from, to, version) = {
        let mut guard = lock(scene);
        let s = &mut *guard;
        if s.active.len() >= AT_ONCE || moves.len() >= 8 {
            return;
        }
        let i = s.rng.index(s.users.len());
        let user = s.users[i];
        let Some(from) = s.world.owner(user) else {
            return;
        };
        let cells = u64::from(s.cells);
        let mut to = cell_id(s.rng.between(1, cells - 1));
        if to >= from {
            to = cell_id(u64::from(to.get()) + 1);
        }
        let version = (1..=cells)
            .map(|n| s.world.cell(cell_id(n)).map_version)
            .max()
            .unwrap_or(1);
        let id = MoveId(format!("m{}", moves.len() + 1));
        (id, partition_of(user), from, to, version)
    };
    let answer = run(runner.start(id.clone(), p, from, to, version));
    let mut s = lock(scene);
    match answer {
        Some(Ok(_)) => {
            s.note(|| format!("{id} starts: p{} from {from} to {to}", p.get()));
            s.count("moves-started");
            s.active.push(id.clone());
            moves.push(id);
        }
        Some(Err(e)) => s.note(|| format!("{id} not started: {e}")),
        None => s.count("crashes"),
    }
}

/// Arms a fault on a random call of the move's ports, a few calls ahead.
fn arm(s: &mut Scene) {
    let site = SITES[s.rng.index(SITES.len())];
    let (fault, kind) = FAULTS[s.rng.index(FAULTS.len())];
    let skip = u32::try_from(s.rng.below(4)).unwrap_or(0);
    s.world.faults.arm_after(site, skip, fault);
    s.count(kind);
    s.note(|| format!("FAULT {fault:?} armed at {site:?} after {skip}"));
}

/// The faults stop, every transfer ends, and every move is driven to its end.
fn quiesce(scene: &Shared, runner: &MoveRunner, moves: &[MoveId]) {
    {
        let mut s = lock(scene);
        s.faults_on = false;
        s.world.faults.heal_all();
        s.close_some(1000);
        s.note(|| "faults off: quiescence".to_owned());
    }
    for id in moves {
        for _ in 0..4 {
            let answer = run(runner.drive(id));
            let done = matches!(answer, Some(Ok(_)));
            answered(scene, id, answer.map(|a| a.map(|_| ())));
            if done {
                break;
            }
        }
    }
}

/// The moves' ends, counted.
fn tally(world: &MemMoves, moves: &[MoveId], seed: u64) -> Report {
    let mut report = Report {
        seed,
        moves: moves.len() as u64,
        ..Report::default()
    };
    for record in moves.iter().filter_map(|id| world.record(id)) {
        match record.step {
            MoveStep::Done => report.done += 1,
            MoveStep::Cancelled => {
                report.cancelled += 1;
                cancelled(&mut report, &record);
            }
            _ => {}
        }
    }
    report
}

/// A cancelled move's cause; the check before the switch failing is a violation.
fn cancelled(report: &mut Report, record: &MoveRecord) {
    let reason = record.reason.clone().unwrap_or_default();
    if reason.starts_with("check before the switch") {
        report.cancelled_by_check += 1;
        report.violations.push(format!(
            "move {} of p{} ({} to {}): {reason}",
            record.id,
            record.partition.get(),
            record.from,
            record.to
        ));
    } else if reason.contains("still open") {
        report.cancelled_by_drain += 1;
    }
}
