//! One simulated run from a seed: two ledger processes (each a real `Coordinator` and a real
//! `RecoveryWorker`) over the in-memory ports, simulated users submitting and repeating
//! requests, an operator resolving transfers by hand, an admin freezing accounts and suspending
//! assets, and the faults drawn from the seed. Then quiescence (faults off, every account and
//! asset active again, recovery left to run) and the checks that must hold there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use adapters::SpotAdapter;
use application::plant::Bug;
use application::testkit::{
    Account, MemClientKeys, MemDailyReservations, MemLeases, MemLogApart, Status,
};
use application::{Coordinator, DailyLimits, Ports};
use domain::{AccountPort, AssetRegistry, AssetSymbol, ReqId, TransferState, UserId};
use recovery::{RecoveryConfig, RecoveryWorker};
use rust_decimal::Decimal;
use spot_core::assets::{Assets, DEFAULT_ASSETS_JSON};
use spot_core::engine::Engine;
use spot_core::protocol::{AccountStatus, Request};

use crate::actors::{spawn_admin, spawn_operator, spawn_users};
use crate::cast::{Ledger, ASSETS, LEDGERS, OUTSIDE, USERS};
use crate::exec::{Executor, ProcId, Role, Rt, Step};
use crate::ports::funded::SimFundedLog;
use crate::ports::funding::SimFunding;
use crate::ports::spot::SimSpot;
use crate::ports::Sim;
use crate::world::{short, Faults, World};

/// 2026-01-01T00:00:00Z: where simulated time starts.
pub const START_MS: u64 = 1_767_225_600_000;
/// Simulated time the fault phase lasts at least.
const FAULT_PHASE_MS: u64 = 40_000;
/// Simulated time recovery gets after the faults stop: longer than a manual resolution's lease
/// (2 minutes), which an operator killed mid-resolution leaves behind.
const QUIET_PHASE_MS: u64 = 300_000;
/// Polls after which a run is called stuck (a livelock is a finding too).
const STEPS_MAX: u64 = 2_000_000;

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Transfers the users request (repeats come on top).
    pub transfers: usize,
    pub plant: Option<Bug>,
    pub trace: bool,
    /// The tightest settings an operator can configure: the worker touches a transfer 50 ms
    /// after its last event (racing the request still driving it), leases of 1 s (the least
    /// `LEDGER_RECOVERY_LEASE_MS` allows), and an idempotency retention of 8 s (claims
    /// re-keyed within seconds).
    pub tight: bool,
    /// The users also send batches (`Coordinator::submit_many`, the bulk route's core): about
    /// half the requests go in batches of 2 to 6, some with an item repeated inside, and a
    /// repeated batch is sent whole again.
    pub bulk: bool,
    /// No faults at all (and no planted bug): a calm cell beside a faulted one (`cells`).
    pub calm: bool,
    /// A planted mismatch: halfway through the fault phase one unit appears in a FUNDING
    /// account with no movement behind it. The conservation check must find it and halt
    /// (`audit.rs`).
    pub tamper: bool,
}

/// What a run came to.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub seed: u64,
    pub violations: Vec<String>,
    pub faults: BTreeMap<&'static str, u64>,
    /// Transfers created.
    pub transfers: usize,
    pub steps: u64,
    pub trace: Vec<String>,
    /// Single requests that went in a round with others (`application/src/round.rs`), over
    /// every ledger process.
    pub shared_in_rounds: u64,
}

/// Fault rates from the seed: each run its own mix, some runs calm in one kind.
fn draw_faults(rt: &Rt) -> Faults {
    rt.with_rng(|r| {
        let mut rate = |max: u64| -> u32 {
            // A third of the runs leave a kind out entirely.
            if r.chance(333) {
                0
            } else {
                u32::try_from(r.between(1, max)).unwrap_or(0)
            }
        };
        Faults {
            store_fail_before: rate(60),
            store_fail_after: rate(60),
            store_delay: rate(40),
            net_unsent: rate(60),
            net_delay: rate(100),
            net_late: rate(60),
            net_duplicate: rate(60),
            net_answer_lost: rate(60),
            // These three per 10,000 scheduling steps.
            crash: rate(20),
            clock_jump: rate(20),
            lease_steal: rate(20),
        }
    })
}

fn registry() -> AssetRegistry {
    AssetRegistry::default_assets()
}

