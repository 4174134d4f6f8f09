//! `ledger-sim`: runs the deterministic simulation over many seeds, or replays one with a trace.
//!
//! ```text
//! ledger-sim --seeds N [--from S] [--transfers T] [--plant BUG]
//! ledger-sim --seed S [--trace] [--transfers T] [--plant BUG]
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use application::plant::Bug;
use sim::{run, Config};

fn usage() -> ExitCode {
    eprintln!(
        "usage: ledger-sim --seeds N [--from S] [--transfers T] [--plant BUG]\n       ledger-sim --seed S [--trace] [--transfers T] [--plant BUG]\nbugs: {}",
        Bug::ALL.map(Bug::name).join(", ")
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds: Option<u64> = None;
    let mut from = 0u64;
    let mut one: Option<u64> = None;
    let mut config = Config {
        transfers: 12,
        plant: None,
        trace: false,
    };
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let number = value.parse::<u64>().ok();
        match args[i].as_str() {
            "--seeds" => seeds = number,
            "--from" => from = number.unwrap_or(0),
            "--seed" => one = number,
            "--transfers" => config.transfers = number.map_or(12, |n| n as usize),
            "--plant" => match Bug::parse(&value) {
                Some(bug) => config.plant = Some(bug),
                None => return usage(),
            },
            "--trace" => {
                config.trace = true;
                i += 1;
                continue;
            }
            _ => return usage(),
        }
        i += 2;
    }
    if let Some(seed) = one {
        let report = run(seed, &config);
        for line in &report.trace {
            println!("{line}");
        }
        for v in &report.violations {
            println!("seed {seed}: VIOLATION {v}");
        }
        println!(
            "seed {seed}: {} transfers, {} steps, faults {:?}",
            report.transfers, report.steps, report.faults
        );
        println!(
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
    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failing = 0u64;
    let mut transfers = 0usize;
    for seed in from..from + n {
        let report = run(seed, &config);
        transfers += report.transfers;
        for (k, v) in &report.faults {
            *faults.entry(k).or_insert(0) += v;
        }
        if let Some(first) = report.violations.first() {
            failing += 1;
            println!(
                "seed {seed}: VIOLATION {first} (replay: ledger-sim --seed {seed} --trace{})",
                config
                    .plant
                    .map(|b| format!(" --plant {}", b.name()))
                    .unwrap_or_default()
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{:.1} seeds/s, {:.0} transfers/s ({transfers} transfers in {secs:.1} s)",
        n as f64 / secs.max(1e-9),
        transfers as f64 / secs.max(1e-9)
    );
    for (kind, count) in &faults {
        println!("fault {kind}: {count}");
    }
    println!("{n} seeds, {failing} violations");
    if failing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
