//! `ledger-sim --moves`: partition moves (ADR 0023 §4) among faults, seed by seed. The real
//! `application::moves::MoveRunner` drives moves of random partitions back and forth between
//! `cells` in-memory cells (`application::testkit::moves::MemMoves`: the fence, the drain, the
//! copy by marks, the switch) and their spot-cores (spot-core's real `Engine`, one per cell, its
//! journaled `move_out` and `move_in`, `MOVED` for a partition moved out), while the seed's
//! schedule interleaves, before any call of the move's ports, users' writes through the fence
//! (sometimes to a stale cell), transfers that open and end (the drain waits for them, some stay
//! open until the faults stop), operators' cancels, and faults on the move's calls (a failed
//! call, a lost answer, a crash before or after: the process dies and a new runner resumes from
//! the record). Then the faults stop, every open transfer ends, every move is driven to its end,
//! and `check::after_seed` judges the cells.
//!
//! Not the transfer simulation's own cell worlds (`run_cells`): those are separate worlds with
//! no map, fence or move ports; here the cells are `MemMoves`'s. A check before the switch that
//! fails is a violation too: without a bug no write lands after the pause, so it never fails.

mod check;
mod config;
mod engines;
mod ports;
mod scene;
mod schedule;

pub use config::{Config, Report};
pub use schedule::run_seed;

/// Runs one seed. A product invariant broken (`domain::invariant!`, the runner's table of
/// steps) ends the seed at its cause and is its violation, as in `sim::run`.
pub fn run(seed: u64, config: &Config) -> Report {
    domain::invariant::panic_instead();
    application::plant::set(config.plant);
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_seed(seed, config)));
    application::plant::set(None);
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
            Report {
                seed,
                violations: vec![format!("INVARIANT {message}")],
                ..Report::default()
            }
        }
    }
}
