//! The command routes' part of the OpenAPI document, derived by `utoipa` from their handlers'
//! `#[utoipa::path]` attributes; `edge::openapi::document` joins it with the query side's. The
//! schema-only types each handler's attribute names live beside the handler, so that no handler
//! module depends on this one.

use utoipa::OpenApi;

/// This side's paths, and the schemas they name.
pub fn part() -> utoipa::openapi::OpenApi {
    Commands::openapi()
}

#[derive(OpenApi)]
#[openapi(
    paths(
        crate::routes::create_transfer,
        crate::bulk::create_transfers,
        crate::routes::admin_deposit,
        crate::routes::admin_set_status,
        crate::admin_assets::list_assets,
        crate::admin_assets::put_asset,
        crate::admin_recovery::resolve,
        crate::admin_repairs::repair,
        crate::invariant::run_check,
        crate::invariant::clear_halt,
    ),
    components(schemas(crate::bulk::BulkItem))
)]
struct Commands;