fn recovery_config(tight: bool) -> RecoveryConfig {
    RecoveryConfig {
        stale_after: Duration::from_millis(if tight { 50 } else { 1_500 }),
        interval: Duration::from_millis(700),
        batch_max: 50,
        concurrency_max: 4,
        lease: Duration::from_millis(if tight { 1_000 } else { 6_000 }),
        backoff_ms_base: 100,
        backoff_ms_max: 3_000,
        ..RecoveryConfig::default()
    }
}

fn start_worker(sim: &Sim, ledger: &Ledger, proc: ProcId, incarnation: u32) {
    let mut worker = RecoveryWorker::with_book(
        ledger.coordinator.clone(),
        recovery_config(ledger.tight),
        Arc::new(sim.book.clone()),
    );
    worker.id = format!("worker-{proc}.{incarnation}");
    sim.rt.spawn(proc, Role::Worker, worker.run());
}

/// Runs one seed. The product's invariants (`domain::invariant!`, spot-core's and the
/// application's) panic here instead of aborting the process: a broken one ends the seed at
/// its cause and is its violation, `INVARIANT ...` (the panic's own line on stderr says where).
/// Any other panic is the simulation's own bug and is passed on.
pub fn run(seed: u64, config: &Config) -> Report {
    // One switch for every crate's `invariant!` (the `invariant` crate's, behind each).
    domain::invariant::panic_instead();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_seed(seed, config)));
    match ran {
        Ok(report) => report,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !message.starts_with("invariant violated") {
                std::panic::resume_unwind(panic);
            }
            application::plant::set(None);
            Report {
                seed,
                violations: vec![format!("INVARIANT {message}")],
                faults: BTreeMap::new(),
                transfers: 0,
                steps: 0,
                trace: vec![format!("VIOLATION INVARIANT {message}")],
                shared_in_rounds: 0,
            }
        }
    }
}

