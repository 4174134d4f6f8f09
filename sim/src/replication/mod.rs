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

/// One replication run's settings. The model is spot-core's replication as it is (since
/// bb72cd88: a rebuild older than a promise is discarded, a blank replica promises the current
/// epoch, and one that lost its data in a cell that had a leader is `WIPED`), with any one disk
/// lost at any time.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The planted bug to switch on (on this thread, for this run).
    pub plant: Option<Bug>,
    /// Keep the whole trace.
    pub trace: bool,
    /// Model spot-core as it was before the fix of seed 14592 (docs/adr/0014-simulation.md,
    /// "Replication"): a `WIPED` replica ended `WIPED` as soon as the epoch's line was adopted
    /// (at once when that epoch began at seq 1). Without it (the code today) `WIPED` ends only
    /// once its log holds every record the leader it joined had written then.
    pub wiped_ends_at_adopt: bool,
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
    /// What the fixes of bb72cd88 did, by kind (a rebuild discarded at swap-in, a replica that
    /// started `WIPED`, a promise it refused, a campaign it skipped, a follower behind the
    /// compacted log rebuilt): evidence that the runs take those paths.
    pub events: BTreeMap<&'static str, u64>,
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
