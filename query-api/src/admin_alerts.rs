//! `GET /api/v1/admin/alerts?limit=N`: the newest alerts stored for operators (MON-004, a user's
//! abnormal request frequency; `application::alerts`), newest first. Admin only.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Method;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::render::rfc3339;
use edge::routes::Routes;
use edge::state::AppState;

/// Most alerts one listing returns.
pub const ALERTS_PAGE_MAX: i64 = 500;
/// Alerts returned when `limit` is not given.
pub const ALERTS_PAGE_DEFAULT: i64 = 50;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Routes {
    Routes::new().api(Method::GET, "/api/v1/admin/alerts", list_alerts)
}

/// `?limit=`: 1 to 500 (default 50); anything else is refused (400).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AlertsQuery {
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
}

/// One alert.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Alert)]
pub struct AlertView {
    pub id: i64,
    /// `MON-004`.
    pub code: String,
    /// `WARNING` or `CRITICAL`.
    pub severity: String,
    pub user_id: Option<i64>,
    /// RFC 3339, UTC.
    pub at: String,
    pub detail: String,
}

/// The listing.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Alerts)]
pub struct AlertsView {
    pub alerts: Vec<AlertView>,
}

/// `GET /api/v1/admin/alerts`: the newest alerts, newest first.
#[utoipa::path(get, path = "/api/v1/admin/alerts",
    params(AlertsQuery),
    responses((status = 200, description = "ok", body = AlertsView),
        edge::openapi::AlertListRefusals))]
pub(crate) async fn list_alerts(
    State(state): State<AppState>,
    _admin: AdminUser,
    query: Result<Query<AlertsQuery>, QueryRejection>,
) -> Result<Json<AlertsView>, ApiError> {
    let Ok(Query(q)) = query else {
        return Err(ApiError::BadRequest(
            "malformed query string: only `limit` (a positive integer)".into(),
        ));
    };
    let limit = q.limit.unwrap_or(ALERTS_PAGE_DEFAULT);
    if !(1..=ALERTS_PAGE_MAX).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "`limit` must be 1 to {ALERTS_PAGE_MAX}"
        )));
    }
    let rows = state
        .queries
        .alerts_recent(limit)
        .await
        .map_err(|e| ApiError::Unavailable(format!("list alerts: {e}")))?;
    let alerts = rows
        .into_iter()
        .map(|a| AlertView {
            id: a.id,
            code: a.code,
            severity: a.severity,
            user_id: a.user_id,
            at: rfc3339(a.at),
            detail: a.detail,
        })
        .collect();
    Ok(Json(AlertsView { alerts }))
}
