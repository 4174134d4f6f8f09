//! The command routes' part of the OpenAPI document, derived by `utoipa` from their handlers'
//! `#[utoipa::path]` attributes; `edge::openapi::document` joins it with the query side's. The
//! schema-only types below describe the bodies of the operators' routes, whose handlers take
//! their JSON apart field by field (`admin_recovery`, `admin_repairs`, `invariant`).
// The schema-only types exist for their `ToSchema`/`IntoParams` derives: utoipa reads their
// fields' attributes, no code reads the fields.
#![allow(dead_code)]

use serde::Deserialize;
use utoipa::{IntoParams, OpenApi, ToSchema};

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

/// An operator's reason: 1 to 1,000 characters, not only whitespace.
fn reason() -> utoipa::openapi::schema::Object {
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
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ResolveRequest)]
pub struct ResolveBody {
    /// What the operator confirmed: the pending call was applied, or it was not.
    #[schema(inline)]
    pub resolution: ResolutionName,
    #[schema(schema_with = reason)]
    pub reason: String,
    /// Record the resolution even where the account system cannot confirm it (marked in the
    /// event's reason). False when absent.
    #[schema(required = false, nullable = false)]
    pub force: Option<bool>,
}

/// A manual resolution's outcome.
#[derive(Debug, Deserialize, ToSchema)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum ResolutionName {
    APPLIED,
    NOT_APPLIED,
}

/// The resolved transfer.
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

/// `POST /api/v1/admin/repairs/{req_id}`' body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RepairRequest)]
pub struct RepairBody {
    #[schema(schema_with = reason)]
    pub reason: String,
}

/// A repair as recorded (`repeated` when an earlier request had already recorded it).
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

/// `GET /api/v1/admin/invariant`'s query.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InvariantQuery {
    /// Check from the start of history instead of from the stored checkpoint (false when
    /// absent).
    pub full: Option<bool>,
}

/// One conservation check's report, per asset, with the halt flag after it.
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
#[derive(Debug, ToSchema)]
pub struct HaltResponse {
    pub halted: bool,
}
