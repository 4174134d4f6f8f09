//! The operator's repair of a transfer a PostgreSQL failover lost (`application::repair`,
//! `docs/runbook.md`, "PostgreSQL failover"): `POST /api/v1/admin/repairs/{req_id}` with
//! `{"reason": "..."}` re-records, from spot-core's record, a transfer whose SPOT movement
//! survived while its events did not, and drives it to its end. Audited (the repair row with
//! who and why, and the transfer's own events) and idempotent: a repeat answers from the stored
//! repair with `"repeated": true` and never applies anything twice.

use application::RepairError;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use domain::ReqId;
use serde_json::{json, Value};

use crate::admin_recovery::{refusal, REASON_CHARS_MAX};
use crate::app::AppState;
use crate::auth::AdminUser;
use crate::error::ApiError;
use crate::routes::JsonObject;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Router<AppState> {
    Router::new().route("/api/v1/admin/repairs/{req_id}", post(repair))
}

async fn repair(
    State(state): State<AppState>,
    admin: AdminUser,
    path: Result<Path<String>, PathRejection>,
    JsonObject(mut body): JsonObject,
) -> Result<Response, ApiError> {
    let Ok(Path(req_id)) = path else {
        return Err(ApiError::NotFound);
    };
    let req_id = ReqId::parse(&req_id).map_err(|_| ApiError::NotFound)?;
    if let Some(unknown) = body.keys().find(|k| k.as_str() != "reason") {
        return Err(ApiError::BadRequest(format!(
            "unknown field `{}`",
            unknown.chars().take(64).collect::<String>()
        )));
    }
    let reason = match body.remove("reason") {
        Some(Value::String(text))
            if !text.trim().is_empty() && text.chars().count() <= REASON_CHARS_MAX =>
        {
            text
        }
        _ => {
            return Err(ApiError::BadRequest(format!(
                "`reason` is required: 1 to {REASON_CHARS_MAX} characters"
            )))
        }
    };
    let operator = format!("admin:{}", admin.user_id);
    let ledger = &state.ledger;
    match ledger
        .coordinator()
        .repair_lost(ledger.spot(), &req_id, &operator, &reason)
        .await
    {
        Ok(outcome) => Ok(Json(json!(outcome)).into_response()),
        Err(e) => repair_refusal(e),
    }
}

fn repair_refusal(e: RepairError) -> Result<Response, ApiError> {
    let message = e.to_string();
    Ok(match e {
        RepairError::Known(_) => refusal(
            StatusCode::CONFLICT,
            "TRANSFER_KNOWN",
            format!("{message}: the recovery worker resumes it, or resolve it by hand"),
        ),
        RepairError::NothingApplied => refusal(StatusCode::CONFLICT, "NOTHING_TO_REPAIR", message),
        RepairError::NotRepairable(_) => refusal(StatusCode::CONFLICT, "NOT_REPAIRABLE", message),
        RepairError::InsufficientFunding { .. } => {
            refusal(StatusCode::CONFLICT, "INSUFFICIENT_FUNDING", message)
        }
        RepairError::SpotUnavailable(detail) => {
            tracing::warn!(error = %detail, "failover repair: spot-core could not answer");
            refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "ACCOUNT_SYSTEM_UNAVAILABLE",
                "spot-core could not answer; nothing was recorded".into(),
            )
        }
        RepairError::MissingReason => return Err(ApiError::BadRequest(message)),
        RepairError::Database(_) | RepairError::Coordinator(_) => {
            return Err(ApiError::Internal(format!(
                "failover repair: {}",
                application::error_chain(&e)
            )))
        }
    })
}