/// One seed's run (see `run`).
// long: one seed read top to bottom (wiring, fault phase, quiescence, checks): the simulation's script, a test tool.
fn run_seed(seed: u64, config: &Config) -> Report {
    application::plant::set(if config.calm { None } else { config.plant });
    let rt = Rt::new(seed, START_MS);
    let drawn = draw_faults(&rt);
    let faults = if config.calm {
        Faults::default()
    } else {
        drawn
    };
    let assets = Assets::parse(DEFAULT_ASSETS_JSON)
        .unwrap_or_else(|e| unreachable!("the shipped asset list parses: {e}"));
    let mut world = World::new(Engine::new(assets), START_MS);
    world.faults = faults;
    if config.trace {
        world.trace = Some(vec![format!("seed {seed}: {:?}", world.faults)]);
    }
    let sim = Sim::new(rt.clone(), world);
    seed_balances(&sim);

    let ports = Ports {
        // Half the seeds write each creation with its claim and its charge (ADR 0022) and each
        // FUNDING movement with its events (ADR 0024: a co-located FUNDING), half claim,
        // charge, create and call FUNDING in separate steps (a log without either).
        log: match seed % 2 {
            0 => Arc::new(SimFundedLog { sim: sim.clone() }),
            _ => Arc::new(MemLogApart(sim.store.clone())),
        },
        claims: Arc::new(MemClientKeys(sim.store.clone())),
        leases: Arc::new(MemLeases(sim.store.clone())),
        limits: Arc::new(MemDailyReservations(sim.store.clone())),
        clock: Arc::clone(&sim.store.clock),
    };
    let funding: Arc<dyn AccountPort> = Arc::new(SimFunding { sim: sim.clone() });
    let spot: Arc<dyn AccountPort> =
        Arc::new(SpotAdapter::over(Arc::new(SimSpot { sim: sim.clone() })));
    let registry = Arc::new(RwLock::new(registry()));
    let limits = DailyLimits {
        count_max: Some(10_000),
        amount_max: BTreeMap::new(),
    };
    let ledgers: Vec<Ledger> = LEDGERS
        .iter()
        .map(|_| Ledger {
            coordinator: Coordinator::with_ports(
                ports.clone(),
                funding.clone(),
                spot.clone(),
                registry.clone(),
            )
            .with_daily_limits(limits.clone())
            // Short, so orphan client-key claims are re-keyed within a run (and the claim
            // guard of the log is exercised).
            .with_idempotency_retention(Duration::from_secs(if config.tight { 8 } else { 40 })),
            tight: config.tight,
        })
        .collect();
    let ledgers = Arc::new(ledgers);
    for (i, proc) in LEDGERS.iter().enumerate() {
        start_worker(&sim, &ledgers[i], *proc, 0);
    }
    let auditor = crate::audit::auditor(&sim, ledgers[0].coordinator.clone(), registry.clone());
    crate::audit::spawn_periodic(&sim, &auditor);
    let tamper_at = config.tamper.then_some(START_MS + FAULT_PHASE_MS / 2);
    let mut tampered = false;
    spawn_users(&sim, &ledgers, config.transfers, config.bulk);
    spawn_operator(&sim, &ledgers);
    spawn_admin(&sim, &registry);

    let mut exec = Executor::new(rt.clone());
    let mut incarnation = [0u32; 2];
    let mut down: BTreeSet<usize> = BTreeSet::new();
    let mut restart_at: BTreeMap<usize, u64> = BTreeMap::new();
    // The fault phase: until the users are done and the phase's time is over.
    loop {
        if exec.steps > STEPS_MAX {
            sim.world()
                .violation("the run did not settle (livelock?)".into());
            break;
        }
        let now = rt.now_ms();
        let users_done = exec.alive(Role::Client) == 0 && exec.alive(Role::Request) == 0;
        if users_done && now >= START_MS + FAULT_PHASE_MS {
            break;
        }
        if tamper_at.is_some_and(|at| now >= at) && !tampered {
            tamper(&sim);
            tampered = true;
        }
        // Restarts of crashed ledger processes that are due.
        let due: Vec<usize> = restart_at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(i, _)| *i)
            .collect();
        for i in due {
            restart_at.remove(&i);
            down.remove(&i);
            incarnation[i] += 1;
            sim.world()
                .note(|| format!("process {} restarts", LEDGERS[i]));
            start_worker(&sim, &ledgers[i], LEDGERS[i], incarnation[i]);
        }
        let f = sim.world().faults.clone();
        if f.crash > 0 && rt.with_rng(|r| r.below(10_000) < u64::from(f.crash)) {
            let i = rt.with_rng(|r| r.index(LEDGERS.len()));
            if !down.contains(&i) {
                let killed = exec.crash(LEDGERS[i]);
                sim.world()
                    .fault("crash", &format!("process {} ({killed} tasks)", LEDGERS[i]));
                down.insert(i);
                let back = rt.with_rng(|r| r.between(200, 6_000));
                restart_at.insert(i, now + back);
            }
        }
        if f.clock_jump > 0 && rt.with_rng(|r| r.below(10_000) < u64::from(f.clock_jump)) {
            let by = rt.with_rng(|r| r.between(500, 20_000));
            sim.world().fault("clock-jump", &format!("+{by}ms"));
            rt.jump(by);
            exec.fire_due();
        }
        if f.lease_steal > 0 && rt.with_rng(|r| r.below(10_000) < u64::from(f.lease_steal)) {
            // A lease that ends early: a second worker may take the transfer mid-drive.
            let mut w = sim.world();
            let now = w.now_ms;
            let rows = w.rows.clone();
            let mut rows = rows.lock();
            let held: Vec<ReqId> = rows
                .retries
                .iter()
                .filter(|(_, r)| r.lease_until_ms.is_some_and(|u| u >= now))
                .map(|(id, _)| *id)
                .collect();
            if !held.is_empty() {
                let id = held[rt.with_rng(|r| r.index(held.len()))];
                if let Some(row) = rows.retries.get_mut(&id) {
                    row.lease_until_ms = Some(now.saturating_sub(1));
                }
                w.fault("lease-expired-early", short(&id.to_string()));
            }
        }
        if exec.step() == Step::Idle {
            break;
        }
    }

    // Quiescence: no more faults, every process up, every account and asset active, the
    // operator and the admin gone; recovery and the network's late copies run out.
    exec.crash(OUTSIDE);
    {
        let mut w = sim.world();
        w.faults_on = false;
        w.note(|| "faults off: quiescence".to_owned());
        for account in w.funding.accounts.values_mut() {
            account.status = Status::Active;
        }
        for user in 1..=USERS {
            for asset in ASSETS {
                w.engine_apply(&Request::SetStatus {
                    user_id: user,
                    asset: asset.to_owned(),
                    status: AccountStatus::Active,
                });
            }
        }
    }
    {
        let mut reg = registry.write().unwrap_or_else(|e| e.into_inner());
        *reg = self::registry();
    }
    for i in down.iter().copied().collect::<Vec<_>>() {
        incarnation[i] += 1;
        start_worker(&sim, &ledgers[i], LEDGERS[i], incarnation[i]);
    }
    let quiet_until = rt.now_ms() + QUIET_PHASE_MS;
    while rt.now_ms() < quiet_until && exec.steps <= STEPS_MAX {
        if exec.step() == Step::Idle {
            break;
        }
        // Done early once every transfer is terminal and nothing is left on the wire.
        if exec.steps.is_multiple_of(64)
            && exec.alive(Role::Network) == 0
            && exec.alive(Role::Request) == 0
            && sim
                .store
                .rows()
                .streams
                .values()
                .all(|t| t.state().is_some_and(TransferState::is_terminal))
        {
            break;
        }
    }
    for proc in LEDGERS {
        exec.crash(proc);
    }
    // Late copies still on the wire land before the final checks.
    while exec.alive(Role::Network) > 0 && exec.steps <= STEPS_MAX {
        if exec.step() == Step::Idle {
            break;
        }
    }

    let last = crate::audit::final_check(&mut exec, &sim, &auditor);
    let transfers = sim.store.rows().streams.len();
    let mut w = sim.world();
    crate::check::at_quiescence(&mut w);
    crate::audit::judge(&mut w, &auditor, last, tampered);
    Report {
        seed,
        violations: w.violations.clone(),
        faults: w.fault_counts.clone(),
        transfers,
        steps: exec.steps,
        trace: w.trace.take().unwrap_or_default(),
        shared_in_rounds: ledgers
            .iter()
            .map(|l| l.coordinator.round_stats().shared)
            .sum(),
    }
}

