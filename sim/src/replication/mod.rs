//! `ledger-sim --replication`: spot-core's replication (docs/adr/0020-high-availability.md §3)
//! as a deterministic model under one seeded scheduler (docs/adr/0014-simulation.md,
//! "Replication").
//!
//! Three replicas, each with a durable log, promised epoch and epoch history, and volatile state
//! (its role, a leader's shipper, a campaign's take-over); an etcd-like lease oracle; connections
//! that deliver in order (TCP) but are lost, delayed and reordered against each other; crashes,
//! restarts, lost disks and leases that end under a live leader. Every decision the real code
//! takes through `spot_core::replica::rules` and `spot_core::replica::history` (acknowledge,
//! accept frames, adopt a log, compare logs) is taken here by calling the same functions, so a
//! planted bug in them (`rules::plant`) is switched on exactly as it would be in the replicas.
//! The network code of `leader.rs`, `follower.rs` and `wal/follow.rs` is not run: `world.rs`
//! re-states its steps message by message.

mod world;

pub use spot_core::replica::rules::plant::Bug;

/// One replication run's settings. The model is spot-core's replication as it is (since
/// bb72cd88: a rebuild older than a promise is discarded, a blank replica promises the current
/// epoch, and one that lost its data in a cell that had a leader is `WIPED`), with any one disk
/// lost at any time.
pub use world::{Config, Report};

/// Runs `seed` under `config`; the same seed and config give the same report, byte for byte.
pub fn run(seed: u64, config: &Config) -> Report {
    set_plant(config.plant);
    let report = world::World::new(seed, config).run();
    set_plant(None);
    report
}

fn set_plant(bug: Option<Bug>) {
    spot_core::replica::rules::plant::set(bug);
}
