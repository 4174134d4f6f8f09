//! Daily transfer limits, kept in PostgreSQL so that every ledger process shares one count per
//! user and day. The coordinator reserves a new transfer's share before creating it, so a caller
//! that skips the API is held to the same limits. The SQL locks, reads and writes the counters;
//! the decision is `daily::DailyUsage::charge` (`daily::decide`), made in Rust under the rows'
//! locks, the same rule the simulation runs.

use std::collections::{BTreeMap, BTreeSet};

use chrono::NaiveDate;
use domain::{AssetSymbol, ErrorCode, UserId};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};

use application::daily::{Charge, DailyLimits, DailyUsage};

/// Reserves one transfer of `charge` on `day`, or refuses with DAILY_LIMIT_EXCEEDED /
/// DAILY_AMOUNT_EXCEEDED and reserves nothing: [`reserve_many`] of one charge.
pub async fn reserve(
    pool: &PgPool,
    limits: &DailyLimits,
    charge: &Charge,
    day: NaiveDate,
) -> Result<Result<(), ErrorCode>, sqlx::Error> {
    let mut answers = reserve_many(pool, limits, std::slice::from_ref(charge), day).await?;
    Ok(answers.pop().unwrap_or(Ok(())))
}

/// Reserves each of `charges` on `day`, in order, with exactly the answers [`reserve`] called
/// once per charge, one after another, would give (a limit running out refuses the later
/// charges; a refused charge reserves nothing), in one transaction of at most four statements
/// whatever the batch's size. The rows are locked in key order (counts by user, then amounts by
/// user and asset), so concurrent batches never deadlock, and none of them can pass a limit:
/// each decides on counters no other transaction can change until it commits.
pub async fn reserve_many(
    pool: &PgPool,
    limits: &DailyLimits,
    charges: &[Charge],
    day: NaiveDate,
) -> Result<Vec<Result<(), ErrorCode>>, sqlx::Error> {
    if limits.is_unlimited() || charges.is_empty() {
        return Ok(charges.iter().map(|_| Ok(())).collect());
    }
    let mut tx = pool.begin().await?;
    let answers = reserve_in(&mut tx, limits, charges, day).await?;
    tx.commit().await?;
    Ok(answers)
}

/// [`reserve_many`]'s work inside a transaction the caller holds and commits: the counters
/// locked, decided and written back, the answers in order. The event store's creations write
/// their charges this way in their own transaction (ADR 0022).
pub async fn reserve_in(
    tx: &mut PgConnection,
    limits: &DailyLimits,
    charges: &[Charge],
    day: NaiveDate,
) -> Result<Vec<Result<(), ErrorCode>>, sqlx::Error> {
    if limits.is_unlimited() || charges.is_empty() {
        return Ok(charges.iter().map(|_| Ok(())).collect());
    }
    let mut usage = DailyUsage::default();
    if limits.count_max.is_some() {
        let users: BTreeSet<UserId> = charges.iter().map(|c| c.user).collect();
        usage.counts = lock_counts(&mut *tx, &users, day).await?;
    }
    let keys: BTreeSet<(UserId, AssetSymbol)> = charges
        .iter()
        .filter(|c| limits.amount_max.contains_key(&c.asset))
        .map(|c| (c.user, c.asset.clone()))
        .collect();
    if !keys.is_empty() {
        usage.amounts = lock_amounts(&mut *tx, &keys, day).await?;
    }
    let before = usage.clone();
    let answers = usage.charge_all(limits, charges);
    if usage != before {
        store_usage(&mut *tx, &before, &usage, day).await?;
    }
    Ok(answers)
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Locks (creating at zero where missing) and reads the transfer counts of `users` on `day`, in
/// user order.
async fn lock_counts(
    conn: &mut PgConnection,
    users: &BTreeSet<UserId>,
    day: NaiveDate,
) -> Result<BTreeMap<UserId, u64>, sqlx::Error> {
    let ids: Vec<i64> = users.iter().map(|u| u.as_i64()).collect();
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "INSERT INTO daily_transfer_counts AS c (user_id, day, count)
         SELECT u, $2, 0 FROM unnest($1::bigint[]) AS u ORDER BY u
         ON CONFLICT (user_id, day) DO UPDATE SET count = c.count
         RETURNING user_id, count",
    )
    .bind(&ids)
    .bind(day)
    .fetch_all(conn)
    .await?;
    Ok(users
        .iter()
        .zip(&ids)
        .map(|(user, id)| {
            let count = rows.iter().find(|(u, _)| u == id).map_or(0, |(_, n)| *n);
            (*user, u64::try_from(count).unwrap_or(0))
        })
        .collect())
}

