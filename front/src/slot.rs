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

/// Every cell of the process, by id (ascending: the first is the home cell).
pub type Slots = Arc<BTreeMap<CellId, Arc<CellSlot>>>;

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
    let cells: Vec<Value> = slots.values().map(|s| s.describe()).collect();
    let all_up = slots.values().all(|s| s.is_up());
    let status = if all_up { "ok" } else { "degraded" };
    Json(json!({ "status": status, "cells": cells })).into_response()
}
