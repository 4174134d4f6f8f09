//! The daily limits' values and rule, pure (no I/O): how many transfers and how much of each
//! asset one user may move per UTC day (`DailyLimits`), one transfer's charge against them
//! (`Charge`), and the UTC day a moment falls in. The counters live behind the
//! `DailyReservations` port (`limits.rs` in PostgreSQL, the simulation's in memory).

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use domain::{Amount, AssetSymbol, UserId};
use rust_decimal::Decimal;

/// How many transfers and how much of each asset one user may move per UTC day. `None` (or an
/// asset missing from the map) means no limit of that kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DailyLimits {
    pub count_max: Option<u64>,
    pub amount_max: BTreeMap<AssetSymbol, Decimal>,
}

impl DailyLimits {
    pub fn is_unlimited(&self) -> bool {
        self.count_max.is_none() && self.amount_max.is_empty()
    }
}

/// One transfer to charge against the daily limits: whose, which asset, how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub user: UserId,
    pub asset: AssetSymbol,
    pub amount: Amount,
}

/// The UTC day a moment falls in; the counters roll over at UTC midnight.
pub fn day_of(at: DateTime<Utc>) -> NaiveDate {
    at.date_naive()
}

/// Seconds from `at` to the next UTC midnight (at least 1): the `Retry-After` of a daily refusal.
pub fn secs_until_next_day(at: DateTime<Utc>) -> u64 {
    let next = day_of(at)
        .succ_opt()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc());
    next.map_or(86_400, |n| (n - at).num_seconds().max(1).unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn retry_after_counts_to_the_next_utc_midnight() {
        let at = Utc.with_ymd_and_hms(2026, 3, 1, 23, 59, 30).unwrap();
        assert_eq!(secs_until_next_day(at), 30);
        let at = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
        assert_eq!(secs_until_next_day(at), 86_400);
    }
}
