//! Asset configuration (symbol, precision, bounds, status) and the checks an amount must pass for
//! one asset.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::codes::ErrorCode;
use crate::values::{Amount, AssetSymbol};

/// The shipped default asset list (USDT, BTC, ETH at precision 8).
pub const DEFAULT_ASSETS_JSON: &str = include_str!("../../config/assets.json");

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AssetStatus {
    Active,
    Suspended,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssetConfig {
    pub symbol: AssetSymbol,
    pub precision: u32,
    #[serde(with = "rust_decimal::serde::str")]
    pub min_transfer_amount: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub max_transfer_amount: Decimal,
    pub status: AssetStatus,
    pub internal_transfer_enabled: bool,
}

impl AssetConfig {
    /// The configuration's own consistency: precision within what an amount can carry, a
    /// positive minimum, a maximum not below it, and bounds expressible at the asset's precision.
    /// Both the configuration file and an admin's change pass through this.
    pub fn check_consistent(&self) -> Result<(), String> {
        if self.precision > crate::values::AMOUNT_SCALE_MAX {
            return Err(format!("asset {}: precision above 18", self.symbol));
        }
        if self.min_transfer_amount <= Decimal::ZERO
            || self.max_transfer_amount < self.min_transfer_amount
        {
            return Err(format!("asset {}: bad transfer bounds", self.symbol));
        }
        if self.min_transfer_amount.normalize().scale() > self.precision {
            return Err(format!(
                "asset {}: minimum has more decimals than the precision",
                self.symbol
            ));
        }
        if self.max_transfer_amount >= crate::values::amount_ceiling() {
            return Err(format!(
                "asset {}: maximum at or above the amount ceiling",
                self.symbol
            ));
        }
        Ok(())
    }

    /// Asset-level checks, in the order of contract §5.2: status, permission.
    pub fn check_transferable(&self) -> Result<(), ErrorCode> {
        if self.status != AssetStatus::Active {
            return Err(ErrorCode::AssetSuspended);
        }
        if !self.internal_transfer_enabled {
            return Err(ErrorCode::TransferNotAllowed);
        }
        Ok(())
    }

    /// Amount checks against this asset: precision, then minimum, then maximum.
    pub fn check_amount(&self, amount: Amount) -> Result<(), ErrorCode> {
        if amount.scale() > self.precision {
            return Err(ErrorCode::PrecisionOverflow);
        }
        if amount.value() < self.min_transfer_amount {
            return Err(ErrorCode::AmountTooSmall);
        }
        if amount.value() > self.max_transfer_amount {
            return Err(ErrorCode::AmountTooLarge);
        }
        Ok(())
    }

    /// Precision alone: what a deposit from outside must respect (min and max bound transfers).
    pub fn check_precision(&self, amount: Amount) -> Result<(), ErrorCode> {
        if amount.scale() > self.precision {
            return Err(ErrorCode::PrecisionOverflow);
        }
        Ok(())
    }
}

/// The known assets, by symbol.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AssetRegistry {
    assets: BTreeMap<AssetSymbol, AssetConfig>,
}

impl AssetRegistry {
    /// Parses a JSON array of asset configurations; refuses duplicates and nonsense bounds.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let list: Vec<AssetConfig> =
            serde_json::from_str(text).map_err(|e| format!("asset config: {e}"))?;
        let mut assets = BTreeMap::new();
        for asset in list {
            asset.check_consistent()?;
            let symbol = asset.symbol.clone();
            if assets.insert(symbol.clone(), asset).is_some() {
                return Err(format!("asset {symbol} listed twice"));
            }
        }
        Ok(Self { assets })
    }

    /// The shipped default.
    pub fn default_assets() -> Self {
        Self::from_json(DEFAULT_ASSETS_JSON).expect("the shipped asset list is valid")
    }

    /// Looks an asset up by its raw symbol text; unknown or malformed is `INVALID_ASSET`.
    pub fn get(&self, symbol: &str) -> Result<&AssetConfig, ErrorCode> {
        let symbol = AssetSymbol::parse(symbol)?;
        self.assets.get(&symbol).ok_or(ErrorCode::InvalidAsset)
    }

    pub fn all(&self) -> impl Iterator<Item = &AssetConfig> {
        self.assets.values()
    }

    pub fn upsert(&mut self, asset: AssetConfig) {
        self.assets.insert(asset.symbol.clone(), asset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_default_lists_usdt_btc_eth_at_precision_8() {
        let reg = AssetRegistry::default_assets();
        for s in ["USDT", "BTC", "ETH"] {
            assert_eq!(reg.get(s).unwrap().precision, 8);
        }
        assert_eq!(reg.get("DOGE"), Err(ErrorCode::InvalidAsset));
        assert_eq!(reg.get("usdt"), Err(ErrorCode::InvalidAsset));
    }

    #[test]
    fn amount_checks_follow_precision_then_bounds() {
        let reg = AssetRegistry::default_assets();
        let usdt = reg.get("USDT").unwrap();
        assert_eq!(
            usdt.check_amount(Amount::parse("0.000000001").unwrap()),
            Err(ErrorCode::PrecisionOverflow)
        );
        assert_eq!(
            usdt.check_amount(Amount::parse("100000001").unwrap()),
            Err(ErrorCode::AmountTooLarge)
        );
        assert!(usdt.check_amount(Amount::parse("1.5").unwrap()).is_ok());
    }
}
