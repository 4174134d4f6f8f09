//! Asset configuration an admin can change at run time: `PUT /api/v1/admin/assets/{symbol}` and
//! `GET /api/v1/admin/assets`. Changes are stored in PostgreSQL (`assets`) and laid over the
//! configuration file's defaults at start-up and every `ASSET_RELOAD_INTERVAL`, so every
//! `ledger serve` instance and a restart see them. The registry is the one the coordinator
//! validates against, so a direct coordinator call is refused the same way.

use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::{get, put};
use axum::{Json, Router};
use domain::{AssetConfig, AssetStatus, AssetSymbol, ErrorCode};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use utoipa::ToSchema;

use crate::app::AppState;
use crate::auth::AdminUser;
use crate::error::ApiError;
use crate::routes::JsonObject;

/// How often a process re-reads the stored asset settings: the longest another instance keeps
/// accepting transfers of an asset an admin has just suspended.
pub const ASSET_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/assets", get(list_assets))
        .route("/api/v1/admin/assets/{symbol}", put(put_asset))
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
    #[serde(default)]
    #[schema(schema_with = crate::openapi::asset)]
    symbol: Option<String>,
    #[schema(minimum = 0, maximum = 18)]
    precision: u32,
    #[schema(schema_with = crate::openapi::amount)]
    min_transfer_amount: String,
    #[schema(schema_with = crate::openapi::amount)]
    max_transfer_amount: String,
    #[schema(schema_with = crate::openapi::asset_status)]
    status: String,
    internal_transfer_enabled: bool,
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
    params(crate::openapi::AssetPath),
    request_body = AssetBody,
    responses((status = 200, description = "ok", body = AssetView),
        crate::openapi::AssetPutRefusals))]
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
    store(state.funding.pool(), &config)
        .await
        .map_err(|e| ApiError::Internal(format!("store asset: {e}")))?;
    state
        .assets
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .upsert(config.clone());
    tracing::info!(admin = %admin.user_id, asset = %config.symbol, status = ?config.status, enabled = config.internal_transfer_enabled, "asset settings changed");
    Ok(Json(AssetView::from(&config)))
}

/// `GET /api/v1/admin/assets`: every asset this process knows, after the latest reload.
#[utoipa::path(get, path = "/api/v1/admin/assets",
    responses((status = 200, description = "ok", body = Vec<AssetView>),
        crate::openapi::AssetListRefusals))]
async fn list_assets(State(state): State<AppState>, _admin: AdminUser) -> Json<Vec<AssetView>> {
    let registry = state.assets.read().unwrap_or_else(|e| e.into_inner());
    Json(registry.all().map(AssetView::from).collect())
}

async fn store(pool: &PgPool, a: &AssetConfig) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO assets (symbol, precision, min_transfer_amount, max_transfer_amount, status,
                             internal_transfer_enabled, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, now())
         ON CONFLICT (symbol) DO UPDATE SET precision = EXCLUDED.precision,
             min_transfer_amount = EXCLUDED.min_transfer_amount,
             max_transfer_amount = EXCLUDED.max_transfer_amount, status = EXCLUDED.status,
             internal_transfer_enabled = EXCLUDED.internal_transfer_enabled, updated_at = now()",
    )
    .bind(a.symbol.as_str())
    .bind(i32::try_from(a.precision).unwrap_or(i32::MAX))
    .bind(a.min_transfer_amount)
    .bind(a.max_transfer_amount)
    .bind(match a.status {
        AssetStatus::Active => "ACTIVE",
        AssetStatus::Suspended => "SUSPENDED",
    })
    .bind(a.internal_transfer_enabled)
    .execute(pool)
    .await?;
    Ok(())
}

type AssetRow = (String, i32, Decimal, Decimal, String, bool);

/// Lays the stored settings over `state`'s registry; returns how many were applied. A row that
/// no longer passes the checks is skipped with a warning rather than stopping the service.
pub async fn load_persisted(state: &AppState) -> Result<usize, sqlx::Error> {
    let rows: Vec<AssetRow> = sqlx::query_as(
        "SELECT symbol, precision, min_transfer_amount, max_transfer_amount, status,
                internal_transfer_enabled FROM assets ORDER BY symbol",
    )
    .fetch_all(state.funding.pool())
    .await?;
    let mut configs = Vec::with_capacity(rows.len());
    for (symbol, precision, min, max, status, enabled) in rows {
        let config = AssetSymbol::parse(&symbol).ok().map(|symbol| AssetConfig {
            symbol,
            precision: u32::try_from(precision).unwrap_or(u32::MAX),
            min_transfer_amount: min.normalize(),
            max_transfer_amount: max.normalize(),
            status: if status == "ACTIVE" {
                AssetStatus::Active
            } else {
                AssetStatus::Suspended
            },
            internal_transfer_enabled: enabled,
        });
        match config.filter(|c| c.check_consistent().is_ok()) {
            Some(c) => configs.push(c),
            None => tracing::warn!(%symbol, "stored asset settings are invalid; ignored"),
        }
    }
    let applied = configs.len();
    let mut registry = state.assets.write().unwrap_or_else(|e| e.into_inner());
    for config in configs {
        if registry.get(config.symbol.as_str()) != Ok(&config) {
            registry.upsert(config);
        }
    }
    Ok(applied)
}

/// Re-reads the stored settings every `ASSET_RELOAD_INTERVAL` until aborted. A failed read keeps
/// the last known settings and is retried at the next tick.
pub fn spawn_reloader(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(ASSET_RELOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = load_persisted(&state).await {
                tracing::warn!(error = %e, "asset settings reload failed; keeping the last ones");
            }
        }
    })
}
