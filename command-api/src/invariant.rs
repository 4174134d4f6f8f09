//! The conservation check's admin routes (the check and the halt flag are the core's,
//! `application::audit` and `application::halt`): `GET /api/v1/admin/invariant` runs the check
//! now and reports per asset (incremental from the stored checkpoint; `?full=true` from the
//! start of history); `POST /api/v1/admin/invariant/clear` lifts the halt (MON-003).

use std::collections::HashMap;

use application::audit::{CheckError, Mode};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Method;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

/// The check's routes; merged into the application router.
pub fn routes() -> Routes {
    Routes::new()
        .api(Method::GET, "/api/v1/admin/invariant", run_check)
        .api(Method::POST, "/api/v1/admin/invariant/clear", clear_halt)
}

fn check_error(e: CheckError) -> ApiError {
    let detail = application::error_chain(&e);
    match e {
        CheckError::Spot(_) | CheckError::SpotJournalCompacted(_) => {
            ApiError::Unavailable(format!("invariant check: {detail}"))
        }
        _ => ApiError::Internal(format!("invariant check: {detail}")),
    }
}

/// The check's query: `full=true` checks from the start of history.
#[derive(Debug, Default, Deserialize)]
struct CheckParams {
    #[serde(default)]
    full: bool,
}

/// `GET /api/v1/admin/invariant[?full=true]`: runs the check now and reports per asset.
#[utoipa::path(get, path = "/api/v1/admin/invariant",
    params(InvariantQuery),
    responses((status = 200, description = "the check's report and the halt flag",
        body = InvariantResponse),
        edge::openapi::InvariantRefusals))]
async fn run_check(
    State(state): State<AppState>,
    _admin: AdminUser,
    query: Result<Query<CheckParams>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    // axum's own rejection is plain text; every refusal is in the error shape.
    let Ok(Query(params)) = query else {
        return Err(ApiError::BadRequest("`full` must be true or false".into()));
    };
    let mode = if params.full {
        Mode::Full
    } else {
        Mode::Incremental
    };
    let (report, halted) = state.ledger.audit(mode).await.map_err(check_error)?;
    let mut body =
        serde_json::to_value(&report).map_err(|e| ApiError::Internal(format!("report: {e}")))?;
    body["halted"] = json!(halted);
    Ok(Json(body))
}

/// `POST /api/v1/admin/invariant/clear[?cell=N]`: an admin lifts the halt (after looking into
/// the cause). Under a cell map the front router requires `cell` and sends the request there
/// (ADR 0017 §11), so a cell lifts only its own halt: `cell` must name this one (without a map,
/// cell 1; absent, this one).
#[utoipa::path(post, path = "/api/v1/admin/invariant/clear",
    params(edge::openapi::CheckCell),
    responses((status = 200, description = "the halt is lifted",
        body = HaltResponse),
        edge::openapi::ClearRefusals))]
async fn clear_halt(
    State(state): State<AppState>,
    admin: AdminUser,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state
        .reads
        .check_cell(params.get("cell").map(String::as_str), "halt")?;
    state
        .ledger
        .clear_halt(admin.user_id)
        .await
        .map_err(|e| ApiError::Internal(format!("clear halt: {e}")))?;
    Ok(Json(json!({ "halted": false })))
}

// ---- the schema-only types of the OpenAPI document (`crate::openapi`): utoipa reads their
// fields' attributes, no code reads the fields.

/// `GET /api/v1/admin/invariant`'s query.
#[allow(dead_code)]
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InvariantQuery {
    /// Check from the start of history instead of from the stored checkpoint (false when
    /// absent).
    pub full: Option<bool>,
}

/// One conservation check's report, per asset, with the halt flag after it.
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
pub struct InvariantResponse {
    pub ok: bool,
    #[schema(schema_with = edge::openapi::date_time)]
    pub checked_at: String,
    /// Per asset: deposits, funding, spot, in_flight, in_flight_by_state, difference (decimal
    /// strings) and ok.
    pub assets: Vec<serde_json::Value>,
    /// Transfers whose records disagree, sorted by req_id.
    pub disagreements: Vec<serde_json::Value>,
    pub transfers_checked: u64,
    /// `incremental` or `full`.
    pub mode: String,
    /// Where the run started.
    pub from: serde_json::Value,
    /// Where it ended.
    pub positions: serde_json::Value,
    /// What it read.
    pub read: serde_json::Value,
    /// Whether an incremental run stored its checkpoint.
    pub stored: bool,
    /// Whether new transfers are halted.
    pub halted: bool,
}

/// The halt flag after `POST /api/v1/admin/invariant/clear`: always false.
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
pub struct HaltResponse {
    pub halted: bool,
}
