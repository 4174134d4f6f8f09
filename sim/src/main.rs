//! `ledger-sim`: runs the deterministic simulation over many seeds, or replays one with a trace.
//!
//! ```text
//! ledger-sim --seeds N [--from S] [--transfers T] [--plant BUG] [--tight] [--bulk] [--tamper]
//! ledger-sim --seed S [--trace] [--transfers T] [--plant BUG] [--tight] [--bulk] [--tamper]
//! ledger-sim --seeds N --cells C [--from S] [--transfers T] [--plant BUG] [--tight] [--bulk] [--tamper]
//! ledger-sim --replication --seeds N [--from S] [--plant BUG] [--wiped-ends-at-adopt]
//! ledger-sim --replication --seed S [--trace] [--plant BUG] [--wiped-ends-at-adopt]
//! ledger-sim --moves --seeds N [--cells C] [--from S] [--plant write-after-pause]
//! ledger-sim --moves --seed S [--cells C] [--trace] [--plant write-after-pause]
//! ```
//!
//! `--moves`: partition moves (ADR 0023) among faults instead of the transfer protocol
//! (`sim::moves`): the real `MoveRunner` moving random partitions back and forth between C
//! in-memory cells (default 3), users writing through the fence and opening transfers, cancels,
//! crashes and lost answers on the move's calls; its planted bug is `write-after-pause` (the
//! source accepts a write after the pause began), which only this mode can find.
//!
//! `--replication`: spot-core's replication (ADR 0020 §3) instead of the transfer protocol
//! (`sim::replication`), any one disk lost at any time among its faults (`--any-disk-loss` is
//! accepted and changes nothing); its planted bugs are `spot_core::replica::rules::plant::Bug`'s;
//! `--wiped-ends-at-adopt` models spot-core as it was before its last fix (ADR 0014,
//! "Replication").
//!
//! `--cells C`: each seed is C cell worlds, the faults and a planted bug in cell 1 only
//! (`sim::run_cells`); a violation in any other cell fails the run.
//!
//! `--tight`: the tightest recovery settings an operator can configure (see `Config::tight`).
//! `--bulk`: the users also send batches through the bulk path (see `Config::bulk`).
//! `--tamper`: a planted mismatch (money appears in a FUNDING account) that the product's
//! conservation check must find and halt on (see `Config::tamper`, `audit.rs`).
//!
//! A product invariant broken in a seed (`domain::invariant!`, spot-core's) ends that seed at its
//! cause: its violation reads `INVARIANT invariant violated: <reason>` (`sim::run`), and the
//! panic's own line on stderr says where.
//!
//! Many seeds: the rate, the faults injected by kind, each failing seed with its replay command
//! (the first one's own trace lines too), and last `N seeds, M violations`. One seed: its whole
//! trace with `--trace`; the same seed prints the same trace, byte for byte.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use application::plant::Bug;
use sim::{run, Config};

/// Prints a line; a closed pipe (`| head`) ends the output quietly instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// The trace lines of one violation's transfer (its req_id's last characters, as the trace
/// writes them), with the crashes, restarts and clock jumps: the smallest trace that tells its
/// story.
fn focused_trace(trace: &[String], violation: &str) -> Vec<String> {
    let id = violation
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| w.len() == 26 && w.starts_with("01"));
    let Some(id) = id else {
        return trace.to_vec();
    };
    let short = &id[20..];
    let marks = [
        "VIOLATION",
        "restarts",
        "FAULT crash",
        "FAULT clock-jump",
        "quiescence",
    ];
    trace
        .iter()
        .filter(|l| l.contains(short) || marks.iter().any(|m| l.contains(m)))
        .cloned()
        .collect()
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: ledger-sim --seeds N [--from S] [--cells C] [--transfers T] [--plant BUG] [--tight] [--bulk] [--tamper]\n       ledger-sim --seed S [--trace] [--transfers T] [--plant BUG] [--tight] [--bulk] [--tamper]\n       ledger-sim --moves --seeds N [--cells C] [--from S] [--plant write-after-pause]\n       ledger-sim --moves --seed S [--cells C] [--trace] [--plant write-after-pause]\nbugs: {} (write-after-pause with --moves only)",
        Bug::ALL.map(Bug::name).join(", ")
    );
    ExitCode::from(2)
}

