//! The query routes' part of the OpenAPI document, derived by `utoipa` from their handlers'
//! `#[utoipa::path]` attributes; `edge::openapi::document` joins it with the command side's. The
//! schema-only types each handler's attribute names live beside the handler, so that no handler
//! module depends on this one.

use utoipa::OpenApi;

/// This side's paths, and the schemas they name.
pub fn part() -> utoipa::openapi::OpenApi {
    Queries::openapi()
}

#[derive(OpenApi)]
#[openapi(paths(
    crate::rest::get_transfer,
    crate::rest::balances,
    crate::admin_views::list_transfers,
    crate::admin_views::transfer_timeline,
    crate::admin_views::user_view,
    crate::admin_views::overview,
    crate::admin_views::invariant_history,
    crate::admin_views::invariant_run_report,
    crate::admin_cells::cells,
    crate::admin_alerts::list_alerts,
    crate::stuck::list_stuck,
    crate::feed::events,
    crate::feed::stream_events,
    crate::log_routes::checkpoint,
    crate::log_routes::key,
    crate::log_routes::entry,
    crate::log_routes::inclusion,
    crate::log_routes::consistency,
    crate::log_routes::receipt,
))]
struct Queries;
