//! Asset settings: the registry every check reads (the configuration file's defaults), with the
//! changes admins make at run time stored in PostgreSQL (`assets`) and laid over it at start-up
//! and on every reload, so every serving process and a restart see them. The registry is the one
//! the coordinator and the funding ledger validate against.

use std::sync::{Arc, RwLock};

use domain::{AssetConfig, AssetRegistry, AssetStatus, AssetSymbol, ErrorCode};
use rust_decimal::Decimal;
use sqlx::PgPool;

/// The registry shared by every check, and where admin changes are stored. Cheap to clone.
#[derive(Clone)]
pub struct AssetSettings {
    pool: PgPool,
    registry: Arc<RwLock<AssetRegistry>>,
}

type AssetRow = (String, i32, Decimal, Decimal, String, bool);

impl AssetSettings {
    pub fn new(pool: PgPool, registry: Arc<RwLock<AssetRegistry>>) -> Self {
        Self { pool, registry }
    }

    /// The shared registry itself (for the checks that hold it).
    pub fn registry(&self) -> &Arc<RwLock<AssetRegistry>> {
        &self.registry
    }

    /// One asset's configuration, copied out so no lock is held across an await.
    pub fn get(&self, symbol: &str) -> Result<AssetConfig, ErrorCode> {
        // A poisoned lock only means a writer panicked mid-update of a plain map; the map itself
        // is still whole, so reading on is safe.
        let registry = self.registry.read().unwrap_or_else(|e| e.into_inner());
        registry.get(symbol).cloned()
    }

    /// Every asset this process knows, after the latest reload.
    pub fn all(&self) -> Vec<AssetConfig> {
        let registry = self.registry.read().unwrap_or_else(|e| e.into_inner());
        registry.all().cloned().collect()
    }

    /// Stores one asset's settings (creates or replaces them) and applies them here at once.
    pub async fn put(&self, a: &AssetConfig) -> Result<(), sqlx::Error> {
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
        .await?;
        self.registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .upsert(a.clone());
        Ok(())
    }

    /// Makes the stored settings here equal to `home`'s (a cell catching up with the home cell,
    /// ADR 0017 §4): every row of `home`'s `assets` that is missing or differs here is written
    /// here as it is there, then the registry is reloaded. Returns how many rows were written.
    /// Assets are never deleted, so a row only here stays.
    pub async fn copy_from(&self, home: &PgPool) -> Result<usize, sqlx::Error> {
        const ROWS: &str = "SELECT symbol, precision, min_transfer_amount, max_transfer_amount, \
             status, internal_transfer_enabled, updated_at FROM assets ORDER BY symbol";
        type Stored = (
            String,
            i32,
            Decimal,
            Decimal,
            String,
            bool,
            chrono::DateTime<chrono::Utc>,
        );
        let theirs: Vec<Stored> = sqlx::query_as(ROWS).fetch_all(home).await?;
        let ours: Vec<Stored> = sqlx::query_as(ROWS).fetch_all(&self.pool).await?;
        let ours: std::collections::BTreeMap<&str, &Stored> =
            ours.iter().map(|row| (row.0.as_str(), row)).collect();
        let mut written = 0;
        for row in &theirs {
            let same = ours.get(row.0.as_str()).is_some_and(|mine| {
                (mine.1, mine.2, mine.3, &mine.4, mine.5) == (row.1, row.2, row.3, &row.4, row.5)
            });
            if same {
                continue;
            }
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
            .bind(&row.0)
            .bind(row.1)
            .bind(row.2)
            .bind(row.3)
            .bind(&row.4)
            .bind(row.5)
            .bind(row.6)
            .execute(&self.pool)
            .await?;
            written += 1;
        }
        self.reload().await?;
        Ok(written)
    }

    /// Lays the stored settings over the registry; returns how many were applied. A row that no
    /// longer passes the checks is skipped with a warning rather than stopping the service.
    pub async fn reload(&self) -> Result<usize, sqlx::Error> {
        let rows: Vec<AssetRow> = sqlx::query_as(
            "SELECT symbol, precision, min_transfer_amount, max_transfer_amount, status,
                    internal_transfer_enabled FROM assets ORDER BY symbol",
        )
        .fetch_all(&self.pool)
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
        let mut registry = self.registry.write().unwrap_or_else(|e| e.into_inner());
        for config in configs {
            if registry.get(config.symbol.as_str()) != Ok(&config) {
                registry.upsert(config);
            }
        }
        Ok(applied)
    }
}