/// Locks (creating at zero where missing) and reads the amounts of `keys` on `day`, in (user,
/// asset) order.
async fn lock_amounts(
    conn: &mut PgConnection,
    keys: &BTreeSet<(UserId, AssetSymbol)>,
    day: NaiveDate,
) -> Result<BTreeMap<(UserId, AssetSymbol), Decimal>, sqlx::Error> {
    let users: Vec<i64> = keys.iter().map(|(u, _)| u.as_i64()).collect();
    let assets: Vec<&str> = keys.iter().map(|(_, a)| a.as_str()).collect();
    let rows: Vec<(i64, String, Decimal)> = sqlx::query_as(
        "INSERT INTO daily_transfer_amounts AS d (user_id, day, asset, amount)
         SELECT u, $3, a, 0 FROM unnest($1::bigint[], $2::text[]) AS k(u, a) ORDER BY u, a
         ON CONFLICT (user_id, day, asset) DO UPDATE SET amount = d.amount
         RETURNING user_id, asset, amount",
    )
    .bind(&users)
    .bind(&assets)
    .bind(day)
    .fetch_all(conn)
    .await?;
    Ok(keys
        .iter()
        .map(|(user, asset)| {
            let amount = rows
                .iter()
                .find(|(u, a, _)| *u == user.as_i64() && a == asset.as_str())
                .map_or(Decimal::ZERO, |(_, _, n)| *n);
            ((*user, asset.clone()), amount)
        })
        .collect())
}

/// Writes back the counters `after` changed from `before`.
async fn store_usage(
    conn: &mut PgConnection,
    before: &DailyUsage,
    after: &DailyUsage,
    day: NaiveDate,
) -> Result<(), sqlx::Error> {
    let counts: Vec<(i64, i64)> = after
        .counts
        .iter()
        .filter(|(user, n)| before.counts.get(user) != Some(n))
        .map(|(user, n)| (user.as_i64(), as_i64(*n)))
        .collect();
    if !counts.is_empty() {
        let (users, counts): (Vec<i64>, Vec<i64>) = counts.into_iter().unzip();
        sqlx::query(
            "UPDATE daily_transfer_counts c SET count = v.n
             FROM unnest($1::bigint[], $2::bigint[]) AS v(u, n)
             WHERE c.user_id = v.u AND c.day = $3",
        )
        .bind(&users)
        .bind(&counts)
        .bind(day)
        .execute(&mut *conn)
        .await?;
    }
    let changed: Vec<_> = after
        .amounts
        .iter()
        .filter(|(key, n)| before.amounts.get(key) != Some(n))
        .collect();
    if !changed.is_empty() {
        let users: Vec<i64> = changed.iter().map(|((u, _), _)| u.as_i64()).collect();
        let assets: Vec<&str> = changed.iter().map(|((_, a), _)| a.as_str()).collect();
        let amounts: Vec<Decimal> = changed.iter().map(|(_, n)| **n).collect();
        sqlx::query(
            "UPDATE daily_transfer_amounts d SET amount = v.n
             FROM unnest($1::bigint[], $2::text[], $3::numeric[]) AS v(u, a, n)
             WHERE d.user_id = v.u AND d.asset = v.a AND d.day = $4",
        )
        .bind(&users)
        .bind(&assets)
        .bind(&amounts)
        .bind(day)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
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
