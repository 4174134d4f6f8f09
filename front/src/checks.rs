//! The conservation check's routes that a cell map routes by cell (ADR 0017 §11): each cell
//! runs its own check and keeps its own history and its own halt, so an admin names the cell.
//!
//! - `POST /api/v1/admin/invariant/clear?cell=N` goes to cell N. Without `cell` it is refused
//!   (400 BAD_REQUEST naming the cells halted now), never guessed: clearing a halt lets money
//!   move again in a cell where the check found it not conserved, so the operator names the
//!   cell they looked into. "Clear the only halted cell" would clear a cell nobody looked at
//!   whenever the one looked at was cleared meanwhile (by a colleague, another console) and
//!   another one halted since; the named cell costs one parameter.
//! - `GET /api/v1/admin/invariant/history` asks every cell (only cell N with `?cell=N`) and
//!   merges, newest first: each check names its `cell`, its report's link names the cell too,
//!   and the answer says `partial` and `down_cells` as the other fan-out views (`views.rs`).
//! - `GET /api/v1/admin/invariant/runs/{id}?cell=N` goes to cell N. Each cell numbers its own
//!   runs, so an id names a run in every cell: without `cell` it is refused (400), not searched
//!   for, since a search would answer with whichever cell's run has that id.

use axum::extract::Request;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cells::CellId;
use domain::ErrorCode;
use edge::error::ApiError;
use serde_json::json;

use crate::fanout;
use crate::route::Front;
use crate::views::{first_refusal, query_pairs, query_usize};

/// The history's page when `limit` is absent (`query_api`'s own default).
const HISTORY_PAGE_DEFAULT: usize = 50;
/// Longest a cell's halt flag is waited for when a clear names no cell.
const HALT_READ_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// A check route that names (or must name) a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckRoute {
    Clear,
    History,
    Run,
}

impl Front {
    /// The check route `method` and `path` name, if any (a method here, so the front router
    /// needs no path into this module: no import circle).
    pub(crate) fn check_route(&self, method: &Method, path: &str) -> Option<CheckRoute> {
        CheckRoute::of(method, path)
    }
}

impl CheckRoute {
    /// The check route `method` and `path` name, if any.
    pub fn of(method: &Method, path: &str) -> Option<Self> {
        match (method.clone(), path) {
            (Method::POST, "/api/v1/admin/invariant/clear") => Some(Self::Clear),
            (Method::GET, "/api/v1/admin/invariant/history") => Some(Self::History),
            (Method::GET, p) => p
                .strip_prefix("/api/v1/admin/invariant/runs/")
                .filter(|id| !id.is_empty() && !id.contains('/'))
                .map(|_| Self::Run),
            _ => None,
        }
    }

    /// Answers an admin's `req` across the cells of `front`.
    pub async fn run(self, front: &Front, req: Request) -> Response {
        let named = match named_cell(front, req.uri()) {
            Ok(named) => named,
            Err(refused) => return refused.into_response(),
        };
        match (self, named) {
            (Self::Clear | Self::Run, Some(cell)) => front.forward(cell, req).await,
            (Self::Clear, None) => unnamed_clear(front).await,
            (Self::Run, None) => ApiError::BadRequest(
                "under a cell map a run's id is its cell's own: name the cell with ?cell=N".into(),
            )
            .into_response(),
            (Self::History, only) => history(front, req, only).await,
        }
    }
}

/// The cell `uri`'s `?cell=N` names: `None` when absent, 400 when malformed, 404 for a cell the
/// map does not have.
pub(crate) fn named_cell(front: &Front, uri: &Uri) -> Result<Option<CellId>, ApiError> {
    let raw = query_pairs(uri)
        .into_iter()
        .find(|(k, _)| k == "cell")
        .map(|(_, v)| v);
    let Some(cell) = edge::reads::cell_param(raw.as_deref())? else {
        return Ok(None);
    };
    CellId::new(cell.into())
        .filter(|c| front.slots.contains_key(c))
        .map(Some)
        .ok_or_else(|| ApiError::RefusedBecause {
            code: ErrorCode::NotFound,
            message: format!("the cell map has no cell {cell}"),
        })
}

/// A clear that names no cell: 400 BAD_REQUEST, naming the cells halted now (`halted_cells`)
/// and those whose flag could not be read (`down_cells`), so the operator can name one.
async fn unnamed_clear(front: &Front) -> Response {
    let slots = front.slots.all();
    let reads = slots.iter().map(|(cell, slot)| async move {
        let halted = match slot.serving() {
            Some(served) => tokio::time::timeout(HALT_READ_MAX, served.halt.is_halted())
                .await
                .ok()
                .and_then(Result::ok),
            None => None,
        };
        (cell.get(), halted)
    });
    let flags = futures_util::future::join_all(reads).await;
    let halted: Vec<u16> = flags
        .iter()
        .filter(|(_, h)| *h == Some(true))
        .map(|(c, _)| *c)
        .collect();
    let unknown: Vec<u16> = flags
        .iter()
        .filter(|(_, h)| h.is_none())
        .map(|(c, _)| *c)
        .collect();
    let named = |cells: &[u16]| {
        cells
            .iter()
            .map(|c| format!("cell {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut message =
        "under a cell map a halt is cleared one cell at a time: name it with ?cell=N".to_owned();
    if halted.is_empty() {
        message.push_str("; no cell is halted");
    } else {
        message.push_str(&format!("; halted: {}", named(&halted)));
    }
    if !unknown.is_empty() {
        message.push_str(&format!("; not answering: {}", named(&unknown)));
    }
    let body = json!({
        "code": ErrorCode::BadRequest.as_str(),
        "message": message,
        "halted_cells": halted,
        "down_cells": unknown,
    });
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

/// The check history of every cell (or only of `only`), merged newest first.
async fn history(front: &Front, req: Request, only: Option<CellId>) -> Response {
    let (parts, _) = req.into_parts();
    let cells: Vec<CellId> = only.map_or_else(|| front.cells().collect(), |c| vec![c]);
    let answers = front.ask_cells(&cells, &parts.uri, &parts.headers).await;
    if let Some(refusal) = first_refusal(&answers) {
        return refusal;
    }
    let limit = query_usize(&parts.uri, "limit").unwrap_or(HISTORY_PAGE_DEFAULT);
    (StatusCode::OK, Json(fanout::history(&answers, limit))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_routes_a_map_routes_by_cell() {
        let of = |m: Method, p: &str| CheckRoute::of(&m, p);
        assert_eq!(
            of(Method::POST, "/api/v1/admin/invariant/clear"),
            Some(CheckRoute::Clear)
        );
        assert_eq!(
            of(Method::GET, "/api/v1/admin/invariant/history"),
            Some(CheckRoute::History)
        );
        assert_eq!(
            of(Method::GET, "/api/v1/admin/invariant/runs/12"),
            Some(CheckRoute::Run)
        );
        assert_eq!(of(Method::GET, "/api/v1/admin/invariant/runs/"), None);
        assert_eq!(of(Method::GET, "/api/v1/admin/invariant"), None);
        assert_eq!(of(Method::GET, "/api/v1/admin/invariant/clear"), None);
    }
}
