//! Each cell's place behind the front router (ADR 0017 §11, "one cell down is not the whole
//! service down"): whether the cell serves now, what it serves with once it has been reached,
//! and its bulkhead. A cell that is down is answered at once, 503 naming it, without touching
//! its pool; a cell that is up takes at most its share of the process's requests in flight, so
//! a cell whose database hangs cannot hold every connection of the process.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use application::external_ids::ExternalClaims;
use application::stores::HaltFlag;
use axum::http::header::RETRY_AFTER;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use cells::CellId;
use serde_json::{json, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a reached cell serves with.
#[derive(Clone)]
pub struct Served {
    /// The cell's read side (the merged feed reads each cell's feed through it).
    pub reads: edge::reads::ReadSide,
    /// The whole of today's application over this cell's state.
    pub app: Router,
    /// The cell's `/metrics` (its figures, before the `cell` label is added).
    pub metrics: Router,
    /// The cell's halt flag (a clear that names no cell reads every cell's).
    pub halt: Arc<dyn HaltFlag>,
    /// The external_id claims the cell keeps (`claims.rs`).
    pub claims: Arc<dyn ExternalClaims>,
    /// The cell's asset settings (reloaded after a catch-up).
    pub assets: application::AssetSettings,
    /// The cell map the cell stores, and its version (`map.rs` reloads from it).
    pub map: Arc<dyn application::cell_map::CellMapStore>,
}

/// Whether a cell serves, and since when it does not.
#[derive(Clone)]
struct Inner {
    up: bool,
    /// When the cell was last seen going down (or start-up, if never reached).
    down_since: Option<chrono::DateTime<chrono::Utc>>,
    served: Option<Served>,
}

/// One cell behind the front.
pub struct CellSlot {
    pub id: CellId,
    inner: RwLock<Inner>,
    bulkhead: Arc<Semaphore>,
}

/// Why a cell did not take a request.
pub enum Refusal {
    /// Not reached yet, or its database stopped answering.
    Down,
    /// Its share of the requests in flight is taken.
    Saturated,
}

impl CellSlot {
    /// A cell not reached yet, taking at most `in_flight_max` requests at once.
    pub fn new(id: CellId, in_flight_max: usize) -> Self {
        Self {
            id,
            inner: RwLock::new(Inner {
                up: false,
                down_since: Some(chrono::Utc::now()),
                served: None,
            }),
            bulkhead: Arc::new(Semaphore::new(in_flight_max.max(1))),
        }
    }

    fn read(&self) -> Inner {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn write(&self, f: impl FnOnce(&mut Inner)) {
        f(&mut self.inner.write().unwrap_or_else(|e| e.into_inner()));
    }

    /// The cell's router and a bulkhead permit to hold while it answers, or why not.
    pub fn admit(&self) -> Result<(Router, OwnedSemaphorePermit), Refusal> {
        let app = {
            let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
            match (&inner.served, inner.up) {
                (Some(served), true) => served.app.clone(),
                _ => return Err(Refusal::Down),
            }
        };
        let permit = Arc::clone(&self.bulkhead)
            .try_acquire_owned()
            .map_err(|_| Refusal::Saturated)?;
        Ok((app, permit))
    }

    /// What the cell serves with, once reached (up or down since).
    pub fn served(&self) -> Option<Served> {
        self.read().served
    }

    /// What the cell serves with while it is up.
    pub fn serving(&self) -> Option<Served> {
        let inner = self.read();
        inner.served.filter(|_| inner.up)
    }

    pub fn is_up(&self) -> bool {
        self.read().up
    }

    /// The cell has been reached: it serves with `served` from now on.
    pub fn install(&self, served: Served) {
        self.write(|inner| {
            inner.served = Some(served);
            inner.up = true;
            inner.down_since = None;
        });
    }

    /// The cell answers again (after catching up).
    pub fn set_up(&self) {
        self.write(|inner| {
            inner.up = true;
            inner.down_since = None;
        });
    }

    /// The cell stopped answering; returns whether it was up until now.
    pub fn set_down(&self) -> bool {
        let mut was_up = false;
        self.write(|inner| {
            was_up = inner.up;
            if inner.up {
                inner.down_since = Some(chrono::Utc::now());
            }
            inner.up = false;
        });
        was_up
    }

    /// `{cell, state, down_since?}` for `/healthz` and the fan-out views.
    pub fn describe(&self) -> Value {
        let inner = self.read();
        let mut out = json!({
            "cell": self.id.get(),
            "state": if inner.up { "up" } else { "down" },
        });
        if let (false, Some(since)) = (inner.up, inner.down_since) {
            out["down_since"] = json!(since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        }
        out
    }
}

/// Every cell of the process, by id (ascending: the first is the home cell). A cell added
/// while the process serves (`ledger cells add`, ADR 0023 §1) joins with [`Slots::add`]; a
/// cell is never removed. Cheap to clone: every clone sees the cells added since.
#[derive(Clone)]
pub struct Slots(Arc<RwLock<SlotMap>>);

/// The cells' slots at one moment.
pub type SlotMap = Arc<BTreeMap<CellId, Arc<CellSlot>>>;

impl Slots {
    /// The slots of the cells a process starts with (at least one).
    pub fn new(slots: impl IntoIterator<Item = Arc<CellSlot>>) -> Self {
        let all = slots.into_iter().map(|s| (s.id, s)).collect();
        Self(Arc::new(RwLock::new(Arc::new(all))))
    }

    /// Every cell now, by id: a snapshot that a later addition does not change.
    pub fn all(&self) -> SlotMap {
        Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn get(&self, cell: &CellId) -> Option<Arc<CellSlot>> {
        self.all().get(cell).cloned()
    }

    pub fn contains_key(&self, cell: &CellId) -> bool {
        self.all().contains_key(cell)
    }

    /// The cells' ids, ascending.
    pub fn ids(&self) -> Vec<CellId> {
        self.all().keys().copied().collect()
    }

    /// The home cell: the lowest id (additions take higher ones).
    pub fn home(&self) -> CellId {
        *self
            .all()
            .keys()
            .next()
            .expect("a process serves at least one cell")
    }

    /// Adds `slot`; `false` (and nothing changed) when its cell is already there.
    pub fn add(&self, slot: Arc<CellSlot>) -> bool {
        let mut held = self.0.write().unwrap_or_else(|e| e.into_inner());
        if held.contains_key(&slot.id) {
            return false;
        }
        let mut next = BTreeMap::clone(&held);
        next.insert(slot.id, slot);
        *held = Arc::new(next);
        true
    }
}

/// The answer for a request whose cell cannot take it: 503 SYSTEM_ERROR naming the cell, with
/// `Retry-After`.
pub fn refused(cell: CellId, why: &Refusal) -> Response {
    let message = match why {
        Refusal::Down => format!("cell {cell} is unavailable; retry later"),
        Refusal::Saturated => format!("cell {cell} has too many requests in flight; retry later"),
    };
    let body = json!({
        "code": domain::ErrorCode::SystemError.as_str(),
        "message": message,
        "cell": cell.get(),
    });
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(RETRY_AFTER, "1")],
        Json(body),
    )
        .into_response()
}

/// `GET /healthz` under a cell map: the process is alive (200); `status` is `ok` when every
/// cell serves, `degraded` otherwise, and `cells` says which.
pub fn healthz(slots: &Slots) -> Response {
    let slots = slots.all();
    let cells: Vec<Value> = slots.values().map(|s| s.describe()).collect();
    let all_up = slots.values().all(|s| s.is_up());
    let status = if all_up { "ok" } else { "degraded" };
    Json(json!({ "status": status, "cells": cells })).into_response()
}
