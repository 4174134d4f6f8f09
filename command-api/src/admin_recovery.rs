//! Manual intervention: the admin route that resolves a transfer whose outcome an operator has
//! confirmed (the stuck listing it starts from is the query side's, `query_api::stuck`). A
//! resolution is recorded as an event with who (the admin's token) and why.
//!
//! - `POST /api/v1/admin/transfers/{req_id}/resolve` with `{"resolution": "APPLIED" |
//!   "NOT_APPLIED", "reason": "...", "force": false}`; `force: true` records the resolution even
//!   where the account system cannot confirm it (marked in the event's reason).

use application::ManualResolutionError;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::Json;
use domain::{ErrorCode, ReqId, Resolution, TransferError};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

use crate::body::JsonObject;

/// Longest reason an operator may record.
pub const REASON_CHARS_MAX: usize = 1_000;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Routes {
    Routes::new().api(
        Method::POST,
        "/api/v1/admin/transfers/{req_id}/resolve",
        resolve,
    )
}

/// What an operator asked for: the resolution, the reason and whether to force it.
struct ResolveRequest {
    resolution: Resolution,
    reason: String,
    force: bool,
}

/// `POST /api/v1/admin/transfers/{req_id}/resolve`: records an operator's confirmed outcome.
#[utoipa::path(post, path = "/api/v1/admin/transfers/{req_id}/resolve",
    params(edge::openapi::TransferPath),
    request_body = ResolveBody,
    responses((status = 200, description = "the resolution is recorded",
        body = ResolveResponse),
        edge::openapi::ResolveRefusals))]
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

// ---- the schema-only types of the OpenAPI document (`crate::openapi`): utoipa reads their
// fields' attributes, no code reads the fields.

/// An operator's reason: 1 to 1,000 characters, not only whitespace.
pub(crate) fn reason_schema() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .min_length(Some(1))
        .max_length(Some(crate::admin_recovery::REASON_CHARS_MAX))
        .pattern(Some(r"\S"))
        .description(Some(
            "why: 1 to 1,000 characters, not only whitespace; recorded with the admin's id",
        ))
        .build()
}

/// `POST /api/v1/admin/transfers/{req_id}/resolve`' body.
#[allow(dead_code)]
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ResolveRequest)]
pub struct ResolveBody {
    /// What the operator confirmed: the pending call was applied, or it was not.
    #[schema(inline)]
    pub resolution: ResolutionName,
    #[schema(schema_with = reason_schema)]
    pub reason: String,
    /// Record the resolution even where the account system cannot confirm it (marked in the
    /// event's reason). False when absent.
    #[schema(required = false, nullable = false)]
    pub force: Option<bool>,
}

/// A manual resolution's outcome.
#[allow(dead_code)]
#[derive(Debug, Deserialize, ToSchema)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum ResolutionName {
    APPLIED,
    NOT_APPLIED,
}

/// The resolved transfer.
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
pub struct ResolveResponse {
    #[schema(schema_with = edge::openapi::req_id)]
    pub req_id: String,
    /// The transfer's state after the resolution (and the drive it allowed).
    pub state: String,
    #[schema(inline)]
    pub resolution: ResolutionName,
    /// `admin:<user id>`.
    pub operator: String,
    /// True when the transfer is not yet at its end (an account system's outcome is unknown).
    pub pending: bool,
}
