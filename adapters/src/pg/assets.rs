//! The stored asset settings (`assets`): `application::stores::AssetStore`.

use application::stores::{AssetStore, StoredAsset};
use application::StoreError;
use async_trait::async_trait;
use domain::{AssetConfig, AssetStatus};
use rust_decimal::Decimal;
use sqlx::PgPool;

use super::driver::store;

/// The asset settings in PostgreSQL.
#[derive(Clone)]
pub struct PgAssets {
    pool: PgPool,
}

impl PgAssets {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

type Row = (
    String,
    i32,
    Decimal,
    Decimal,
    String,
    bool,
    chrono::DateTime<chrono::Utc>,
);

#[async_trait]
impl AssetStore for PgAssets {
    async fn put(&self, a: &AssetConfig) -> Result<(), StoreError> {
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
        .execute(&self.pool)
        .await
        .map_err(store)?;
        Ok(())
    }

    async fn rows(&self) -> Result<Vec<StoredAsset>, StoreError> {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT symbol, precision, min_transfer_amount, max_transfer_amount, status,
                    internal_transfer_enabled, updated_at FROM assets ORDER BY symbol",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(store)?;
        Ok(rows
            .into_iter()
            .map(
                |(symbol, precision, min, max, status, enabled, updated_at)| StoredAsset {
                    symbol,
                    precision,
                    min_transfer_amount: min,
                    max_transfer_amount: max,
                    status,
                    internal_transfer_enabled: enabled,
                    updated_at,
                },
            )
            .collect())
    }

    async fn write(&self, row: &StoredAsset) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO assets (symbol, precision, min_transfer_amount, max_transfer_amount,
                                 status, internal_transfer_enabled, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (symbol) DO UPDATE SET precision = EXCLUDED.precision,
                 min_transfer_amount = EXCLUDED.min_transfer_amount,
                 max_transfer_amount = EXCLUDED.max_transfer_amount,
                 status = EXCLUDED.status,
                 internal_transfer_enabled = EXCLUDED.internal_transfer_enabled,
                 updated_at = EXCLUDED.updated_at",
        )
        .bind(&row.symbol)
        .bind(row.precision)
        .bind(row.min_transfer_amount)
        .bind(row.max_transfer_amount)
        .bind(&row.status)
        .bind(row.internal_transfer_enabled)
        .bind(row.updated_at)
        .execute(&self.pool)
        .await
        .map_err(store)?;
        Ok(())
    }
}
