//! The cell map the front routes by, and its reload at run time (ADR 0023 §1: "a process that
//! meets a higher version reloads the map"). Start-up gives the file's map, version 1; every
//! cell stores the whole map and its version (`application::cell_map`, each cell's own port in
//! its [`Served`](crate::slot::Served)), and a partition's switch writes version N+1 into every
//! cell. The front reloads:
//!
//! - when a cell answers a write with the partition fence's refusal (a 503 carrying
//!   `edge::error::ROUTE_AGAIN`: nothing was written): the map is reloaded and, if the request's
//!   user now lives in another cell, the request is sent there once more (`Front::to_user`,
//!   `route.rs`);
//! - when a cell's watcher (`ledger/src/cellular/watch.rs`) reads a higher version than the
//!   one held (every `LEDGER_MAP_RELOAD_PROBES` probes).
//!
//! A reload reads the version of every cell that serves, takes the highest, and reads the
//! assignments from that cell. A version no higher than the one held is never installed, so
//! routing never goes back to an older map; one that names a cell this process does not serve,
//! or does not name every partition once, is refused (logged) and the held map stays.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use application::cell_map::CellMapStore;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::response::Response;
use cells::{CellId, Placement};
use domain::UserId;
use edge::error::{ROUTE_AGAIN, ROUTE_AGAIN_MAP};

use crate::slot::Slots;

/// The longest one cell's stored map may take to be read during a reload.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A map the front routes by: its placement and the version it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub version: u64,
    pub placement: Placement,
}

/// The map held now, swapped whole by a reload. Shared by the front and the cells' watchers.
pub struct LiveMap {
    held: RwLock<Arc<Held>>,
    /// One reload at a time: a burst of fenced refusals reads the cells once, not once each.
    reloading: tokio::sync::Mutex<()>,
}

/// What a reload came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// A newer map is held now.
    Installed { from: u64, to: u64 },
    /// No cell that answered holds a newer version than `held` (the highest found: `found`).
    NotNewer { held: u64, found: Option<u64> },
    /// The newest stored map cannot be routed by (why); the held map stays.
    Refused(String),
}

impl LiveMap {
    /// The map of `placement` at `version` (the file's is version 1).
    pub fn new(placement: Placement, version: u64) -> Self {
        Self {
            held: RwLock::new(Arc::new(Held { version, placement })),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    /// The map held now.
    pub fn held(&self) -> Arc<Held> {
        Arc::clone(&self.held.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The version held now.
    pub fn version(&self) -> u64 {
        self.held().version
    }

    /// The cell `user` lives in under the map held now.
    pub fn cell_of(&self, user: UserId) -> CellId {
        self.held().placement.cell_of(user)
    }

    /// Installs `placement` as of `version` when that is higher than the version held; a lower
    /// or equal one is never installed. Returns the version replaced, if it was.
    pub fn offer(&self, version: u64, placement: Placement) -> Option<u64> {
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        if version <= held.version {
            return None;
        }
        let from = held.version;
        *held = Arc::new(Held { version, placement });
        Some(from)
    }

    /// Reloads from every cell that serves in `slots`.
    pub async fn reload_from(&self, slots: &Slots) -> Reload {
        let slots = slots.all();
        let stores: Vec<(CellId, Arc<dyn CellMapStore>)> = slots
            .values()
            .filter_map(|slot| slot.serving().map(|served| (slot.id, served.map)))
            .collect();
        let cells: BTreeSet<CellId> = slots.keys().copied().collect();
        self.reload(&stores, &cells).await
    }

    /// Reads each of `stores`' version, and the assignments of the highest; installs them if
    /// they are newer than the map held and name only `cells`.
    pub async fn reload(
        &self,
        stores: &[(CellId, Arc<dyn CellMapStore>)],
        cells: &BTreeSet<CellId>,
    ) -> Reload {
        let _one = self.reloading.lock().await;
        let held = self.version();
        let versions = futures_util::future::join_all(
            stores
                .iter()
                .map(|(_, store)| tokio::time::timeout(READ_TIMEOUT, store.map_version())),
        )
        .await;
        let newest = stores
            .iter()
            .zip(versions)
            .filter_map(|((cell, store), v)| Some((v.ok()?.ok()?, *cell, store)))
            .max_by_key(|(version, cell, _)| (*version, std::cmp::Reverse(*cell)));
        let highest = newest.as_ref().map(|(v, _, _)| *v);
        let Some((found, cell, store)) = newest.filter(|(v, _, _)| *v > held) else {
            return Reload::NotNewer {
                held,
                found: highest,
            };
        };
        let stored = match tokio::time::timeout(READ_TIMEOUT, store.stored_map()).await {
            Ok(Ok(stored)) => stored,
            Ok(Err(e)) => return refused(format!("cell {cell}'s map {found}: {e}")),
            Err(_) => return refused(format!("cell {cell}'s map {found}: no answer")),
        };
        let Some(placement) = Placement::of_stored(&stored.owners) else {
            return refused(format!(
                "cell {cell}'s map {}: not every partition named once",
                stored.version
            ));
        };
        if let Some(stranger) = placement.cells().into_iter().find(|c| !cells.contains(c)) {
            return refused(format!(
                "cell {cell}'s map {} names cell {stranger}, which this process does not serve",
                stored.version
            ));
        }
        match self.offer(stored.version, placement) {
            Some(from) => {
                tracing::info!(%cell, "map version {from} -> {} reloaded", stored.version);
                Reload::Installed {
                    from,
                    to: stored.version,
                }
            }
            None => Reload::NotNewer {
                held: self.version(),
                found: Some(stored.version),
            },
        }
    }
}

fn refused(why: String) -> Reload {
    tracing::warn!(%why, "a newer cell map was found but not installed");
    Reload::Refused(why)
}

/// Whether a cell's answer is the partition fence's refusal (nothing written).
pub fn routes_again(answer: &Response) -> bool {
    answer
        .headers()
        .get(ROUTE_AGAIN)
        .is_some_and(|v| v.as_bytes() == ROUTE_AGAIN_MAP.as_bytes())
}

/// A request rebuilt from `parts` and its buffered body (the same bytes: its length holds).
pub(crate) fn rebuilt(parts: &Parts, bytes: Bytes) -> Request {
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version)
        .body(Body::from(bytes))
        .expect("a copy of a valid request is valid");
    *req.headers_mut() = parts.headers.clone();
    req
}

#[cfg(test)]
mod tests;