/// The planted mismatch: one USDT appears in user 1's FUNDING account, no movement behind it.
fn tamper(sim: &Sim) {
    let mut w = sim.world();
    let (Ok(user), Ok(usdt)) = (UserId::new(1), AssetSymbol::parse("USDT")) else {
        return;
    };
    if let Some(account) = w.funding.accounts.get_mut(&(user, usdt)) {
        account.balance += Decimal::ONE;
    }
    w.fault("tamper", "one USDT appears in user 1's FUNDING account");
}

/// Every user starts with 1,000 of each asset in FUNDING and in SPOT.
fn seed_balances(sim: &Sim) {
    let mut w = sim.world();
    let start = Decimal::from(1_000);
    for user in 1..=USERS {
        for (k, asset) in ASSETS.into_iter().enumerate() {
            let account = Account {
                balance: start,
                status: Status::Active,
            };
            if let (Ok(id), Ok(symbol)) = (UserId::new(user), AssetSymbol::parse(asset)) {
                w.funding.accounts.insert((id, symbol), account);
            }
            let id = ReqId::from_parts(START_MS - 1, u128::from(user) << 8 | k as u128).to_string();
            let now = w.now_ms;
            w.engine
                .apply_at(&Request::deposit(id, user, asset, start), now);
            w.deposits.insert((user, asset.to_owned()), start + start);
        }
    }
}

/// One seed as `cells` cells (ADR 0017): each cell its own world (its own funding store,
/// spot-core engine, ledgers, users and checks), seeded `seed × 1000 + cell`; the faults drawn
/// from its seed, and `config.plant`, go into cell 1 only, every other cell runs calm. Cells share
/// no state in the ledger (no transaction crosses two cells), so the worlds share none here: what
/// this shows is that everything a cell's invariants need lives in its own world, so a fault in
/// cell 1 (crashes, lost and duplicated calls, clock jumps, a planted bug) leaves every other
/// cell's invariants whole. Each cell's report, in cell order.
pub fn run_cells(seed: u64, cells: u16, config: &Config) -> Vec<Report> {
    (1..=u64::from(cells))
        .map(|cell| {
            let cell_config = Config {
                calm: cell != 1,
                ..config.clone()
            };
            run(seed.wrapping_mul(1000).wrapping_add(cell), &cell_config)
        })
        .collect()
}
