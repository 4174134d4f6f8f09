//! The OpenAPI description's one floor, below every handler: the field schemas the handlers'
//! types name (`#[schema(schema_with = ...)]`), the documented shapes of the bodies the handlers
//! parse field by field, their path parameters, the refusals each route can answer with, and the
//! assembly of the document ([`document`]) from the parts each side derives from its own
//! handlers (`command_api::openapi`, `query_api::openapi`); the binary serves it at
//! `GET /api/v1/openapi.json`. The amount pattern and bounds are the parser's own
//! (`domain::Amount`), so a schema-driven fuzzer (scripts/schemathesis) can tell valid input from
//! invalid and check that every invalid request is refused with a 4xx.
// The schema-only types exist for their `ToSchema`/`IntoParams` derives: utoipa reads their
// fields' attributes, no code reads the fields.
#![allow(dead_code)]

use serde::Deserialize;
use std::collections::BTreeMap;

use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, Response, ResponseBuilder};
use utoipa::{IntoParams, IntoResponses, Modify, OpenApi, ToSchema};

/// Plain decimal text: no sign, exponent, whitespace or redundant leading zero; below 10^11 and
/// at most 18 fractional digits (an asset's own precision may allow fewer).
pub const AMOUNT_PATTERN: &str = r"^(0|[1-9][0-9]{0,10})(\.[0-9]{1,18})?$";

/// An asset symbol as `domain::AssetSymbol` accepts it.
pub const ASSET_PATTERN: &str = "^[A-Z0-9]{1,16}$";

// ---- field schemas shared by the types (used with `#[schema(schema_with = ...)]`) -----------

/// An amount in a request: plain decimal text.
pub fn amount() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(AMOUNT_PATTERN))
        .min_length(Some(1))
        .max_length(Some(31))
        .description(Some(
            "plain decimal string, > 0 and < 10^11; within the asset's precision and bounds",
        ))
        .build()
}

pub fn asset() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(ASSET_PATTERN))
        .build()
}

/// The account types transfers support.
pub fn account() -> Object {
    string_enum(&["FUNDING", "SPOT"])
}

/// A user id: a positive integer that fits PostgreSQL's BIGINT.
pub fn user_id() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(1))
        .maximum(Some(i64::MAX))
        .build()
}

pub fn account_status() -> Object {
    string_enum(&["ACTIVE", "FROZEN", "DISABLED"])
}

pub fn asset_status() -> Object {
    string_enum(&["ACTIVE", "SUSPENDED"])
}

pub fn cid() -> Object {
    string_pattern("^[A-Za-z0-9_-]{1,64}$")
}

pub fn external_id() -> Object {
    string_pattern("^[A-Za-z0-9_.:-]{1,128}$")
}

pub fn req_id() -> Object {
    string_pattern("^[0-9A-HJKMNP-TV-Z]{26}$")
}

pub fn date_time() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::DateTime,
        )))
        .build()
}

fn string_pattern(pattern: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .build()
}

fn string_enum(values: &[&str]) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
        .build()
}

// ---- the refusals each route can answer with, all in the `Error` shape ----------------------

pub fn refused(statuses: &[u16]) -> BTreeMap<String, RefOr<Response>> {
    let content = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("Error")))
        .build();
    let response = ResponseBuilder::new()
        .description("refused")
        .content("application/json", content)
        .build();
    statuses
        .iter()
        .map(|status| (status.to_string(), RefOr::T(response.clone())))
        .collect()
}

macro_rules! refusals {
    ($($(#[$doc:meta])* $name:ident: [$($status:literal),*];)*) => {$(
        $(#[$doc])*
        pub struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                refused(&[$($status),*])
            }
        }
    )*};
}

refusals! {
    /// `POST /api/v1/internal_transfer`.
    TransferRefusals: [400, 401, 403, 404, 409, 413, 415, 422, 429, 503];
    /// `GET /api/v1/internal_transfer/{req_id}`.
    LookupRefusals: [401, 404, 503];
    /// `GET /api/v1/balances`.
    BalancesRefusals: [401, 503];
    /// `POST /api/v1/admin/deposits`.
    DepositRefusals: [400, 401, 403, 409, 413, 415, 422, 503];
    /// `PUT /api/v1/admin/accounts/{user_id}/{account_type}/status`.
    StatusRefusals: [400, 401, 403, 404, 413, 415, 422, 503];
    /// `GET /api/v1/admin/assets`.
    AssetListRefusals: [401, 403];
    /// `PUT /api/v1/admin/assets/{symbol}`.
    AssetPutRefusals: [400, 401, 403, 404, 413, 415, 422];
    /// The admin views' listings and overview.
    AdminReadRefusals: [400, 401, 403, 429, 503];
    /// `GET /api/v1/admin/transfers/{req_id}`.
    AdminLookupRefusals: [401, 403, 404, 429];
    /// `GET /api/v1/admin/users/{user_id}`.
    AdminUserRefusals: [400, 401, 403, 429, 503];
    /// `GET /api/v1/admin/alerts`.
    AlertListRefusals: [400, 401, 403, 503];
}

