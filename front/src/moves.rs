//! The partition moves' admin routes (ADR 0023 §4), answered by the front because a move spans
//! cells: `POST /api/v1/admin/cells/moves` (`{"partition": P, "to": C}`) records a move of P
//! from the cell that owns it under the newest map to cell C and wakes the move worker, which
//! drives it; `GET /api/v1/admin/cells/moves` lists the latest moves and
//! `GET /api/v1/admin/cells/moves/{id}` one; `POST /api/v1/admin/cells/moves/{id}/cancel`
//! cancels one that has not begun its switch. The runner and the records come from wiring over
//! every cell's ports (`application::moves::MoveDesk`); the front decides nothing a move decides.

use application::moves::{MoveDesk, MoveError, MoveId, MoveRecord};
use application::ports::{Clock, SystemClock};
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cells::{CellId, Partition};
use domain::ErrorCode;
use edge::error::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::route::Front;

const PATH: &str = "/api/v1/admin/cells/moves";
/// The longest list `GET` answers.
const LIST_MAX: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMove {
    partition: u64,
    to: u64,
}

impl Front {
    /// Whether `path` is one of the move routes.
    pub(crate) fn is_moves_path(path: &str) -> bool {
        path == PATH || path.starts_with("/api/v1/admin/cells/moves/")
    }

    /// Answers the partition moves' admin routes through `desk`.
    pub fn with_moves(mut self, desk: MoveDesk) -> Self {
        self.moves = Some(desk);
        self
    }

    /// An admin's request of a move route.
    pub(crate) async fn moves(&self, req: Request) -> Response {
        let Some(desk) = self.moves.clone() else {
            return ApiError::NotFound.into_response();
        };
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let rest = path.strip_prefix(PATH).unwrap_or("");
        let answer = match (method, rest) {
            (Method::GET, "") => list(&desk).await,
            (Method::POST, "") => self.start_move(&desk, req).await,
            (Method::GET, id) => one(&desk, id.trim_start_matches('/')).await,
            (Method::POST, id) if id.ends_with("/cancel") => {
                let id = id.trim_start_matches('/').trim_end_matches("/cancel");
                cancel(&desk, id).await
            }
            _ => Err(ApiError::MethodNotAllowed),
        };
        answer.unwrap_or_else(IntoResponse::into_response)
    }

    async fn start_move(&self, desk: &MoveDesk, req: Request) -> Result<Response, ApiError> {
        let bytes = axum::body::to_bytes(req.into_body(), 4096)
            .await
            .map_err(|_| ApiError::PayloadTooLarge(4096))?;
        let asked: NewMove = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::BadRequest(format!("a move is {{\"partition\", \"to\"}}: {e}"))
        })?;
        let partition = Partition::new(asked.partition)
            .ok_or_else(|| ApiError::BadRequest("partition is 0 to 255".into()))?;
        let to = CellId::new(asked.to)
            .filter(|c| self.slots.contains_key(c))
            .ok_or_else(|| ApiError::BadRequest(format!("no cell {} in the map", asked.to)))?;
        // The newest map: a move planned on an old one would be refused by its source.
        self.map.reload_from(&self.slots).await;
        let held = self.map.held();
        let from = held.placement.owner(partition);
        let id = MoveId(SystemClock.req_id().to_string());
        match desk
            .runner
            .start(id, partition, from, to, held.version)
            .await
        {
            Ok(record) => {
                desk.wake.notify_one();
                Ok((StatusCode::ACCEPTED, Json(describe(&record))).into_response())
            }
            Err(e) => Err(refusal(e)),
        }
    }
}

async fn list(desk: &MoveDesk) -> Result<Response, ApiError> {
    let moves = desk
        .records
        .recent(LIST_MAX)
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let moves: Vec<Value> = moves.iter().map(describe).collect();
    Ok(Json(json!({ "moves": moves })).into_response())
}

async fn one(desk: &MoveDesk, id: &str) -> Result<Response, ApiError> {
    match desk.records.load(&MoveId(id.to_owned())).await {
        Ok(Some(record)) => Ok(Json(describe(&record)).into_response()),
        Ok(None) => Err(ApiError::NotFound),
        Err(e) => Err(ApiError::Unavailable(e.to_string())),
    }
}

async fn cancel(desk: &MoveDesk, id: &str) -> Result<Response, ApiError> {
    match desk
        .runner
        .cancel(&MoveId(id.to_owned()), "cancelled by an admin")
        .await
    {
        Ok(record) => {
            desk.wake.notify_one();
            Ok(Json(describe(&record)).into_response())
        }
        Err(e) => Err(refusal(e)),
    }
}

/// A refused start or cancel, answered with the contract's codes.
fn refusal(e: MoveError) -> ApiError {
    match e {
        MoveError::NotFound(_) => ApiError::NotFound,
        MoveError::SameCell(_) => ApiError::BadRequest(e.to_string()),
        MoveError::Busy(..) | MoveError::NotCancellable(..) | MoveError::NotOwned(_) => {
            ApiError::RefusedBecause {
                code: ErrorCode::Conflict,
                message: e.to_string(),
            }
        }
        MoveError::Superseded(_) | MoveError::Store(_) => ApiError::Unavailable(e.to_string()),
    }
}

/// A move as the routes answer it.
pub fn describe(record: &MoveRecord) -> Value {
    json!({
        "id": record.id.0,
        "partition": record.partition.get(),
        "from": record.from.get(),
        "to": record.to.get(),
        "step": record.step.as_str(),
        "map_version": record.map_version,
        "copied": record.copied,
        "passes": record.passes,
        "last_pass": record.last_pass,
        "spot_accounts": record.spot.as_ref().map(std::collections::BTreeMap::len),
        "cancelled_at": record.cancelled_at.map(|s| s.as_str()),
        "reason": record.reason,
    })
}
