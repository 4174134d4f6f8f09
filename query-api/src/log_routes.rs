//! The tamper-evident log's routes (`docs/contract.md`, "The tamper-evident log"): the newest
//! signed checkpoint, the verifier key, an entry's exact leaf bytes, and inclusion and
//! consistency proofs, all read from what the follower stored (`tlog_follower::proofs`). Any
//! authenticated caller; an entry or an inclusion proof only for an admin or the entry's owner
//! (FORBIDDEN otherwise); consistency proofs for anyone. Each call takes a read turn first. A
//! transfer's receipt names the feed positions of its events, which its owner keeps to ask for
//! inclusion proofs later.

use std::collections::HashMap;

use application::reads::{Hash, LogEntry, LogReads};
use application::StoreError;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use domain::ErrorCode;
use serde_json::json;

use edge::auth::AuthUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

/// The log's routes; merged into the application router.
pub fn routes() -> Routes {
    Routes::new()
        .api(Method::GET, "/api/v1/log/checkpoint", checkpoint)
        .api(Method::GET, "/api/v1/log/key", key)
        .api(Method::GET, "/api/v1/log/entries/{position}", entry)
        .api(Method::GET, "/api/v1/log/proof/inclusion", inclusion)
        .api(Method::GET, "/api/v1/log/proof/consistency", consistency)
        .api(Method::GET, "/api/v1/log/receipts/{req_id}", receipt)
}

async fn turn(state: &AppState) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
    state
        .admission
        .read()
        .await
        .map_err(|_| ApiError::Refused(ErrorCode::RateLimitExceeded))
}

fn internal(e: StoreError) -> ApiError {
    ApiError::store("tamper-evident log", e)
}

fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::RefusedBecause {
        code: ErrorCode::NotFound,
        message: message.into(),
    }
}

fn text(body: String) -> Response {
    ([(CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// A positive integer query parameter, or BAD_REQUEST naming it.
fn param(params: &HashMap<String, String>, name: &str) -> Result<u64, ApiError> {
    bounded(params, name, 1)
}

/// An integer query parameter from `min` to `i64::MAX`, or BAD_REQUEST naming it.
fn bounded(params: &HashMap<String, String>, name: &str, min: u64) -> Result<u64, ApiError> {
    let bad = || ApiError::BadRequest(format!("`{name}` must be an integer of at least {min}"));
    let value = params.get(name).ok_or_else(bad)?;
    value
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=i64::MAX as u64).contains(n))
        .ok_or_else(bad)
}

/// `?cell=N`: the cell whose log is asked for. Under a cell map the front router sends the
/// request to cell N, so it must name this log's cell; without a map the one log is cell 1. Absent:
/// this log (the caller's own cell's, under a map). NOT_FOUND for a cell this is not, BAD_REQUEST
/// for a malformed one.
fn check_cell(log: &dyn LogReads, params: &HashMap<String, String>) -> Result<(), ApiError> {
    let Some(cell) = edge::reads::cell_param(params.get("cell").map(String::as_str))? else {
        return Ok(());
    };
    if log.cell().unwrap_or(1) == cell {
        Ok(())
    } else {
        Err(not_found(format!("no log of cell {cell} here")))
    }
}

fn b64(hashes: &[Hash]) -> Vec<String> {
    hashes.iter().map(|h| STANDARD.encode(h)).collect()
}

/// The entry at `position` if the caller may see it: NOT_FOUND when the tree does not hold it
/// (yet), FORBIDDEN when it is another user's and the caller is no admin.
async fn owned_entry(
    log: &dyn LogReads,
    user: AuthUser,
    position: u64,
) -> Result<LogEntry, ApiError> {
    let size = log.head().await.map_err(internal)?.size;
    let row = if position <= size {
        log.entry_at(position as i64).await.map_err(internal)?
    } else {
        None
    };
    let row =
        row.ok_or_else(|| not_found(format!("no entry at position {position} in the tree")))?;
    if !user.access().may_see_stored(row.user_id) {
        return Err(ApiError::Forbidden);
    }
    Ok(row)
}

/// `GET /api/v1/log/checkpoint`: the newest signed checkpoint, the note's text.
#[utoipa::path(get, path = "/api/v1/log/checkpoint",
    params(edge::openapi::LogCell),
    responses((status = 200, description = "the newest signed checkpoint: a C2SP signed note",
        content_type = "text/plain", body = String),
        edge::openapi::LogRefusals))]
pub(crate) async fn checkpoint(
    State(state): State<AppState>,
    _user: AuthUser,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    check_cell(state.reads.log(), &params)?;
    let _turn = turn(&state).await?;
    let note = state
        .reads
        .log()
        .latest_checkpoint()
        .await
        .map_err(internal)?
        .ok_or_else(|| not_found("no checkpoint has been signed yet"))?;
    Ok(text(note))
}

/// `GET /api/v1/log/key`: the verifier key of the log's signatures (C2SP vkey).
#[utoipa::path(get, path = "/api/v1/log/key",
    params(edge::openapi::LogCell),
    responses((status = 200, description = "the verifier key (C2SP vkey), one line",
        content_type = "text/plain", body = String),
        edge::openapi::LogRefusals))]
pub(crate) async fn key(
    State(state): State<AppState>,
    _user: AuthUser,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    check_cell(state.reads.log(), &params)?;
    let _turn = turn(&state).await?;
    let head = state.reads.log().head().await.map_err(internal)?;
    let vkey = head
        .vkey
        .ok_or_else(|| not_found("the log has not been signed yet"))?;
    Ok(text(format!("{vkey}\n")))
}

