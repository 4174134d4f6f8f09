//! Asset configuration an admin can change at run time: `PUT /api/v1/admin/assets/{symbol}` and
//! `GET /api/v1/admin/assets`. The settings themselves (stored in PostgreSQL, laid over the
//! file's defaults at start-up and on every reload) are the core's `application::AssetSettings`;
//! this module parses and renders.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::Json;
use domain::{AssetConfig, AssetStatus, AssetSymbol, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::body::JsonObject;
use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Routes {
    Routes::new()
        .api(Method::GET, "/api/v1/admin/assets", list_assets)
        .api(Method::PUT, "/api/v1/admin/assets/{symbol}", put_asset)
}

/// One asset as the admin routes show it; amounts as strings.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Asset)]
pub struct AssetView {
    pub symbol: String,
    pub precision: u32,
    pub min_transfer_amount: String,
    pub max_transfer_amount: String,
    #[schema(value_type = String)]
    pub status: AssetStatus,
    pub internal_transfer_enabled: bool,
}

impl From<&AssetConfig> for AssetView {
    fn from(a: &AssetConfig) -> Self {
        Self {
            symbol: a.symbol.to_string(),
            precision: a.precision,
            min_transfer_amount: a.min_transfer_amount.normalize().to_string(),
            max_transfer_amount: a.max_transfer_amount.normalize().to_string(),
            status: a.status,
            internal_transfer_enabled: a.internal_transfer_enabled,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AssetRequest)]
struct AssetBody {
    /// The path's symbol again, if given (null counts as absent).
    #[serde(default)]
    #[schema(schema_with = symbol_or_null, required = false)]
    symbol: Option<String>,
    #[schema(minimum = 0, maximum = 18)]
    precision: u32,
    #[schema(schema_with = edge::openapi::amount)]
    min_transfer_amount: String,
    #[schema(schema_with = edge::openapi::amount)]
    max_transfer_amount: String,
    #[schema(schema_with = edge::openapi::asset_status)]
    status: String,
    internal_transfer_enabled: bool,
}

/// A body's optional `symbol`: the path's, or null.
fn symbol_or_null() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::from(edge::openapi::asset())
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .description(Some(
            "the path's symbol again (another is refused, 400), or null",
        ))
        .build()
}

const BODY_SHAPE: &str = "body must be {precision: integer, min_transfer_amount: string, \
     max_transfer_amount: string, status: \"ACTIVE\"|\"SUSPENDED\", internal_transfer_enabled: boolean}";

fn parse_body(
    symbol: AssetSymbol,
    body: serde_json::Map<String, Value>,
) -> Result<AssetConfig, ApiError> {
    // The deserializer's own message may quote the input; a fixed sentence says what is expected.
    let body: AssetBody = serde_json::from_value(Value::Object(body))
        .map_err(|_| ApiError::BadRequest(BODY_SHAPE.into()))?;
    if body.symbol.as_deref().is_some_and(|s| s != symbol.as_str()) {
        return Err(ApiError::BadRequest("`symbol` must match the path".into()));
    }
    let status = match body.status.as_str() {
        "ACTIVE" => AssetStatus::Active,
        "SUSPENDED" => AssetStatus::Suspended,
        _ => return Err(ErrorCode::InvalidStatus.into()),
    };
    let min = domain::Amount::parse(&body.min_transfer_amount)?.value();
    let max = domain::Amount::parse(&body.max_transfer_amount)?.value();
    let config = AssetConfig {
        symbol,
        precision: body.precision,
        min_transfer_amount: min,
        max_transfer_amount: max,
        status,
        internal_transfer_enabled: body.internal_transfer_enabled,
    };
    config
        .check_consistent()
        .map_err(|_| ApiError::BadRequest("inconsistent asset settings: precision 0..=18, 0 < min <= max < 10^11, min within precision".into()))?;
    Ok(config)
}

/// `PUT /api/v1/admin/assets/{symbol}`: creates or replaces one asset's settings.
#[utoipa::path(put, path = "/api/v1/admin/assets/{symbol}",
    params(edge::openapi::AssetPath),
    request_body = AssetBody,
    responses((status = 200, description = "ok", body = AssetView),
        edge::openapi::AssetPutRefusals))]
async fn put_asset(
    State(state): State<AppState>,
    admin: AdminUser,
    path: Result<Path<String>, PathRejection>,
    JsonObject(body): JsonObject,
) -> Result<Json<AssetView>, ApiError> {
    let Ok(Path(symbol)) = path else {
        return Err(ApiError::NotFound);
    };
    let symbol = AssetSymbol::parse(&symbol)?;
    let config = parse_body(symbol, body)?;
    state
        .ledger
        .assets()
        .put(&config)
        .await
        .map_err(|e| ApiError::Internal(format!("store asset: {e}")))?;
    tracing::info!(admin = %admin.user_id, asset = %config.symbol, status = ?config.status, enabled = config.internal_transfer_enabled, "asset settings changed");
    Ok(Json(AssetView::from(&config)))
}

/// `GET /api/v1/admin/assets`: every asset this process knows, after the latest reload.
#[utoipa::path(get, path = "/api/v1/admin/assets",
    responses((status = 200, description = "ok", body = Vec<AssetView>),
        edge::openapi::AssetListRefusals))]
async fn list_assets(State(state): State<AppState>, _admin: AdminUser) -> Json<Vec<AssetView>> {
    Json(
        state
            .ledger
            .assets()
            .all()
            .iter()
            .map(AssetView::from)
            .collect(),
    )
}
