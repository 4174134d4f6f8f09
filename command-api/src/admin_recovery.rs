//! Manual intervention (seed 000 section 4.2, "manual intervention"): admin routes to list stuck
//! transfers with their retry records, and to resolve one whose outcome an operator has
//! confirmed. A resolution is recorded as an event with who (the admin's token) and why.
//!
//! - `GET /api/v1/admin/transfers/stuck?older_than_ms=N&limit=M`
//! - `POST /api/v1/admin/transfers/{req_id}/resolve` with `{"resolution": "APPLIED" |
//!   "NOT_APPLIED", "reason": "...", "force": false}`; `force: true` records the resolution even
//!   where the account system cannot confirm it (marked in the event's reason).
//!
//! The listing shows a retry's `last_error_category` (TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET,
//! MISMATCH, UNKNOWN), never the raw error text, which may hold SQL or socket detail.

use std::time::Duration;

use application::ManualResolutionError;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use domain::{ErrorCode, ReqId, Resolution, TransferError};
use recovery::stuck_transfers;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::auth::AdminUser;
use crate::error::ApiError;
use crate::render::rfc3339;
use crate::routes::JsonObject;
use crate::state::AppState;

/// Most rows one listing returns.
pub const STUCK_PAGE_SIZE_MAX: i64 = 500;
/// Default age a transfer must have to count as stuck.
const STUCK_OLDER_THAN_MS_DEFAULT: u64 = 60_000;
/// Longest reason an operator may record.
pub const REASON_CHARS_MAX: usize = 1_000;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/transfers/stuck", get(list_stuck))
        .route("/api/v1/admin/transfers/{req_id}/resolve", post(resolve))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StuckQuery {
    older_than_ms: Option<u64>,
    limit: Option<i64>,
}

async fn list_stuck(
    State(state): State<AppState>,
    _admin: AdminUser,
    query: Result<Query<StuckQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Ok(Query(q)) = query else {
        return Err(ApiError::BadRequest("malformed query string".into()));
    };
    let older_than = Duration::from_millis(q.older_than_ms.unwrap_or(STUCK_OLDER_THAN_MS_DEFAULT));
    let limit = q.limit.unwrap_or(100).clamp(1, STUCK_PAGE_SIZE_MAX);
    let rows = stuck_transfers(state.ledger.pool(), older_than, limit)
        .await
        .map_err(|e| ApiError::Internal(format!("list stuck transfers: {e}")))?;
    let transfers: Vec<Value> = rows
        .into_iter()
        .map(|r| {
            json!({
                "req_id": r.req_id,
                "user_id": r.user_id,
                "from": r.from_account,
                "to": r.to_account,
                "asset": r.asset,
                "amount": r.amount.map(crate::render::money),
                "state": r.state,
                "status": r.status,
                "updated_at": rfc3339(r.updated_at),
                "age_ms": r.age_ms,
                "attempts": r.attempts,
                "refund_failures": r.refund_failures,
                "last_error_category": r.last_error_category,
                "last_attempt_at": r.last_attempt_at.map(rfc3339),
                "next_retry_at": r.next_retry_at.map(rfc3339),
                "lease_owner": r.lease_owner,
                "lease_until": r.lease_until.map(rfc3339),
            })
        })
        .collect();
    Ok(Json(json!({ "transfers": transfers })))
}

/// What an operator asked for: the resolution, the reason and whether to force it.
struct ResolveRequest {
    resolution: Resolution,
    reason: String,
    force: bool,
}

async fn resolve(
    State(state): State<AppState>,
    admin: AdminUser,
    path: Result<Path<String>, PathRejection>,
    JsonObject(body): JsonObject,
) -> Result<Json<Value>, ApiError> {
    let Ok(Path(req_id)) = path else {
        return Err(ApiError::NotFound);
    };
    let req_id = ReqId::parse(&req_id).map_err(|_| ApiError::NotFound)?;
    let ResolveRequest {
        resolution,
        reason,
        force,
    } = resolve_request(body)?;
    let operator = format!("admin:{}", admin.user_id);
    let resumed = state
        .ledger
        .coordinator()
        .manually_resolve(&req_id, resolution, &operator, &reason, force)
        .await
        .map_err(|e| resolution_refusal(e, resolution))?;
    Ok(Json(json!({
        "req_id": req_id.to_string(),
        "state": resumed.data.state.as_str(),
        "resolution": resolution.as_str(),
        "operator": operator,
        "pending": resumed.unknown.is_some(),
    })))
}

