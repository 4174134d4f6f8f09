//! The daily limits' values and their one rule, pure (no I/O): how many transfers and how much
//! of each asset one user may move per UTC day (`DailyLimits`), one transfer's charge against
//! them (`Charge`), the decision (`decide`) and the counters it is applied to (`DailyUsage`),
//! and the UTC day a moment falls in. The counters live behind the `DailyReservations` port:
//! PostgreSQL's (`limits.rs`) locks and reads its rows, decides here and writes them back; the
//! simulation's keeps a `DailyUsage` per day.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use domain::{invariant, Amount, AssetSymbol, ErrorCode, UserId};
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

/// What one user has used of one day's limits before a charge: transfers (of any asset) and
/// the amount of the charge's asset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    pub count: u64,
    pub amount: Decimal,
}

/// The one daily-limit rule: whether `charge` may be reserved given what its user has `used`
/// that day. The transfer count first (one more is allowed while fewer than the maximum were
/// made), then the amount (one that would take the day's total of its asset past the maximum,
/// or is over it alone, is refused). No limit of a kind refuses nothing of that kind.
pub fn decide(limits: &DailyLimits, used: Used, charge: &Charge) -> Result<(), ErrorCode> {
    if limits.count_max.is_some_and(|max| used.count >= max) {
        return Err(ErrorCode::DailyLimitExceeded);
    }
    if let Some(max) = limits.amount_max.get(&charge.asset) {
        let amount = charge.amount.value();
        if amount > *max || used.amount + amount > *max {
            return Err(ErrorCode::DailyAmountExceeded);
        }
    }
    Ok(())
}

/// One day's counters the limits keep: transfers per user, amount per user and asset. A counter
/// the limits do not keep is neither read nor changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DailyUsage {
    pub counts: BTreeMap<UserId, u64>,
    pub amounts: BTreeMap<(UserId, AssetSymbol), Decimal>,
}

impl DailyUsage {
    /// What `charge`'s user has used before it.
    pub fn used(&self, charge: &Charge) -> Used {
        Used {
            count: self.counts.get(&charge.user).copied().unwrap_or(0),
            amount: self
                .amounts
                .get(&(charge.user, charge.asset.clone()))
                .copied()
                .unwrap_or_default(),
        }
    }

    /// Reserves `charge` if [`decide`] allows it; a refused charge changes nothing.
    pub fn charge(&mut self, limits: &DailyLimits, charge: &Charge) -> Result<(), ErrorCode> {
        let before = self.used(charge);
        decide(limits, before, charge)?;
        let count = match limits.count_max {
            Some(_) => {
                let n = self.counts.entry(charge.user).or_insert(0);
                *n += 1;
                *n
            }
            None => before.count,
        };
        let amount = match limits.amount_max.get(&charge.asset) {
            Some(_) => {
                let a = self
                    .amounts
                    .entry((charge.user, charge.asset.clone()))
                    .or_default();
                *a += charge.amount.value();
                *a
            }
            None => before.amount,
        };
        // Postconditions of an accepted charge: the counters it keeps grew by exactly this
        // transfer, and neither is past its limit (whatever they held before: a lowered limit
        // may leave a counter above it, and then `decide` refuses).
        invariant!(
            limits
                .count_max
                .is_none_or(|max| count == before.count + 1 && count <= max),
            "{}: a charge took the day's transfers from {} to {count} (limit {:?})",
            charge.user,
            before.count,
            limits.count_max
        );
        invariant!(
            limits
                .amount_max
                .get(&charge.asset)
                .is_none_or(|max| amount == before.amount + charge.amount.value()
                    && amount <= *max),
            "{}: a charge of {} {} took the day's amount from {} to {amount} (limit {:?})",
            charge.user,
            charge.amount,
            charge.asset,
            before.amount,
            limits.amount_max.get(&charge.asset)
        );
        Ok(())
    }

    /// Reserves each of `charges` in order, as one [`charge`](Self::charge) after another.
    pub fn charge_all(
        &mut self,
        limits: &DailyLimits,
        charges: &[Charge],
    ) -> Vec<Result<(), ErrorCode>> {
        charges.iter().map(|c| self.charge(limits, c)).collect()
    }

    /// Gives back a reservation `charge` made with the same arguments, never below zero.
    pub fn release(&mut self, limits: &DailyLimits, charge: &Charge) {
        if limits.count_max.is_some() {
            if let Some(n) = self.counts.get_mut(&charge.user) {
                *n = n.saturating_sub(1);
            }
        }
        if limits.amount_max.contains_key(&charge.asset) {
            if let Some(a) = self.amounts.get_mut(&(charge.user, charge.asset.clone())) {
                *a = (*a - charge.amount.value()).max(Decimal::ZERO);
            }
        }
    }
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

