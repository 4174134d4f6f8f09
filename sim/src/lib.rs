//! The deterministic simulation of the transfer protocol (issue 24, `docs/adr/0014-simulation.md`):
//! the real `Coordinator` and `RecoveryWorker` and spot-core's real engine, over in-memory ports
//! with faults at every await point, scheduled by one seeded random source on an executor of its
//! own. One seed is one run, replayed byte for byte. `replication` models spot-core's replication
//! (ADR 0020 §3) under the same kind of seeded scheduler, calling its real decision rules. The
//! product's conservation check and halt run in every seed (`audit.rs`).

mod actors;
pub mod audit;
mod cast;
pub mod check;
pub mod exec;
pub mod moves;
pub mod ports;
pub mod replication;
pub mod rng;
pub mod run;
pub mod world;

pub use run::{run, run_cells, Config, Report};
