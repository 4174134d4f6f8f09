//! Reading the consumer feed: every event once, at a dense position, in an order that never
//! changes. A consumer that has handled everything up to position P asks for `position > P`; it
//! can never miss an event, because positions are handed out when events are appended, under the
//! feed's advisory lock, which the appending transaction holds until it ends: an appender takes
//! positions only after every lower one has committed or been given back (migrations 0013, 0015).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

pub use application::reads::{event_json, FeedEvent, FEED_PAGE_SIZE_MAX};

/// Events after `after`, in order, at most `limit` (bounded by [`FEED_PAGE_SIZE_MAX`]); only one
/// user's when `user_id` is given.
///
/// Positions are dense, so the whole feed's page after `after` is exactly the positions up to
/// `after + limit`: a bounded range on the unique index, which no plan can turn into a scan of
/// the log. (`position > $1 ORDER BY position LIMIT $2`, planned on a connection while the log was
/// still small, stayed a sequential scan and sort for that connection's life: 6.9 ms per relay
/// read in `ledger-bench transfers --relay`, a third of PostgreSQL's time.) One user's page is
/// read by `(user_id, feed_position)`.
pub async fn read_after(
    pool: &PgPool,
    after: i64,
    limit: i64,
    user_id: Option<i64>,
) -> Result<Vec<FeedEvent>, sqlx::Error> {
    let after = after.max(0);
    let limit = limit.clamp(0, FEED_PAGE_SIZE_MAX);
    match user_id {
        None => {
            sqlx::query(
                "SELECT * FROM feed WHERE position > $1 AND position <= $2 ORDER BY position",
            )
            .bind(after)
            .bind(after.saturating_add(limit))
            .try_map(crate::rows::feed_event)
            .fetch_all(pool)
            .await
        }
        Some(user) => {
            sqlx::query(
                "SELECT * FROM feed WHERE user_id = $1 AND position > $2
                 ORDER BY position LIMIT $3",
            )
            .bind(user)
            .bind(after)
            .bind(limit)
            .try_map(crate::rows::feed_event)
            .fetch_all(pool)
            .await
        }
    }
}

/// The last position handed out (0 when the feed is empty).
pub async fn head(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT position FROM feed_head")
        .fetch_one(pool)
        .await
}

/// One aggregate's events from the feed, in order, up to a position or a time if given.
pub async fn aggregate_events(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
    upto_position: Option<i64>,
    upto_time: Option<DateTime<Utc>>,
) -> Result<Vec<FeedEvent>, sqlx::Error> {
    sqlx::query(
        "SELECT * FROM feed
         WHERE aggregate_type = $1 AND aggregate_id = $2
           AND ($3::bigint IS NULL OR position <= $3)
           AND ($4::timestamptz IS NULL OR occurred_at <= $4)
         ORDER BY sequence",
    )
    .bind(aggregate_type)
    .bind(aggregate_id)
    .bind(upto_position)
    .bind(upto_time)
    .try_map(crate::rows::feed_event)
    .fetch_all(pool)
    .await
}
