//! `ledger-bench`: the performance benchmark. Prints figures; asserts nothing about speed.
//!
//! - `transfers`: a clean database, a real `ledger serve` and `spot-core` process, N concurrent
//!   HTTP clients moving money both ways, one run per N in `--clients 8,32,128`; transfers/s,
//!   latency percentiles, CPU per 1,000 transfers, peak memory, conservation, and the raw
//!   durable-commit baseline and rows-only floor measured in the same run. With `--wrk`, also a
//!   `ledger up` with default settings driven by `wrk` and by the own client, side by side.
//! - `spot`: spot-core alone: durable operations per second in-process and over TCP, and memory
//!   per million accounts.
//! - `replay`: about a million generated events; the raw read of those rows, the live projector's
//!   catch-up and the full rebuild `ledger replay` does, in events per second, in the same run.
//! - `relay`: the JetStream relay publishing a backlog of about a million feed events to a
//!   nats-server the benchmark starts; events per second beside the feed read alone.
//! - `growth`: what years of traffic cost: spot-core's memory, snapshot, WAL and
//!   restart time after 1M, 5M and 10M operations with the horizon advancing, and the
//!   conservation check's time (periodic and full) at 10k, 100k and 1M transfers in the log. Not
//!   part of `all` (it takes several minutes more).
//! - `transfers --cells N` and `cells`: what a cell map costs (routing, ABAB) and the rate of 1
//!   and N cells; the three faults in one cell and the other cells' rate during each (`cells.rs`).
//! - `traces`: the single-transfer route with OTLP trace export off and on, in alternating runs
//!   (every span sampled, to a sink the benchmark starts); the medians and how much slower "on"
//!   is. Not part of `all`.
//! - `tlog`: the tamper-evident log's cost: the single-transfer and bulk routes with the log on
//!   (a signing key: tree and checkpoints) and off, in alternating runs, the medians and how much
//!   slower "on" is; and `ledger verify` in entries/s over a generated log of about a million
//!   events with its tree and checkpoints. Not part of `all`.
//! - `move`: a partition moved back and forth between two real cells under load, the move
//!   runner in the bench process (`moves.rs`, `movecells.rs`), at 10k and 100k events of the
//!   partition's history (1M with `--history`); the moved users' pause, the others' rate, the
//!   move's time step by step, conservation after. Not part of `all`.
//! - `all`: transfers (at 8, 32 and 128 clients, with `--wrk` and `--relay`), spot, replay and
//!   relay, one after the other, and a closing summary of every figure against its target.

// Figures for people to read (rates, percentiles, MiB) are floats; no money is computed here.
#![allow(clippy::float_arithmetic)]

mod abab;
mod cells;
mod cellstack;
mod clients;
mod failover;
mod growth;
mod movecells;
mod moves;
mod pgledger;
mod pgstat;
mod procstat;
mod relay;
mod replay;
mod spot;
mod tlog;
mod traces;
mod transfers;
mod wrk;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "ledger-bench",
    about = "Benchmarks of the ledger (figures, not assertions)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Transfers end to end over HTTP, beside the raw PostgreSQL commit baseline.
    Transfers(transfers::Args),
    /// spot-core alone: in-process and network durable operations, memory per account.
    Spot(spot::Args),
    /// Rebuilding every projection from ~1M events, beside reading the same rows raw.
    Replay(replay::Args),
    /// The JetStream relay publishing a backlog of ~1M feed events to a nats-server it starts.
    Relay(relay::Args),
    /// What years of traffic cost: spot-core memory, snapshots, WAL and restart time after
    /// millions of operations; the conservation check's time at up to 1M transfers.
    Growth(growth::Args),
    /// Cells: the three faults in one cell (a killed spot-core, a stopped PostgreSQL, a halt),
    /// the other cells' rate during each against before it.
    Cells(cells::FaultArgs),
    /// The single-transfer route with trace export off and on (both processes, every span, to
    /// an OTLP sink it starts), in alternating runs: the medians and their ratio.
    Traces(traces::Args),
    /// The tamper-evident log: both routes with the log on and off, in alternating runs (the
    /// medians and their ratio), and `ledger verify`'s entries/s over ~1M entries.
    Tlog(tlog::Args),
    /// HA (issue 47): a cell's PostgreSQL machine and then its spot-core leader killed under
    /// load, N times each; the time until the cell commits again (median, maximum).
    Failover(failover::Args),
    /// HA's price: the single and bulk routes on a plain stack, with three spot-core replicas,
    /// and with a synchronous PostgreSQL pair, driven in turn; the medians and ratios.
    HaPrice(failover::PriceArgs),
    /// A partition moved back and forth between two real cells under load (ADR 0023), per
    /// history size: the moved users' pause, the others' rate during the moves against before,
    /// the move's time and where it goes, and both cells' conservation after the last move.
    Move(moves::Args),
    /// All three with their defaults, then a summary against the targets.
    All,
}

/// The arguments a subcommand has when given none.
fn defaults<T: clap::Args>() -> anyhow::Result<T> {
    let matches =
        T::augment_args(clap::Command::new("defaults")).try_get_matches_from(["defaults"])?;
    Ok(T::from_arg_matches(&matches)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Opt-in logs on stderr (`RUST_LOG=adapters=debug`, say): the figures stay on stdout.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let summary = match Cli::parse().command {
        Command::Transfers(args) => match args.cells {
            Some(cells) => cells::transfers(&args, cells).await?,
            None => transfers::run(args).await?,
        },
        Command::Spot(args) => spot::run(args).await?,
        Command::Replay(args) => replay::run(args).await?,
        Command::Relay(args) => relay::run(args).await?,
        Command::Growth(args) => growth::run(args).await?,
        Command::Cells(args) => cells::faults(args).await?,
        Command::Traces(args) => traces::run(args).await?,
        Command::Tlog(args) => tlog::run(args).await?,
        Command::Failover(args) => failover::run(args).await?,
        Command::HaPrice(args) => failover::price(args).await?,
        Command::Move(args) => moves::run(args).await?,
        Command::All => {
            let mut summary = transfers::run(transfers::Args::for_all()?).await?;
            println!();
            summary.extend(spot::run(defaults()?).await?);
            println!();
            summary.extend(replay::run(defaults()?).await?);
            println!();
            summary.extend(relay::run(defaults()?).await?);
            summary
        }
    };
    println!();
    println!("== summary ==");
    for line in summary {
        println!("{line}");
    }
    Ok(())
}
