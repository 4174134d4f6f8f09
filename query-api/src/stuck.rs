//! The operators' stuck listing: `GET /api/v1/admin/transfers/stuck?older_than_ms=N&limit=M`,
//! open transfers unchanged for a while with their retry records, oldest first (the resolution
//! an operator then records is a command, `command_api::admin_recovery`).
//!
//! The listing shows a retry's `last_error_category` (TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET,
//! MISMATCH, UNKNOWN), never the raw error text, which may hold SQL or socket detail.

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Method;
use axum::Json;
use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::render::{money, rfc3339};
use edge::routes::Routes;
use edge::state::AppState;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

/// Most rows one listing returns.
pub const STUCK_PAGE_SIZE_MAX: i64 = 500;
/// Default age a transfer must have to count as stuck.
const STUCK_OLDER_THAN_MS_DEFAULT: u64 = 60_000;
/// Oldest age a listing may ask for, about 100 years: PostgreSQL's timestamps and intervals
/// cannot go back much further, so a larger value is refused (400) rather than failing inside.
pub const STUCK_OLDER_THAN_MS_MAX: u64 = 3_155_760_000_000;

/// The listing's route, merged into the query routes.
pub fn routes() -> Routes {
    Routes::new().api(Method::GET, "/api/v1/admin/transfers/stuck", list_stuck)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StuckQuery {
    older_than_ms: Option<u64>,
    limit: Option<i64>,
}

/// `GET /api/v1/admin/transfers/stuck`: open transfers unchanged that long, oldest first.
#[utoipa::path(get, path = "/api/v1/admin/transfers/stuck",
    params(StuckParams),
    responses((status = 200, description = "ok", body = StuckPage),
        edge::openapi::AdminListRefusals))]
async fn list_stuck(
    State(state): State<AppState>,
    _admin: AdminUser,
    query: Result<Query<StuckQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Ok(Query(q)) = query else {
        return Err(ApiError::BadRequest("malformed query string".into()));
    };
    if q.older_than_ms
        .is_some_and(|ms| ms > STUCK_OLDER_THAN_MS_MAX)
    {
        return Err(ApiError::BadRequest(format!(
            "`older_than_ms` must be at most {STUCK_OLDER_THAN_MS_MAX}"
        )));
    }
    let older_than = Duration::from_millis(q.older_than_ms.unwrap_or(STUCK_OLDER_THAN_MS_DEFAULT));
    let limit = q.limit.unwrap_or(100).clamp(1, STUCK_PAGE_SIZE_MAX);
    let rows = state
        .reads
        .stuck(older_than, limit)
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
                "amount": r.amount.map(money),
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

// ---- the schema-only types of the OpenAPI document (`crate::openapi`): utoipa reads their
// fields' attributes, no code reads the fields.

/// `GET /api/v1/admin/transfers/stuck`' query; any other parameter is refused (400).
#[allow(dead_code)]
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StuckParams {
    /// Only transfers unchanged at least this long (60,000 when absent); at most
    /// [`STUCK_OLDER_THAN_MS_MAX`] (about 100 years).
    #[param(minimum = 0, maximum = 3_155_760_000_000_i64)]
    pub older_than_ms: Option<i64>,
    /// Rows to return; brought within 1 to 500 (100 when absent).
    pub limit: Option<i64>,
}

/// Open transfers unchanged that long, oldest first.
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
pub struct StuckPage {
    pub transfers: Vec<StuckTransfer>,
}

/// One stuck transfer with its retry record (the fields the worker has not set are null).
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
pub struct StuckTransfer {
    pub req_id: String,
    pub user_id: Option<i64>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub asset: Option<String>,
    pub amount: Option<String>,
    pub state: String,
    /// RETRYING, or REFUND_REFUSED (a refund the source refused: an operator's case).
    pub status: String,
    pub updated_at: String,
    pub age_ms: Option<i64>,
    pub attempts: i64,
    pub refund_failures: i64,
    pub last_error_category: Option<String>,
    pub last_attempt_at: Option<String>,
    pub next_retry_at: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<String>,
}
