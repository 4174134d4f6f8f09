//! Asset configuration: which symbols spot-core accepts and with how many fractional digits.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;

/// The shipped default, identical to `config/assets.json` of the workspace.
pub const DEFAULT_ASSETS_JSON: &str = include_str!("../../config/assets.json");

/// Largest precision spot-core accepts. Balances are capped at 10^20, and 20 integer digits
/// plus 8 fractional digits is what fits in `Decimal`'s 28-digit mantissa, so every sum the
/// engine computes stays exact.
pub const MAX_PRECISION: u32 = 8;

/// One entry of the config file; the other fields (limits, status, ...) belong to the ledger.
#[derive(Debug, Clone, Deserialize)]
struct AssetEntry {
    symbol: String,
    precision: u32,
}

/// Symbol → precision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assets {
    precision: BTreeMap<String, u32>,
}

impl Assets {
    pub fn parse(json: &str) -> anyhow::Result<Assets> {
        let entries: Vec<AssetEntry> =
            serde_json::from_str(json).context("asset config is not a JSON array of assets")?;
        let mut precision = BTreeMap::new();
        for e in entries {
            if e.symbol.is_empty()
                || e.symbol.len() > 32
                || !e.symbol.bytes().all(|b| b.is_ascii_alphanumeric())
            {
                bail!(
                    "asset symbol {:?} must be 1..32 ASCII letters or digits",
                    e.symbol
                );
            }
            if e.precision > MAX_PRECISION {
                bail!(
                    "asset {} has precision {} above the supported {}",
                    e.symbol,
                    e.precision,
                    MAX_PRECISION
                );
            }
            if precision.insert(e.symbol.clone(), e.precision).is_some() {
                bail!("asset {} is listed twice", e.symbol);
            }
        }
        if precision.is_empty() {
            bail!("asset config lists no assets");
        }
        Ok(Assets { precision })
    }

    pub fn load(path: &Path) -> anyhow::Result<Assets> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading asset config {}", path.display()))?;
        Assets::parse(&text).with_context(|| format!("in asset config {}", path.display()))
    }

    /// The built-in default (USDT, BTC, ETH, precision 8).
    pub fn builtin() -> Assets {
        Assets::parse(DEFAULT_ASSETS_JSON).expect("the embedded asset config is valid")
    }

    pub fn precision(&self, symbol: &str) -> Option<u32> {
        self.precision.get(symbol).copied()
    }

    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.precision.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_lists_the_default_assets() {
        let a = Assets::builtin();
        for s in ["USDT", "BTC", "ETH"] {
            assert_eq!(a.precision(s), Some(8));
        }
        assert_eq!(a.precision("DOGE"), None);
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(Assets::parse("[]").is_err());
        assert!(Assets::parse(r#"[{"symbol":"X","precision":9}]"#).is_err());
        assert!(
            Assets::parse(r#"[{"symbol":"X","precision":2},{"symbol":"X","precision":2}]"#)
                .is_err()
        );
        assert!(Assets::parse(r#"[{"symbol":"","precision":2}]"#).is_err());
        assert!(Assets::parse(r#"{"symbol":"X","precision":2}"#).is_err());
        let ok = Assets::parse(r#"[{"symbol":"JPY","precision":0,"status":"ACTIVE"}]"#).unwrap();
        assert_eq!(ok.precision("JPY"), Some(0));
    }
}