// long: the tool's arguments and its report, read top to bottom; a test tool.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--replication") {
        return replication(&args);
    }
    if args.iter().any(|a| a == "--moves") {
        return moves(&args);
    }
    let mut seeds: Option<u64> = None;
    let mut from = 0u64;
    let mut one: Option<u64> = None;
    let mut config = Config {
        transfers: 12,
        plant: None,
        trace: false,
        tight: false,
        bulk: false,
        calm: false,
        tamper: false,
    };
    let mut cells: Option<u16> = None;
    let mut i = 0;
    while i < args.len() {
        if matches!(
            args[i].as_str(),
            "--trace" | "--tight" | "--bulk" | "--tamper"
        ) {
            config.trace |= args[i] == "--trace";
            config.tight |= args[i] == "--tight";
            config.bulk |= args[i] == "--bulk";
            config.tamper |= args[i] == "--tamper";
            i += 1;
            continue;
        }
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let number = value.parse::<u64>().ok();
        match (args[i].as_str(), number) {
            ("--seeds", Some(n)) => seeds = Some(n),
            ("--from", Some(n)) => from = n,
            ("--seed", Some(n)) => one = Some(n),
            ("--cells", Some(n)) => match u16::try_from(n) {
                Ok(n @ 2..=16) => cells = Some(n),
                _ => return usage(),
            },
            ("--transfers", Some(n)) => config.transfers = usize::try_from(n).unwrap_or(12),
            ("--plant", _) => match Bug::parse(&value) {
                // A move's bug: only `--moves` runs moves.
                Some(Bug::WriteAfterPause) | None => return usage(),
                Some(bug) => config.plant = Some(bug),
            },
            _ => return usage(),
        }
        i += 2;
    }
    if let Some(seed) = one {
        let report = run(seed, &config);
        for line in &report.trace {
            say!("{line}");
        }
        for v in &report.violations {
            say!("seed {seed}: VIOLATION {v}");
        }
        say!(
            "seed {seed}: {} transfers, {} steps, faults {:?}",
            report.transfers,
            report.steps,
            report.faults
        );
        say!(
            "1 seeds, {} violations",
            usize::from(!report.violations.is_empty())
        );
        return if report.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let Some(n) = seeds else {
        return usage();
    };
    if let Some(cells) = cells {
        return run_many_cells(from, n, cells, &config);
    }
    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failing = 0u64;
    let mut transfers = 0usize;
    for seed in from..from.saturating_add(n) {
        let report = run(seed, &config);
        transfers += report.transfers;
        for (k, v) in &report.faults {
            *faults.entry(k).or_insert(0) += v;
        }
        let Some(first) = report.violations.first() else {
            continue;
        };
        failing += 1;
        let mut plant = config
            .plant
            .map(|b| format!(" --plant {}", b.name()))
            .unwrap_or_default();
        for (on, flag) in [(config.tight, " --tight"), (config.bulk, " --bulk")] {
            if on {
                plant.push_str(flag);
            }
        }
        if config.transfers != 12 {
            plant.push_str(&format!(" --transfers {}", config.transfers));
        }
        say!("seed {seed}: VIOLATION {first} (replay: ledger-sim --seed {seed} --trace{plant})");
        if failing == 1 {
            // The first failing seed again, traced: its violating transfer's own lines.
            let traced = run(
                seed,
                &Config {
                    trace: true,
                    ..config.clone()
                },
            );
            for line in focused_trace(&traced.trace, first) {
                say!("  | {line}");
            }
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    // Rates for people, not for arithmetic that must be exact.
    #[allow(clippy::float_arithmetic, clippy::cast_precision_loss)]
    let (seed_rate, transfer_rate) = (n as f64 / secs, transfers as f64 / secs);
    say!("{seed_rate:.1} seeds/s, {transfer_rate:.0} transfers/s ({transfers} transfers in {secs:.1} s)");
    for (kind, count) in &faults {
        say!("fault {kind}: {count}");
    }
    say!("{n} seeds, {failing} violations");
    if failing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--seeds N --cells C`: every seed as C cells, cell 1 faulted; counts per cell, and fails when
/// any cell but the first has a violation (the first's are reported, as a planted bug's are).
fn run_many_cells(from: u64, n: u64, cells: u16, config: &Config) -> ExitCode {
    let started = Instant::now();
    let mut failing = vec![0u64; usize::from(cells)];
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in from..from.saturating_add(n) {
        for (i, report) in sim::run_cells(seed, cells, config).iter().enumerate() {
            for (k, v) in &report.faults {
                *faults.entry(k).or_insert(0) += v;
            }
            if let Some(first) = report.violations.first() {
                failing[i] += 1;
                say!("seed {seed}, cell {}: VIOLATION {first}", i + 1);
            }
        }
    }
    for (kind, count) in &faults {
        say!("fault {kind}: {count}");
    }
    say!(
        "(faults are injected in cell 1 only; the operator-/admin- counts are every cell's actors)"
    );
    for (i, f) in failing.iter().enumerate() {
        let role = if i == 0 { "faulted" } else { "calm" };
        say!("cell {} ({role}): {n} seeds, {f} violations", i + 1);
    }
    say!(
        "{n} seeds x {cells} cells in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let others_clean = failing.iter().skip(1).all(|f| *f == 0);
    let first_clean = failing[0] == 0 || config.plant.is_some();
    if others_clean && first_clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn replication_usage() -> ExitCode {
    eprintln!(
        "usage: ledger-sim --replication --seeds N [--from S] [--plant BUG] [--wiped-ends-at-adopt]\n       ledger-sim --replication --seed S [--trace] [--plant BUG] [--wiped-ends-at-adopt]\nbugs: {}",
        sim::replication::Bug::ALL.map(sim::replication::Bug::name).join(", ")
    );
    ExitCode::from(2)
}

/// `--replication`: many seeds (the rate, the faults, each failing seed with its replay command
/// and the first one's trace), or one seed's whole trace.
// long: the command line of one mode read top to bottom (flags, one seed or many, the report); no branch is shared with another mode.
fn replication(args: &[String]) -> ExitCode {
    use sim::replication::{run as run_replication, Bug as ReplicaBug, Config as ReplicaConfig};
    let mut config = ReplicaConfig::default();
    let (mut seeds, mut from, mut one) = (None, 0u64, None);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--replication" => {}
            "--trace" => config.trace = true,
            // Any one disk lost at any time is in every run's faults now.
            "--any-disk-loss" => {}
            "--wiped-ends-at-adopt" => config.wiped_ends_at_adopt = true,
            flag => {
                let value = args.get(i + 1).cloned().unwrap_or_default();
                let number = value.parse::<u64>().ok();
                match (flag, number) {
                    ("--seeds", Some(n)) => seeds = Some(n),
                    ("--from", Some(n)) => from = n,
                    ("--seed", Some(n)) => one = Some(n),
                    ("--plant", _) => match ReplicaBug::parse(&value) {
                        Some(bug) => config.plant = Some(bug),
                        None => return replication_usage(),
                    },
                    _ => return replication_usage(),
                }
                i += 1;
            }
        }
        i += 1;
    }
    let mut flags = config
        .plant
        .map(|b| format!(" --plant {}", b.name()))
        .unwrap_or_default();
    if config.wiped_ends_at_adopt {
        flags.push_str(" --wiped-ends-at-adopt");
    }
    if let Some(seed) = one {
        let report = run_replication(seed, &config);
        for line in &report.trace {
            say!("{line}");
        }
        for v in &report.violations {
            say!("seed {seed}: VIOLATION {v}");
        }
        say!(
            "seed {seed}: {} steps, {} writes acknowledged, {} leaderships, faults {:?}, events {:?}",
            report.steps,
            report.acknowledged,
            report.leaderships,
            report.faults,
            report.events
        );
        return if report.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let Some(n) = seeds else {
        return replication_usage();
    };
    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut events: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut failing, mut acknowledged, mut leaderships) = (0u64, 0u64, 0u64);
    for seed in from..from.saturating_add(n) {
        let report = run_replication(seed, &config);
        acknowledged += report.acknowledged;
        leaderships += report.leaderships;
        for (k, v) in &report.faults {
            *faults.entry(k).or_insert(0) += v;
        }
        for (k, v) in &report.events {
            *events.entry(k).or_insert(0) += v;
        }
        let Some(first) = report.violations.first() else {
            continue;
        };
        failing += 1;
        say!(
            "seed {seed}: VIOLATION {first} (replay: ledger-sim --replication --seed {seed} --trace{flags})"
        );
        if failing == 1 {
            let traced = run_replication(
                seed,
                &ReplicaConfig {
                    trace: true,
                    ..config.clone()
                },
            );
            let skip = traced.trace.len().saturating_sub(40);
            for line in &traced.trace[skip..] {
                say!("  | {line}");
            }
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    // A rate for people, not for arithmetic that must be exact.
    #[allow(clippy::float_arithmetic, clippy::cast_precision_loss)]
    let rate = n as f64 / secs;
    say!("{rate:.1} seeds/s ({n} seeds in {secs:.1} s): {acknowledged} writes acknowledged, {leaderships} leaderships");
    for (kind, count) in &faults {
        say!("fault {kind}: {count}");
    }
    for (kind, count) in &events {
        say!("event {kind}: {count}");
    }
    say!("{n} seeds, {failing} violations");
    if failing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--moves`'s flags: the config, and the seeds to run (`Err` for a bad command line).
fn moves_args(args: &[String]) -> Result<(sim::moves::Config, Option<u64>, u64, Option<u64>), ()> {
    let mut config = sim::moves::Config {
        cells: 3,
        plant: None,
        trace: false,
    };
    let (mut seeds, mut from, mut one) = (None, 0u64, None);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--moves" => {}
            "--trace" => config.trace = true,
            flag => {
                let value = args.get(i + 1).cloned().unwrap_or_default();
                let number = value.parse::<u64>().ok();
                match (flag, number) {
                    ("--seeds", Some(n)) => seeds = Some(n),
                    ("--from", Some(n)) => from = n,
                    ("--seed", Some(n)) => one = Some(n),
                    ("--cells", Some(n @ 2..=16)) => {
                        config.cells = u16::try_from(n).map_err(|_| ())?
                    }
                    ("--plant", _) if value == Bug::WriteAfterPause.name() => {
                        config.plant = Some(Bug::WriteAfterPause);
                    }
                    _ => return Err(()),
                }
                i += 1;
            }
        }
        i += 1;
    }
    Ok((config, seeds, from, one))
}

/// `--moves`: one seed's whole trace, or many seeds (the moves run and how they ended, the
/// faults, each failing seed with its replay command and the first one's trace, the count).
// long: the command line of one mode read top to bottom (one seed or many, the report); a test tool.
fn moves(args: &[String]) -> ExitCode {
    let Ok((config, seeds, from, one)) = moves_args(args) else {
        return usage();
    };
    let mut flags = format!(" --cells {}", config.cells);
    if let Some(bug) = config.plant {
        flags.push_str(&format!(" --plant {}", bug.name()));
    }
    let (from, n) = match (one, seeds) {
        (Some(seed), _) => (seed, 1),
        (None, Some(n)) => (from, n),
        (None, None) => return usage(),
    };
    let started = Instant::now();
    let mut total = sim::moves::Report::default();
    let mut failing = 0u64;
    for seed in from..from.saturating_add(n) {
        let report = sim::moves::run(seed, &config);
        if one.is_some() {
            for line in &report.trace {
                say!("{line}");
            }
        }
        total.moves += report.moves;
        total.done += report.done;
        total.cancelled += report.cancelled;
        total.cancelled_by_check += report.cancelled_by_check;
        total.cancelled_by_drain += report.cancelled_by_drain;
        for (k, v) in &report.counts {
            *total.counts.entry(k).or_insert(0) += v;
        }
        let Some(first) = report.violations.first() else {
            continue;
        };
        failing += 1;
        say!("seed {seed}: VIOLATION {first} (replay: ledger-sim --moves --seed {seed} --trace{flags})");
        if failing == 1 && one.is_none() {
            let traced = sim::moves::run(
                seed,
                &sim::moves::Config {
                    trace: true,
                    ..config.clone()
                },
            );
            let skip = traced.trace.len().saturating_sub(30);
            for line in &traced.trace[skip..] {
                say!("  | {line}");
            }
        }
    }
    for (kind, count) in &total.counts {
        say!("{kind}: {count}");
    }
    say!(
        "moves: {} started, {} DONE, {} CANCELLED ({} by the check before the switch, {} by a drain that did not end, the rest by operators)",
        total.moves, total.done, total.cancelled, total.cancelled_by_check, total.cancelled_by_drain
    );
    say!(
        "{n} seeds x {} cells in {:.1} s, {failing} violations",
        config.cells,
        started.elapsed().as_secs_f64()
    );
    if failing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
