//! Rate limits of seed 000 section 1.5.6: requests per second per user (in this process's
//! memory), and the daily count and amount (in PostgreSQL, enforced by the coordinator so every
//! `ledger serve` process shares them). Configured by the `ledger` settings.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use application::DailyLimits;
use domain::{Amount, AssetSymbol, ErrorCode, UserId};

/// Transfer requests per second per user; `0` or `off` turns the limit off.
pub const RATE_PER_SECOND_ENV: &str = "LEDGER_RATE_PER_SECOND";
/// Transfers per user and UTC day; `0` or `off` turns the limit off.
pub const DAILY_COUNT_MAX_ENV: &str = "LEDGER_DAILY_COUNT_MAX";
/// Amount per user, asset and UTC day, as a JSON object `{"USDT": "1000000", ...}`.
pub const DAILY_AMOUNT_MAX_ENV: &str = "LEDGER_DAILY_AMOUNT_MAX";

/// Seed 000 section 1.5.6's values, the defaults of `ledger up` and `ledger serve`.
pub const RATE_PER_SECOND_DEFAULT: u32 = 10;
pub const DAILY_COUNT_MAX_DEFAULT: u64 = 100;

/// Users whose current window is remembered before stale windows are swept out; bounds memory.
const USERS_TRACKED_MAX: usize = 100_000;

/// Every limit the edge and the coordinator apply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitsConfig {
    pub requests_per_second: Option<u32>,
    pub daily: DailyLimits,
}

impl LimitsConfig {
    /// No limit at all: what an in-process `AppState::new` starts with.
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// The seed's values: 10 requests per second and 100 transfers per day per user; no daily
    /// amount limit unless one is configured per asset.
    pub fn seed_defaults() -> Self {
        Self {
            requests_per_second: Some(RATE_PER_SECOND_DEFAULT),
            daily: DailyLimits {
                count_max: Some(DAILY_COUNT_MAX_DEFAULT),
                amount_max: BTreeMap::new(),
            },
        }
    }

    /// The seed defaults, overridden by the settings named by the variables above (as the
    /// `ledger` settings read them; `None` keeps the default).
    pub fn from_settings(
        rate_per_second: Option<&str>,
        daily_count_max: Option<&str>,
        daily_amount_max: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut limits = Self::seed_defaults();
        if let Some(v) = rate_per_second {
            limits.requests_per_second = parse_limit(v, RATE_PER_SECOND_ENV)?;
        }
        if let Some(v) = daily_count_max {
            limits.daily.count_max = parse_limit::<u64>(v, DAILY_COUNT_MAX_ENV)?;
        }
        if let Some(v) = daily_amount_max {
            limits.daily.amount_max = parse_amounts(v)?;
        }
        Ok(limits)
    }
}

fn parse_limit<T: std::str::FromStr + PartialEq + Default>(
    text: &str,
    name: &str,
) -> anyhow::Result<Option<T>> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let Ok(n) = text.parse::<T>() else {
        bail!("{name} must be a non-negative integer or `off`, got {text:?}");
    };
    Ok((n != T::default()).then_some(n))
}

fn parse_amounts(text: &str) -> anyhow::Result<BTreeMap<AssetSymbol, rust_decimal::Decimal>> {
    let raw: BTreeMap<String, String> = serde_json::from_str(text).with_context(|| {
        format!("{DAILY_AMOUNT_MAX_ENV} must be a JSON object of asset to amount string")
    })?;
    let mut out = BTreeMap::new();
    for (asset, amount) in raw {
        let symbol = AssetSymbol::parse(&asset)
            .map_err(|_| anyhow::anyhow!("{DAILY_AMOUNT_MAX_ENV}: bad asset {asset:?}"))?;
        let amount = Amount::parse(&amount)
            .map_err(|c| anyhow::anyhow!("{DAILY_AMOUNT_MAX_ENV}: {asset}: {c}"))?;
        out.insert(symbol, amount.value());
    }
    Ok(out)
}

/// A fixed one-second window per user. Per process on purpose: a second is too short for a
/// database round trip to be worth it, and N processes allow at most N times the rate.
#[derive(Debug)]
pub struct RateLimiter {
    per_second: Option<u32>,
    windows: Mutex<HashMap<UserId, (u64, u32)>>,
}

impl RateLimiter {
    pub fn new(per_second: Option<u32>) -> Self {
        Self {
            per_second,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one request of `user` now; RATE_LIMIT_EXCEEDED past the limit.
    pub fn check(&self, user: UserId) -> Result<(), ErrorCode> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.check_at(user, now)
    }

    /// The same at a given second (tests inject the clock).
    pub fn check_at(&self, user: UserId, second: u64) -> Result<(), ErrorCode> {
        let Some(max) = self.per_second else {
            return Ok(());
        };
        // A poisoned lock only means another request panicked while counting; the map is whole.
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if windows.len() >= USERS_TRACKED_MAX {
            windows.retain(|_, (s, _)| *s >= second);
        }
        let window = windows.entry(user).or_insert((second, 0));
        if window.0 != second {
            *window = (second, 0);
        }
        if window.1 >= max {
            return Err(ErrorCode::RateLimitExceeded);
        }
        window.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(n: u64) -> UserId {
        UserId::new(n).unwrap()
    }

    #[test]
    fn the_limit_holds_per_user_and_per_second() {
        let limiter = RateLimiter::new(Some(2));
        assert!(limiter.check_at(user(1), 100).is_ok());
        assert!(limiter.check_at(user(1), 100).is_ok());
        assert_eq!(
            limiter.check_at(user(1), 100),
            Err(ErrorCode::RateLimitExceeded)
        );
        assert!(limiter.check_at(user(2), 100).is_ok(), "another user");
        assert!(limiter.check_at(user(1), 101).is_ok(), "the next second");
    }

    #[test]
    fn no_limit_means_no_refusal() {
        let limiter = RateLimiter::new(None);
        for _ in 0..1000 {
            assert!(limiter.check_at(user(1), 5).is_ok());
        }
    }

    #[test]
    fn limits_parse_from_text() {
        assert_eq!(parse_limit::<u32>("10", "X").unwrap(), Some(10));
        assert_eq!(parse_limit::<u32>("0", "X").unwrap(), None);
        assert_eq!(parse_limit::<u32>("off", "X").unwrap(), None);
        assert!(parse_limit::<u32>("-1", "X").is_err());
        let amounts = parse_amounts(r#"{"USDT": "1000.5"}"#).unwrap();
        assert_eq!(amounts.len(), 1);
        assert!(parse_amounts(r#"{"USDT": 1000}"#).is_err());
        assert!(parse_amounts(r#"{"usdt": "1"}"#).is_err());
    }
}
