//! Asset settings: the registry every check reads (the configuration file's defaults), with the
//! changes admins make at run time stored (`stores::AssetStore`; PostgreSQL's `assets`) and laid over it at start-up
//! and on every reload, so every serving process and a restart see them. The registry is the one
//! the coordinator and the funding ledger validate against.

use std::sync::{Arc, RwLock};

use domain::{AssetConfig, AssetRegistry, AssetStatus, AssetSymbol, ErrorCode};

use crate::error::StoreError;
use crate::stores::{AssetStore, StoredAsset};

/// The registry shared by every check, and where admin changes are stored. Cheap to clone.
#[derive(Clone)]
pub struct AssetSettings {
    store: Arc<dyn AssetStore>,
    registry: Arc<RwLock<AssetRegistry>>,
}

impl AssetSettings {
    pub fn new(store: Arc<dyn AssetStore>, registry: Arc<RwLock<AssetRegistry>>) -> Self {
        Self { store, registry }
    }

    /// Where the settings are stored.
    pub fn store(&self) -> &Arc<dyn AssetStore> {
        &self.store
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
    pub async fn put(&self, a: &AssetConfig) -> Result<(), StoreError> {
        self.store.put(a).await?;
        self.registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .upsert(a.clone());
        Ok(())
    }

    /// Makes the stored settings here equal to `home`'s (a cell catching up with the home cell,
    /// ADR 0017 §4): every row of `home`'s that is missing or differs here is written here as it
    /// is there, then the registry is reloaded. Returns how many rows were written. Assets are
    /// never deleted, so a row only here stays.
    pub async fn copy_from(&self, home: &dyn AssetStore) -> Result<usize, StoreError> {
        let theirs = home.rows().await?;
        let ours = self.store.rows().await?;
        let ours: std::collections::BTreeMap<&str, &StoredAsset> =
            ours.iter().map(|row| (row.symbol.as_str(), row)).collect();
        let mut written = 0;
        for row in &theirs {
            let same = ours.get(row.symbol.as_str()).is_some_and(|mine| {
                StoredAsset {
                    updated_at: row.updated_at,
                    ..(*mine).clone()
                } == *row
            });
            if same {
                continue;
            }
            self.store.write(row).await?;
            written += 1;
        }
        self.reload().await?;
        Ok(written)
    }

    /// Lays the stored settings over the registry; returns how many were applied. A row that no
    /// longer passes the checks is skipped with a warning rather than stopping the service.
    pub async fn reload(&self) -> Result<usize, StoreError> {
        let rows = self.store.rows().await?;
        let mut configs = Vec::with_capacity(rows.len());
        for StoredAsset {
            symbol,
            precision,
            min_transfer_amount: min,
            max_transfer_amount: max,
            status,
            internal_transfer_enabled: enabled,
            ..
        } in rows
        {
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
