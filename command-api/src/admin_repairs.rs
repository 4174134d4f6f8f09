//! The operator's repair of a transfer a PostgreSQL failover lost (`application::repair`,
//! `docs/runbook.md`, "PostgreSQL failover"): `POST /api/v1/admin/repairs/{req_id}` with
//! `{"reason": "..."}` re-records, from spot-core's record, a transfer whose SPOT movement
//! survived while its events did not, and drives it to its end. Audited (the repair row with
//! who and why, and the transfer's own events) and idempotent: a repeat answers from the stored
//! repair with `"repeated": true` and never applies anything twice.

use application::RepairError;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::Json;
use domain::{ErrorCode, ReqId};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use crate::admin_recovery::{operator_reason, unknown_field};
use crate::body::JsonObject;
use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Routes {
    Routes::new().api(Method::POST, "/api/v1/admin/repairs/{req_id}", repair)
}

/// `POST /api/v1/admin/repairs/{req_id}`: re-records a transfer a failover lost. A req_id past
/// spot-core's idempotency horizon is 409 NOT_REPAIRABLE (no retry can read its record); 503
/// only when spot-core could not answer.
#[utoipa::path(post, path = "/api/v1/admin/repairs/{req_id}",
    params(edge::openapi::TransferPath),
    request_body = RepairBody,
    responses((status = 200, description = "the repair is recorded (or was: `repeated`)",
        body = RepairResponse),
        edge::openapi::RepairRefusals))]
async fn repair(
    State(state): State<AppState>,
    admin: AdminUser,
    path: Result<Path<String>, PathRejection>,
    JsonObject(mut body): JsonObject,
) -> Result<Json<Value>, ApiError> {
    let Ok(Path(req_id)) = path else {
        return Err(ApiError::NotFound);
    };
    let req_id = ReqId::parse(&req_id).map_err(|_| ApiError::NotFound)?;
    if let Some(unknown) = body.keys().find(|k| k.as_str() != "reason") {
        return Err(unknown_field(unknown));
    }
    let reason = operator_reason(body.remove("reason"))?;
    let operator = format!("admin:{}", admin.user_id);
    let outcome = state
        .ledger
        .repair_lost(&req_id, &operator, &reason)
        .await
        .map_err(repair_refusal)?;
    Ok(Json(json!(outcome)))
}

/// A refused repair in the error shape: the refusal's own sentence (written by `application`,
/// no internal text) under its contract code.
fn repair_refusal(e: RepairError) -> ApiError {
    let message = e.to_string();
    match e {
        RepairError::Known(_) => ApiError::because(
            ErrorCode::TransferKnown,
            format!("{message}: the recovery worker resumes it, or resolve it by hand"),
        ),
        RepairError::NothingApplied => ApiError::because(ErrorCode::NothingToRepair, message),
        RepairError::NotRepairable(_) | RepairError::PastHorizon { .. } => {
            ApiError::because(ErrorCode::NotRepairable, message)
        }
        RepairError::InsufficientFunding { .. } => {
            ApiError::because(ErrorCode::InsufficientFunding, message)
        }
        RepairError::SpotUnavailable(detail) => {
            tracing::warn!(error = %detail, "failover repair: spot-core could not answer");
            ApiError::because(
                ErrorCode::AccountSystemUnavailable,
                "spot-core could not answer; nothing was recorded",
            )
        }
        RepairError::MissingReason => ApiError::BadRequest(message),
        RepairError::Database(_) | RepairError::Coordinator(_) => {
            ApiError::Internal(format!("failover repair: {}", application::error_chain(&e)))
        }
    }
}

// ---- the schema-only types of the OpenAPI document (`crate::openapi`): utoipa reads their
// fields' attributes, no code reads the fields.

/// `POST /api/v1/admin/repairs/{req_id}`' body.
#[allow(dead_code)]
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RepairRequest)]
pub struct RepairBody {
    #[schema(schema_with = crate::admin_recovery::reason_schema)]
    pub reason: String,
}

/// A repair as recorded (`repeated` when an earlier request had already recorded it).
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
pub struct RepairResponse {
    #[schema(schema_with = edge::openapi::req_id)]
    pub req_id: String,
    pub action: String,
    pub user_id: i64,
    pub from: String,
    pub to: String,
    pub asset: String,
    pub amount: String,
    /// The transfer's state now.
    pub state: String,
    pub repeated: bool,
    pub operator: String,
    pub reason: String,
    #[schema(schema_with = edge::openapi::date_time)]
    pub requested_at: String,
}