/// `GET /api/v1/log/entries/{position}`: the exact leaf bytes (canonical JSON).
#[utoipa::path(get, path = "/api/v1/log/entries/{position}",
    params(("position" = u64, Path, minimum = 1,
        description = "the entry's feed position"), edge::openapi::LogCell),
    responses((status = 200, description = "the entry's exact leaf bytes (RFC 8785 JSON)",
        content_type = "application/json", body = Object),
        edge::openapi::LogRefusals))]
pub(crate) async fn entry(
    State(state): State<AppState>,
    user: AuthUser,
    Path(position): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    check_cell(state.reads.log(), &params)?;
    let position = position
        .parse::<u64>()
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| ApiError::BadRequest("the position must be a positive integer".into()))?;
    let _turn = turn(&state).await?;
    let row = owned_entry(state.reads.log(), user, position).await?;
    Ok(([(CONTENT_TYPE, "application/json")], row.leaf).into_response())
}

/// `GET /api/v1/log/proof/inclusion?position=P&size=N`: the audit path of the entry at `P` in
/// the tree of `N` entries.
#[utoipa::path(get, path = "/api/v1/log/proof/inclusion",
    params(("position" = u64, Query, minimum = 1,
            description = "the entry's feed position"),
        ("size" = u64, Query, minimum = 1,
            description = "the tree size the proof is for; at least `position` (400 otherwise)"),
        edge::openapi::LogCell),
    responses((status = 200, description = "the RFC 6962 audit path, bottom-up, base64 hashes",
        body = Object),
        edge::openapi::LogRefusals))]
pub(crate) async fn inclusion(
    State(state): State<AppState>,
    user: AuthUser,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_cell(state.reads.log(), &params)?;
    let position = param(&params, "position")?;
    let size = param(&params, "size")?;
    if position > size {
        return Err(ApiError::BadRequest(
            "`position` must be at most `size`".into(),
        ));
    }
    let _turn = turn(&state).await?;
    let log = state.reads.log();
    owned_entry(log, user, position).await?;
    let proof = log
        .inclusion(position, size)
        .await
        .map_err(ApiError::proof)?;
    Ok(Json(json!({
        "position": position,
        "size": size,
        "leaf_index": position - 1,
        "leaf_hash": STANDARD.encode(proof.leaf_hash),
        "hashes": b64(&proof.hashes),
    })))
}

/// `GET /api/v1/log/proof/consistency?from=M&to=N`: the proof that the tree of `N` entries
/// extends the tree of `M`.
#[utoipa::path(get, path = "/api/v1/log/proof/consistency",
    params(("from" = u64, Query, minimum = 0,
            description = "the older tree size"),
        ("to" = u64, Query, minimum = 0,
            description = "the newer tree size; at least `from` (400 otherwise)"),
        edge::openapi::LogCell),
    responses((status = 200, description = "the RFC 6962 consistency proof, base64 hashes",
        body = Object),
        edge::openapi::LogRefusals))]
pub(crate) async fn consistency(
    State(state): State<AppState>,
    _user: AuthUser,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_cell(state.reads.log(), &params)?;
    // The empty tree (size 0) is consistent with every tree: its proof is empty (contract §10).
    let from = bounded(&params, "from", 0)?;
    let to = bounded(&params, "to", 0)?;
    if from > to {
        return Err(ApiError::BadRequest("`from` must be at most `to`".into()));
    }
    let _turn = turn(&state).await?;
    let hashes = state
        .reads
        .log()
        .consistency(from, to)
        .await
        .map_err(ApiError::proof)?;
    Ok(Json(
        json!({ "from": from, "to": to, "hashes": b64(&hashes) }),
    ))
}

/// `GET /api/v1/log/receipts/{req_id}`: the feed positions of a transfer's events and the tree's
/// size now (an event at a position up to it has an inclusion proof against any checkpoint of at
/// least that size). Its owner or an admin; NOT_FOUND otherwise, as for the transfer itself.
#[utoipa::path(get, path = "/api/v1/log/receipts/{req_id}",
    params(edge::openapi::TransferPath, edge::openapi::LogCell),
    responses((status = 200, description = "the feed positions of the transfer's events and the \
        tree's size now", body = Object),
        edge::openapi::LogRefusals))]
pub(crate) async fn receipt(
    State(state): State<AppState>,
    user: AuthUser,
    Path(req_id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_cell(state.reads.log(), &params)?;
    let _turn = turn(&state).await?;
    let log = state.reads.log();
    let events = log.of_transfer(&req_id).await.map_err(internal)?;
    let caller = user.access();
    let visible = events.iter().all(|e| caller.may_see_stored(e.user_id));
    if events.is_empty() || !visible {
        return Err(ApiError::NotFound);
    }
    let size = log.head().await.map_err(internal)?.size;
    let entries: Vec<_> = events
        .iter()
        .map(
            |e| json!({"position": e.position, "sequence": e.sequence, "event_type": e.event_type}),
        )
        .collect();
    let mut receipt = json!({ "req_id": req_id, "tree_size": size, "entries": entries });
    if let Some(cell) = log.cell() {
        receipt["cell"] = json!(cell);
    }
    Ok(Json(receipt))
}