    fn charge(user: u64, asset: &str, amount: &str) -> Charge {
        Charge {
            user: UserId::new(user).unwrap(),
            asset: AssetSymbol::parse(asset).unwrap(),
            amount: Amount::parse(amount).unwrap(),
        }
    }

    fn usdt_10_and_3_a_day() -> DailyLimits {
        DailyLimits {
            count_max: Some(3),
            amount_max: BTreeMap::from([(AssetSymbol::parse("USDT").unwrap(), Decimal::from(10))]),
        }
    }

    #[test]
    fn the_rule_counts_first_then_the_amount() {
        use ErrorCode::{DailyAmountExceeded as Amt, DailyLimitExceeded as Cnt};
        let limits = usdt_10_and_3_a_day();
        let used = |count, amount: i64| Used {
            count,
            amount: Decimal::from(amount),
        };
        assert_eq!(
            decide(&limits, used(0, 0), &charge(1, "USDT", "10")),
            Ok(())
        );
        assert_eq!(
            decide(&limits, used(0, 0), &charge(1, "USDT", "11")),
            Err(Amt)
        );
        assert_eq!(decide(&limits, used(2, 6), &charge(1, "USDT", "4")), Ok(()));
        assert_eq!(
            decide(&limits, used(2, 6), &charge(1, "USDT", "5")),
            Err(Amt)
        );
        assert_eq!(
            decide(&limits, used(3, 0), &charge(1, "USDT", "11")),
            Err(Cnt)
        );
        assert_eq!(
            decide(&limits, used(2, 100), &charge(1, "ETH", "100")),
            Ok(())
        );
        assert_eq!(
            decide(
                &DailyLimits::default(),
                used(u64::MAX, 0),
                &charge(1, "ETH", "1")
            ),
            Ok(())
        );
    }

    #[test]
    fn a_batch_is_charged_in_order_as_one_reservation_after_another() {
        let limits = usdt_10_and_3_a_day();
        let user = UserId::new(1).unwrap();
        let usdt = AssetSymbol::parse("USDT").unwrap();
        let mut usage = DailyUsage::default();
        usage.counts.insert(user, 1);
        let answers = usage.charge_all(
            &limits,
            &[
                charge(1, "USDT", "11"), // over the day's maximum alone: nothing counted
                charge(1, "USDT", "6"),
                charge(1, "USDT", "5"), // 11 in the day: refused, nothing counted
                charge(1, "ETH", "100"), // no amount limit on ETH; the third transfer
                charge(1, "USDT", "1"), // a fourth: over the count
                charge(2, "USDT", "10"), // another user's own counters
            ],
        );
        use ErrorCode::{DailyAmountExceeded as Amt, DailyLimitExceeded as Cnt};
        assert_eq!(
            answers,
            vec![Err(Amt), Ok(()), Err(Amt), Ok(()), Err(Cnt), Ok(())]
        );
        let other = UserId::new(2).unwrap();
        assert_eq!(usage.counts, BTreeMap::from([(user, 3), (other, 1)]));
        assert_eq!(usage.amounts[&(user, usdt.clone())], Decimal::from(6));
        assert_eq!(usage.amounts[&(other, usdt)], Decimal::from(10));
        assert!(!usage.amounts.keys().any(|(_, a)| a.as_str() == "ETH"));
    }

    #[test]
    fn a_count_limit_of_zero_refuses_the_first() {
        let limits = DailyLimits {
            count_max: Some(0),
            amount_max: BTreeMap::new(),
        };
        let mut usage = DailyUsage::default();
        assert_eq!(
            usage.charge(&limits, &charge(1, "USDT", "1")),
            Err(ErrorCode::DailyLimitExceeded)
        );
        assert_eq!(usage, DailyUsage::default());
    }

    #[test]
    fn a_release_gives_back_what_was_charged_and_never_goes_below_zero() {
        let limits = usdt_10_and_3_a_day();
        let mut usage = DailyUsage::default();
        let five = charge(1, "USDT", "5");
        usage.charge(&limits, &five).unwrap();
        usage.charge(&limits, &five).unwrap();
        usage.release(&limits, &five);
        assert_eq!(usage.used(&five).count, 1);
        assert_eq!(usage.used(&five).amount, Decimal::from(5));
        usage.release(&limits, &five);
        usage.release(&limits, &five);
        assert_eq!(usage.used(&five), Used::default());
    }

    #[test]
    fn retry_after_counts_to_the_next_utc_midnight() {
        let at = Utc.with_ymd_and_hms(2026, 3, 1, 23, 59, 30).unwrap();
        assert_eq!(secs_until_next_day(at), 30);
        let at = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
        assert_eq!(secs_until_next_day(at), 86_400);
    }
}
