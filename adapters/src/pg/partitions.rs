//! What each partition of a cell weighs, for `ledger cells plan` (ADR 0023): its users (the
//! FUNDING accounts' distinct owners: a user holds SPOT only through a transfer from FUNDING) or
//! its transfers created within a recent window. The partition is computed in SQL by ADR 0017
//! §2's function: SHA-256 of the decimal user id, its first 8 bytes big-endian, mod 256, which is
//! the 8th byte (`get_byte(…, 7)`); `tests/it/cells.rs` holds it equal to `cells::partition_of`.
//! Each is one pass over its table: an operator's read, not for a request's path.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;

/// The partition of `user_id` in SQL (ADR 0017 §2).
const PARTITION_SQL: &str = "get_byte(sha256(convert_to(user_id::text, 'UTF8')), 7)";

/// Each partition's number of users (partitions with none are absent).
pub async fn users_per_partition(pool: &PgPool) -> Result<BTreeMap<u8, u64>, sqlx::Error> {
    let sql = format!(
        "SELECT {PARTITION_SQL} AS partition, count(DISTINCT user_id) \
         FROM funding_accounts GROUP BY 1"
    );
    rows(pool, &sql, None).await
}

/// Each partition's transfers created within the last `window` (partitions with none are
/// absent), as the projector has recorded them.
pub async fn transfers_per_partition(
    pool: &PgPool,
    window: Duration,
) -> Result<BTreeMap<u8, u64>, sqlx::Error> {
    let sql = format!(
        "SELECT {PARTITION_SQL} AS partition, count(*) FROM transfers_view \
         WHERE created_at > now() - make_interval(secs => $1) GROUP BY 1"
    );
    rows(pool, &sql, Some(window.as_secs_f64())).await
}

/// The partition of each of `users`, computed by the database (for the test that holds the SQL
/// function to `cells::partition_of`).
pub async fn partitions_of(pool: &PgPool, users: &[i64]) -> Result<Vec<u8>, sqlx::Error> {
    let sql = format!("SELECT {PARTITION_SQL} FROM unnest($1::bigint[]) WITH ORDINALITY AS u(user_id, n) ORDER BY n");
    let got: Vec<i32> = sqlx::query_scalar(&sql).bind(users).fetch_all(pool).await?;
    Ok(got
        .into_iter()
        .map(|p| u8::try_from(p).expect("get_byte answers 0 to 255"))
        .collect())
}

async fn rows(
    pool: &PgPool,
    sql: &str,
    seconds: Option<f64>,
) -> Result<BTreeMap<u8, u64>, sqlx::Error> {
    let mut query = sqlx::query_as::<_, (i32, i64)>(sql);
    if let Some(seconds) = seconds {
        query = query.bind(seconds);
    }
    Ok(query
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|(p, n)| {
            (
                u8::try_from(p).expect("get_byte answers 0 to 255"),
                u64::try_from(n).unwrap_or(0),
            )
        })
        .collect())
}