// ---- schema-only types: what the handlers accept and refuse with ------------------------------

/// Every refusal: `{code, message}`, plus `req_id` and `state` for a transfer that failed.
#[derive(Debug, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    #[schema(pattern = "^[A-Z_]+$")]
    pub code: String,
    pub message: String,
    #[schema(required = false, nullable = false)]
    pub req_id: Option<String>,
    #[schema(required = false, nullable = false)]
    pub state: Option<String>,
}

/// `POST /api/v1/internal_transfer`'s body (checked by `routes::parse_transfer`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferRequest {
    #[schema(schema_with = account)]
    pub from: String,
    #[schema(schema_with = account)]
    pub to: String,
    #[schema(schema_with = asset)]
    pub asset: String,
    #[schema(schema_with = amount)]
    pub amount: String,
    /// The client's idempotency key.
    #[schema(schema_with = cid, required = false)]
    pub cid: Option<String>,
    /// If given, the caller's own id.
    #[schema(schema_with = user_id, required = false)]
    pub user_id: Option<u64>,
}

/// `POST /api/v1/admin/deposits`' body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DepositRequest {
    #[schema(schema_with = user_id)]
    pub user_id: u64,
    #[schema(schema_with = asset)]
    pub asset: String,
    #[schema(schema_with = amount)]
    pub amount: String,
    /// Applied once per id.
    #[schema(schema_with = external_id)]
    pub external_id: String,
}

/// `PUT /api/v1/admin/accounts/{user_id}/{account_type}/status`' body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusRequest {
    #[schema(schema_with = account_status)]
    pub status: String,
    /// The asset, here or as `?asset=` (both given, they must agree).
    #[schema(schema_with = asset, required = false)]
    pub asset: Option<String>,
}

/// The path of `GET /api/v1/internal_transfer/{req_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TransferPath {
    #[param(schema_with = req_id)]
    pub req_id: String,
}

/// The path of `PUT /api/v1/admin/accounts/{user_id}/{account_type}/status`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AccountPath {
    #[param(schema_with = user_id)]
    pub user_id: u64,
    #[param(schema_with = account)]
    pub account_type: String,
}

/// The path of `PUT /api/v1/admin/assets/{symbol}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AssetPath {
    #[param(schema_with = asset)]
    pub symbol: String,
}

// ---- the document -----------------------------------------------------------------------------

/// The document: this crate's part (the info, `/healthz`, the `Error` shape, the bearer scheme)
/// with each side's `parts` merged in. Every route needs a bearer token except `/healthz` and
/// this document.
pub fn document(parts: impl IntoIterator<Item = utoipa::openapi::OpenApi>) -> serde_json::Value {
    let mut doc = ApiDoc::openapi();
    for part in parts {
        doc.merge(part);
    }
    Finish.modify(&mut doc);
    serde_json::to_value(doc).expect("the OpenAPI document serializes")
}

#[derive(OpenApi)]
#[openapi(
    info(title = "ledger internal transfers", version = "1"),
    paths(crate::health::healthz),
    components(schemas(ErrorBody)),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// What the derive does not say: the bearer JWT scheme (required by every route unless the
/// route says otherwise); path parameters required (utoipa drops `required` for a parameter
/// with a `schema_with`); no tags (utoipa names them after the handlers' modules) and no
/// license or description (utoipa fills them from the package, where they are empty).
struct Finish;

impl Modify for Finish {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi.info.license = None;
        openapi.info.description = None;
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.put, &mut item.post]
                .into_iter()
                .flatten()
            {
                operation.tags = None;
                for param in operation.parameters.iter_mut().flatten() {
                    if param.parameter_in == ParameterIn::Path {
                        param.required = Required::True;
                    }
                }
            }
        }
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(scheme));
        // `/healthz` needs no token: an empty list, not utoipa's `[{}]` ("token optional").
        if let Some(get) = openapi
            .paths
            .paths
            .get_mut("/healthz")
            .and_then(|item| item.get.as_mut())
        {
            get.security = Some(Vec::new());
        }
    }
}
