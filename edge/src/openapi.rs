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

/// Plain decimal text as `domain::Amount::parse` takes it: no sign, exponent, whitespace or
/// redundant leading zero; greater than zero (`0`, `0.0`, ... are refused INVALID_AMOUNT); below
/// 10^11; at most 18 fractional digits before any trailing zeros (an asset's own precision may
/// allow fewer). Above zero is spelt out: an integer part of 1 or more, or `0.` with a non-zero
/// digit among the first 18 (one alternative per count of leading zeros, so no look-ahead, which
/// not every schema-driven tool reads).
pub const AMOUNT_PATTERN: &str = r"^([1-9][0-9]{0,10}(\.[0-9]{1,18}0*)?|0\.([1-9][0-9]{0,17}|0{1}[1-9][0-9]{0,16}|0{2}[1-9][0-9]{0,15}|0{3}[1-9][0-9]{0,14}|0{4}[1-9][0-9]{0,13}|0{5}[1-9][0-9]{0,12}|0{6}[1-9][0-9]{0,11}|0{7}[1-9][0-9]{0,10}|0{8}[1-9][0-9]{0,9}|0{9}[1-9][0-9]{0,8}|0{10}[1-9][0-9]{0,7}|0{11}[1-9][0-9]{0,6}|0{12}[1-9][0-9]{0,5}|0{13}[1-9][0-9]{0,4}|0{14}[1-9][0-9]{0,3}|0{15}[1-9][0-9]{0,2}|0{16}[1-9][0-9]{0,1}|0{17}[1-9][0-9]{0,0})0*)$";

/// An asset symbol as `domain::AssetSymbol` accepts it.
pub const ASSET_PATTERN: &str = "^[A-Z0-9]{1,16}$";

/// A req_id as `domain::ReqId::parse` accepts it: a canonical ULID, whose first character is at
/// most 7 (26 Crockford base-32 digits hold 130 bits; a ULID has 128).
pub const REQ_ID_PATTERN: &str = "^[0-7][0-9A-HJKMNP-TV-Z]{25}$";

/// What every schema naming an asset says: the set is the server's, changed at run time.
const ASSET_SET: &str = "an asset symbol; the set of assets is configured at run time \
    (`config/assets.json`, changed by `PUT /api/v1/admin/assets/{symbol}`, listed by \
    `GET /api/v1/admin/assets`), so it is not enumerated here: an unknown symbol is refused \
    INVALID_ASSET (422), a suspended one ASSET_SUSPENDED (422)";

// ---- field schemas shared by the types (used with `#[schema(schema_with = ...)]`) -----------

/// An amount in a request: plain decimal text.
pub fn amount() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(AMOUNT_PATTERN))
        .min_length(Some(1))
        .description(Some(
            "plain decimal string, > 0 (\"0\" is refused INVALID_AMOUNT) and < 10^11, at most 18 \
             significant fractional digits; the asset's precision, minimum and maximum (run-time \
             settings) are checked too, refused PRECISION_OVERFLOW, AMOUNT_TOO_SMALL or \
             AMOUNT_TOO_LARGE (422)",
        ))
        .build()
}

/// An asset symbol: its shape here, its existence the server's (see [`ASSET_SET`]).
pub fn asset() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(ASSET_PATTERN))
        .description(Some(ASSET_SET))
        .build()
}

/// The account types transfers support.
pub fn account() -> Object {
    string_enum(&["FUNDING", "SPOT"])
}

/// A transfer's `from`: an account type, not the same as `to`.
pub fn from_account() -> Object {
    ObjectBuilder::from(account())
        .description(Some(
            "the source account type; must differ from `to` (refused SAME_ACCOUNT, 422)",
        ))
        .build()
}

/// A transfer's `to`: an account type, not the same as `from`.
pub fn to_account() -> Object {
    ObjectBuilder::from(account())
        .description(Some(
            "the target account type; must differ from `from` (refused SAME_ACCOUNT, 422)",
        ))
        .build()
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
    string_pattern(REQ_ID_PATTERN)
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
    /// `GET /api/v1/admin/invariant/history` (400 and 404: a `cell` that is malformed or not
    /// this ledger's).
    HistoryRefusals: [400, 401, 403, 404, 429, 503];
    /// `GET /api/v1/admin/transfers/{req_id}`.
    AdminLookupRefusals: [401, 403, 404, 429];
    /// `GET /api/v1/admin/invariant/runs/{id}` (400: a malformed `cell`, or none under a cell
    /// map; 503: its cell down).
    RunRefusals: [400, 401, 403, 404, 429, 503];
    /// `GET /api/v1/admin/users/{user_id}`.
    AdminUserRefusals: [400, 401, 403, 429, 503];
    /// `GET /api/v1/admin/alerts`.
    AlertListRefusals: [400, 401, 403, 503];
    /// `POST /api/v1/admin/transfers/{req_id}/resolve`.
    ResolveRefusals: [400, 401, 403, 404, 409, 413, 415, 503];
    /// `POST /api/v1/admin/repairs/{req_id}`.
    RepairRefusals: [400, 401, 403, 404, 409, 413, 415, 503];
    /// `GET /api/v1/admin/invariant`.
    InvariantRefusals: [400, 401, 403, 503];
    /// `POST /api/v1/admin/invariant/clear` (400 and 404: a `cell` that is malformed or not
    /// this ledger's; under a cell map 400 without one, 503 for a cell down).
    ClearRefusals: [400, 401, 403, 404, 503];
    /// `GET /api/v1/admin/transfers/stuck` and `GET /api/v1/events`.
    AdminListRefusals: [400, 401, 403];
    /// `GET /api/v1/events/stream` (429: every stream slot is taken).
    StreamRefusals: [400, 401, 403, 429];
    /// The tamper-evident log's routes (403: another user's entry; 404: beyond the tree).
    LogRefusals: [400, 401, 403, 404, 429];
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

/// `POST /api/v1/internal_transfer`'s body (checked by `routes::parse_transfer`). `from` and `to`
/// must differ (the same account type twice is refused SAME_ACCOUNT, 422).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferRequest {
    /// The source account type; not the same as `to` (SAME_ACCOUNT).
    #[schema(schema_with = from_account)]
    pub from: String,
    /// The target account type; not the same as `from` (SAME_ACCOUNT).
    #[schema(schema_with = to_account)]
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

/// `?cell=N` of the tamper-evident log's routes: the cell whose log is asked for (under a cell
/// map; without one the log is cell 1). Absent: the caller's own cell's.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogCell {
    /// The cell whose log is asked for; absent: the caller's own cell's (404 for a cell the
    /// ledger does not have).
    #[param(minimum = 1, maximum = 65535)]
    pub cell: Option<u16>,
}

/// `?cell=N` of the conservation check's clear and of one run's report (ADR 0017): the cell
/// they are about. Under a cell map the front router sends the request to cell N (a run's id is
/// its cell's own, and a halt is cleared one cell at a time, so both need it); without a map
/// the one cell is cell 1 and it may be left out.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CheckCell {
    /// The cell; required under a cell map (400 without it), optional without one (404 for a
    /// cell the ledger does not have).
    #[param(minimum = 1, maximum = 65535)]
    pub cell: Option<u16>,
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
