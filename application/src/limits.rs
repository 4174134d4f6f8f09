//! Daily transfer limits (seed 000 section 1.5.6), kept in PostgreSQL so that every ledger
//! process shares one count per user and day. The coordinator reserves a new transfer's share
//! before creating it, so a caller that skips the API is held to the same limits.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use domain::{AssetSymbol, ErrorCode, UserId};
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::daily::{Charge, DailyLimits};

/// Reserves one transfer of `amount` for `user` on `day`, or refuses with
/// DAILY_LIMIT_EXCEEDED / DAILY_AMOUNT_EXCEEDED and reserves nothing. Both counters change in one
/// transaction; each UPSERT increments only while the result stays within the limit, and the row
/// lock it takes serialises concurrent reservations for the same user, across processes.
pub async fn reserve(
    pool: &PgPool,
    limits: &DailyLimits,
    charge: &Charge,
    day: NaiveDate,
) -> Result<Result<(), ErrorCode>, sqlx::Error> {
    let Charge {
        user,
        asset,
        amount,
    } = charge;
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

/// Reserves each of `charges` on `day`, in order, with exactly the answers [`reserve`] called
/// once per charge, one after another, would give (a limit running out refuses the later
/// charges; a refused charge reserves nothing), in one transaction of a fixed number of
/// statements whatever the batch's size. The rows are locked in key order (counts by user, then
/// amounts by user and asset), so concurrent batches and single reservations never deadlock,
/// and none of them can pass a limit.
pub async fn reserve_many(
    pool: &PgPool,
    limits: &DailyLimits,
    charges: &[Charge],
    day: NaiveDate,
) -> Result<Vec<Result<(), ErrorCode>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut used = Used::default();
    if limits.count_max.is_some() {
        let users: Vec<i64> = charges
            .iter()
            .map(|c| c.user.as_i64())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        sqlx::query(
            "INSERT INTO daily_transfer_counts (user_id, day, count)
             SELECT u, $2, 0 FROM unnest($1::bigint[]) AS u ORDER BY u
             ON CONFLICT (user_id, day) DO NOTHING",
        )
        .bind(&users)
        .bind(day)
        .execute(&mut *tx)
        .await?;
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT user_id, count FROM daily_transfer_counts
             WHERE day = $2 AND user_id = ANY($1) ORDER BY user_id FOR UPDATE",
        )
        .bind(&users)
        .bind(day)
        .fetch_all(&mut *tx)
        .await?;
        used.counts = rows.into_iter().collect();
    }
    let keys: std::collections::BTreeSet<(i64, String)> = charges
        .iter()
        .filter(|c| limits.amount_max.contains_key(&c.asset))
        .map(|c| (c.user.as_i64(), c.asset.as_str().to_owned()))
        .collect();
    if !keys.is_empty() {
        let (users, assets): (Vec<i64>, Vec<String>) = keys.into_iter().unzip();
        sqlx::query(
            "INSERT INTO daily_transfer_amounts (user_id, day, asset, amount)
             SELECT u, $3, a, 0 FROM unnest($1::bigint[], $2::text[]) AS k(u, a) ORDER BY u, a
             ON CONFLICT (user_id, day, asset) DO NOTHING",
        )
        .bind(&users)
        .bind(&assets)
        .bind(day)
        .execute(&mut *tx)
        .await?;
        let rows: Vec<(i64, String, Decimal)> = sqlx::query_as(
            "SELECT d.user_id, d.asset, d.amount FROM daily_transfer_amounts d
             JOIN unnest($1::bigint[], $2::text[]) AS k(u, a) ON d.user_id = k.u AND d.asset = k.a
             WHERE d.day = $3 ORDER BY d.user_id, d.asset FOR UPDATE OF d",
        )
        .bind(&users)
        .bind(&assets)
        .bind(day)
        .fetch_all(&mut *tx)
        .await?;
        used.amounts = rows.into_iter().map(|(u, a, n)| ((u, a), n)).collect();
    }
    let answers = used.charge(limits, charges);
    if limits.count_max.is_some() {
        let (users, counts): (Vec<i64>, Vec<i64>) = used.counts.into_iter().unzip();
        sqlx::query(
            "UPDATE daily_transfer_counts c SET count = v.n
             FROM unnest($1::bigint[], $2::bigint[]) AS v(u, n)
             WHERE c.user_id = v.u AND c.day = $3 AND c.count <> v.n",
        )
        .bind(&users)
        .bind(&counts)
        .bind(day)
        .execute(&mut *tx)
        .await?;
    }
    if !used.amounts.is_empty() {
        let mut users = Vec::new();
        let mut assets = Vec::new();
        let mut amounts = Vec::new();
        for ((u, a), n) in used.amounts {
            users.push(u);
            assets.push(a);
            amounts.push(n);
        }
        sqlx::query(
            "UPDATE daily_transfer_amounts d SET amount = v.n
             FROM unnest($1::bigint[], $2::text[], $3::numeric[]) AS v(u, a, n)
             WHERE d.user_id = v.u AND d.asset = v.a AND d.day = $4 AND d.amount <> v.n",
        )
        .bind(&users)
        .bind(&assets)
        .bind(&amounts)
        .bind(day)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(answers)
}