/// Reads the body `{resolution, reason, force?}`, refusing any other field.
fn resolve_request(mut body: Map<String, Value>) -> Result<ResolveRequest, ApiError> {
    if let Some(unknown) = body
        .keys()
        .find(|k| !matches!(k.as_str(), "resolution" | "reason" | "force"))
    {
        return Err(unknown_field(unknown));
    }
    let resolution = match body.remove("resolution") {
        Some(Value::String(text)) => Resolution::parse(&text).ok_or_else(|| {
            ApiError::BadRequest("`resolution` must be APPLIED or NOT_APPLIED".into())
        })?,
        _ => {
            return Err(ApiError::BadRequest(
                "`resolution` (APPLIED or NOT_APPLIED) is required".into(),
            ))
        }
    };
    let reason = operator_reason(body.remove("reason"))?;
    let force = match body.remove("force") {
        None => false,
        Some(Value::Bool(force)) => force,
        Some(_) => return Err(ApiError::BadRequest("`force` must be a boolean".into())),
    };
    Ok(ResolveRequest {
        resolution,
        reason,
        force,
    })
}

/// A field the route does not take, named (cut short) in the refusal.
pub(crate) fn unknown_field(name: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "unknown field `{}`",
        name.chars().take(64).collect::<String>()
    ))
}

/// The operator's `reason`: required, 1 to [`REASON_CHARS_MAX`] characters, not blank.
pub(crate) fn operator_reason(value: Option<Value>) -> Result<String, ApiError> {
    match value {
        Some(Value::String(text))
            if !text.trim().is_empty() && text.chars().count() <= REASON_CHARS_MAX =>
        {
            Ok(text)
        }
        _ => Err(ApiError::BadRequest(format!(
            "`reason` is required: 1 to {REASON_CHARS_MAX} characters"
        ))),
    }
}

/// A refused resolution in the error shape, with a specific sentence (no internal text).
fn resolution_refusal(e: ManualResolutionError, resolution: Resolution) -> ApiError {
    let resolution = resolution.as_str();
    match e {
        ManualResolutionError::NotFound => ApiError::NotFound,
        ManualResolutionError::Refused(TransferError::Terminal { state }) => ApiError::because(
            ErrorCode::Conflict,
            format!("transfer is {state}, a terminal state; it never changes"),
        ),
        ManualResolutionError::Refused(TransferError::IllegalTransition { state, .. }) => {
            ApiError::because(
                ErrorCode::Conflict,
                format!("a {resolution} resolution is not allowed in state {state}"),
            )
        }
        ManualResolutionError::Refused(_) => {
            ApiError::BadRequest("operator and reason are required".into())
        }
        ManualResolutionError::Contradicted(_) => ApiError::because(
            ErrorCode::Conflict,
            format!(
                "the account system's own record contradicts {resolution}; nothing was recorded"
            ),
        ),
        ManualResolutionError::Mismatch(_) => ApiError::because(
            ErrorCode::ReqIdMismatch,
            "the account system holds this req_id for a different movement (user, asset or \
             amount); no resolution can be recorded: investigate",
        ),
        ManualResolutionError::Unavailable(_) => ApiError::because(
            ErrorCode::AccountSystemUnavailable,
            format!(
                "the account system could not confirm {resolution} (for NOT_APPLIED: could not \
                 durably cancel the pending call); nothing was recorded. Retry when it is \
                 reachable, or send \"force\": true only if you are certain"
            ),
        ),
        ManualResolutionError::Busy => ApiError::because(
            ErrorCode::TransferBusy,
            "a recovery worker or another operator is working this transfer; try again shortly",
        ),
        ManualResolutionError::Coordinator(e) => {
            ApiError::Internal(format!("manual resolution: {e}"))
        }
    }
}
