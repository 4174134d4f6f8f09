//! What this process's pool watchers observed of each database, shared by every pool over the
//! same servers and keyed by `Servers::key`: the primary in use, the moves not yet recorded,
//! and since when no server is found. Process-wide, so one failover seen by several pools is one
//! move.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

/// A change of primary this process's pool watchers observed, for the ledger to record in the
/// database's `failovers` once it can write there again (the database is failing over when it
/// happens): when, from which server to which (`host:port`), and why the old one was left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryMove {
    pub at: SystemTime,
    /// `None`: no primary had been seen by this process before.
    pub from: Option<String>,
    pub to: String,
    pub cause: String,
}

/// What this process's watchers of one database (every pool over the same servers: the
/// server's, the log follower's, a cell's probe) observed together: the primary they use, the
/// moves not yet taken, and since when none of them finds a primary. Shared so that one
/// failover seen by three pools is one move.
#[derive(Debug, Default)]
pub(super) struct Observed {
    pub(super) primary: Option<String>,
    pub(super) moves: Vec<PrimaryMove>,
    pub(super) leaderless_since: Option<SystemTime>,
}

/// The observations, by [`Servers::key`]. Process-wide: the pools are made deep inside
/// start-up, and what reads the observations (the failover recorder, `/metrics`, the cells
/// view) knows the database by its URL only.
static OBSERVED: Mutex<BTreeMap<String, Observed>> = Mutex::new(BTreeMap::new());

/// Most moves kept for one database while nobody takes them (a process that never records).
pub(super) const MOVES_KEPT_MAX: usize = 256;

pub(super) fn observed<T>(key: &str, f: impl FnOnce(&mut Observed) -> T) -> T {
    let mut all = OBSERVED.lock().unwrap_or_else(|e| e.into_inner());
    f(all.entry(key.to_owned()).or_default())
}

/// A watcher (or a new pool) uses `host` now: a move when another primary was in use.
pub(super) fn observe_primary(key: &str, host: String, cause: &str) {
    observed(key, |o| {
        o.leaderless_since = None;
        if o.primary.as_deref() == Some(host.as_str()) {
            return;
        }
        if let Some(from) = o.primary.replace(host.clone()) {
            if o.moves.len() >= MOVES_KEPT_MAX {
                o.moves.remove(0);
            }
            o.moves.push(PrimaryMove {
                at: SystemTime::now(),
                from: Some(from),
                to: host,
                cause: cause.to_owned(),
            });
        }
    });
}

/// A watcher found no server to use: leaderless from now, unless already.
pub(super) fn observe_leaderless(key: &str) {
    observed(key, |o| {
        o.leaderless_since.get_or_insert_with(SystemTime::now);
    });
}
