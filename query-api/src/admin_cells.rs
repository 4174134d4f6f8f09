//! `GET /api/v1/admin/cells` (admin only, read-only): this cell's members under HA and their
//! roles now, the replication lag, and the last failover with its time (ADR 0020 §5,
//! `edge::cluster`). Under a cell map the front asks every cell and joins their answers; without
//! HA the one cell answers with its single database and spot-core and `"ha": false`.

use axum::extract::State;
use axum::http::Method;
use axum::Json;
use edge::auth::AdminUser;
use edge::cluster::CellsView;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

/// The routes of this module.
pub fn routes() -> Routes {
    Routes::new().api(Method::GET, "/api/v1/admin/cells", cells)
}

/// `GET /api/v1/admin/cells`: each cell's members, roles, lag and last failover.
#[utoipa::path(get, path = "/api/v1/admin/cells",
    responses((status = 200, description = "ok", body = CellsView),
        edge::openapi::AdminReadRefusals))]
pub async fn cells(
    State(state): State<AppState>,
    _admin: AdminUser,
) -> Result<Json<CellsView>, ApiError> {
    let _turn = state
        .admission
        .read()
        .await
        .map_err(|_| ApiError::Refused(domain::ErrorCode::RateLimitExceeded))?;
    let cell = state.reads.cell().unwrap_or(1);
    let view = state.cluster.describe(cell).await;
    Ok(Json(CellsView {
        cells: vec![view],
        partial: None,
        down_cells: None,
    }))
}