/// What the locked counters hold during [`reserve_many`]: transfers per user, amount per user
/// and asset (on one day).
#[derive(Debug, Default)]
struct Used {
    counts: BTreeMap<i64, i64>,
    amounts: BTreeMap<(i64, String), Decimal>,
}

impl Used {
    /// Charges each in order as [`reserve`] would, one after another: the transfer count first
    /// (a transfer is counted while fewer than the maximum were), then the amount (one over the
    /// day's maximum alone, or that would take the day's total past it, is refused). A refused
    /// charge changes nothing.
    fn charge(&mut self, limits: &DailyLimits, charges: &[Charge]) -> Vec<Result<(), ErrorCode>> {
        charges
            .iter()
            .map(
                |Charge {
                     user,
                     asset,
                     amount,
                 }| {
                    let user = user.as_i64();
                    if let Some(max) = limits.count_max {
                        let max = i64::try_from(max).unwrap_or(i64::MAX);
                        if self.counts.get(&user).copied().unwrap_or(0) >= max {
                            return Err(ErrorCode::DailyLimitExceeded);
                        }
                    }
                    if let Some(max) = limits.amount_max.get(asset) {
                        let key = (user, asset.as_str().to_owned());
                        let total = self.amounts.get(&key).copied().unwrap_or_default();
                        if amount.value() > *max || total + amount.value() > *max {
                            return Err(ErrorCode::DailyAmountExceeded);
                        }
                        self.amounts.insert(key, total + amount.value());
                    }
                    if limits.count_max.is_some() {
                        *self.counts.entry(user).or_insert(0) += 1;
                    }
                    Ok(())
                },
            )
            .collect()
    }
}

/// Gives back a reservation made by [`reserve`] with the same arguments, for a transfer that was
/// not created after all (a concurrent duplicate created it first, or `create` failed and the
/// transfer provably does not exist). Never goes below zero. Both counters change in one
/// transaction; a counter the limits do not keep is left alone, as `reserve` left it.
pub async fn release(
    pool: &PgPool,
    limits: &DailyLimits,
    charge: &Charge,
    day: NaiveDate,
) -> Result<(), sqlx::Error> {
    let Charge {
        user,
        asset,
        amount,
    } = charge;
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
    use domain::Amount;

    fn charge(user: u64, asset: &str, amount: &str) -> Charge {
        Charge {
            user: UserId::new(user).unwrap(),
            asset: AssetSymbol::parse(asset).unwrap(),
            amount: Amount::parse(amount).unwrap(),
        }
    }

    #[test]
    fn a_batch_is_charged_in_order_as_one_reservation_after_another() {
        let limits = DailyLimits {
            count_max: Some(3),
            amount_max: BTreeMap::from([(AssetSymbol::parse("USDT").unwrap(), Decimal::from(10))]),
        };
        let mut used = Used::default();
        used.counts.insert(1, 1);
        let answers = used.charge(
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
        assert_eq!(used.counts, BTreeMap::from([(1, 3), (2, 1)]));
        assert_eq!(used.amounts[&(1, "USDT".to_owned())], Decimal::from(6));
        assert_eq!(used.amounts[&(2, "USDT".to_owned())], Decimal::from(10));
    }

    #[test]
    fn a_count_limit_of_zero_refuses_the_first() {
        let limits = DailyLimits {
            count_max: Some(0),
            amount_max: BTreeMap::new(),
        };
        let mut used = Used::default();
        assert_eq!(
            used.charge(&limits, &[charge(1, "USDT", "1")]),
            vec![Err(ErrorCode::DailyLimitExceeded)]
        );
    }
}
