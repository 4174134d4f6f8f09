//! Daily transfer limits (seed 000 section 1.5.6), kept in PostgreSQL so that every ledger
//! process shares one count per user and day. The coordinator reserves a new transfer's share
//! before creating it, so a caller that skips the API is held to the same limits.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use domain::{Amount, AssetSymbol, ErrorCode, UserId};
use rust_decimal::Decimal;
use sqlx::PgPool;

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

/// Reserves one transfer of `amount` for `user` on `day`, or refuses with
/// DAILY_LIMIT_EXCEEDED / DAILY_AMOUNT_EXCEEDED and reserves nothing. Both counters change in one
/// transaction; each UPSERT increments only while the result stays within the limit, and the row
/// lock it takes serialises concurrent reservations for the same user, across processes.
pub async fn reserve(
    pool: &PgPool,
    limits: &DailyLimits,
    user: UserId,
    asset: &AssetSymbol,
    amount: Amount,
    day: NaiveDate,
) -> Result<Result<(), ErrorCode>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    if let Some(max) = limits.count_max {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let counted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO daily_transfer_counts AS c (user_id, day, count) VALUES ($1, $2, 1)
             ON CONFLICT (user_id, day) DO UPDATE SET count = c.count + 1 WHERE c.count < $3
             RETURNING count",
        )
        .bind(user.as_i64())
        .bind(day)
        .bind(max)
        .fetch_optional(&mut *tx)
        .await?;
        // A first row is inserted unconditionally, so a limit of 0 is checked here.
        if counted.is_none_or(|n| n > max) {
            tx.rollback().await?;
            return Ok(Err(ErrorCode::DailyLimitExceeded));
        }
    }
    if let Some(max) = limits.amount_max.get(asset) {
        if amount.value() > *max {
            tx.rollback().await?;
            return Ok(Err(ErrorCode::DailyAmountExceeded));
        }
        let total: Option<Decimal> = sqlx::query_scalar(
            "INSERT INTO daily_transfer_amounts AS a (user_id, day, asset, amount)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (user_id, day, asset) DO UPDATE SET amount = a.amount + EXCLUDED.amount
             WHERE a.amount + EXCLUDED.amount <= $5
             RETURNING amount",
        )
        .bind(user.as_i64())
        .bind(day)
        .bind(asset.as_str())
        .bind(amount.value())
        .bind(*max)
        .fetch_optional(&mut *tx)
        .await?;
        if total.is_none() {
            tx.rollback().await?;
            return Ok(Err(ErrorCode::DailyAmountExceeded));
        }
    }
    tx.commit().await?;
    Ok(Ok(()))
}

/// Gives back a reservation made by [`reserve`] with the same arguments, for a transfer that was
/// not created after all (a concurrent duplicate created it first, or `create` failed and the
/// transfer provably does not exist). Never goes below zero. Both counters change in one
/// transaction; a counter the limits do not keep is left alone, as `reserve` left it.
pub async fn release(
    pool: &PgPool,
    limits: &DailyLimits,
    user: UserId,
    asset: &AssetSymbol,
    amount: Amount,
    day: NaiveDate,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    if limits.count_max.is_some() {
        sqlx::query(
            "UPDATE daily_transfer_counts SET count = GREATEST(count - 1, 0)
             WHERE user_id = $1 AND day = $2",
        )
        .bind(user.as_i64())
        .bind(day)
        .execute(&mut *tx)
        .await?;
    }
    if limits.amount_max.contains_key(asset) {
        sqlx::query(
            "UPDATE daily_transfer_amounts SET amount = GREATEST(amount - $4, 0)
             WHERE user_id = $1 AND day = $2 AND asset = $3",
        )
        .bind(user.as_i64())
        .bind(day)
        .bind(asset.as_str())
        .bind(amount.value())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// What one user has used on `day`: (transfers, amount of `asset`).
pub async fn usage(
    pool: &PgPool,
    user: UserId,
    asset: &AssetSymbol,
    day: NaiveDate,
) -> Result<(i64, Decimal), sqlx::Error> {
    let count: Option<i64> = sqlx::query_scalar(
        "SELECT count FROM daily_transfer_counts WHERE user_id = $1 AND day = $2",
    )
    .bind(user.as_i64())
    .bind(day)
    .fetch_optional(pool)
    .await?;
    let amount: Option<Decimal> = sqlx::query_scalar(
        "SELECT amount FROM daily_transfer_amounts WHERE user_id = $1 AND day = $2 AND asset = $3",
    )
    .bind(user.as_i64())
    .bind(day)
    .bind(asset.as_str())
    .fetch_optional(pool)
    .await?;
    Ok((count.unwrap_or(0), amount.unwrap_or_default().normalize()))
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
