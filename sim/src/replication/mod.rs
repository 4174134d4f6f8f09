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

use std::collections::BTreeMap;

pub use spot_core::replica::rules::plant::Bug;

/// One replication run's settings.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The planted bug to switch on (on this thread, for this run).
    pub plant: Option<Bug>,
    /// Keep the whole trace.
    pub trace: bool,
    /// Lose a disk at any time, one at a time (while no other replica is still empty from its
    /// own loss). Without it a disk is lost only while both other replicas hold every
    /// acknowledged record (see docs/adr/0014-simulation.md, "Replication"): with it, a wiped
    /// replica's empty promise can elect a replica that lacks acknowledged records.
    pub any_disk_loss: bool,
    /// Model the fix the simulation found (see docs/adr/0014-simulation.md, "Replication"): a
    /// follower swaps in a rebuild only while it has promised no epoch above the rebuilding
    /// leader's. spot-core as written writes the leader's (older) epoch over a newer promise.
    pub fenced_rebuild: bool,
    /// Model the second fix the simulation found: a replica that lost its disk (no `EPOCH`)
    /// first promises etcd's revision (the leader key's, or the store's when there is none).
    /// spot-core as written starts it with epoch 0, so it joins a deposed leader and
    /// acknowledges its frames.
    pub fenced_wipe: bool,
}

impl Config {
    /// Both proposed fixes modelled.
    pub fn fixed() -> Config {
        Config {
            fenced_rebuild: true,
            fenced_wipe: true,
            ..Config::default()
        }
    }
}

/// What one seed's run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    /// Events handled.
    pub steps: u64,
    /// Client writes acknowledged.
    pub acknowledged: u64,
    /// Leaderships that began serving.
    pub leaderships: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
}

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
