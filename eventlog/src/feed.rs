//! The consumer feed as stored: the views `feed` (every event at its dense position, with its
//! event id) and `feed_head` over the `events` table (migrations 0013, 0015), and the reads of
//! them. Positions are handed out when events are appended, under the feed's advisory lock,
//! which the appending transaction holds until it ends, so a reader of `position > P` never
//! misses an event. The consumers' JSON of an event is `projections::feed::event_json`.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// The largest page of the feed one read returns.
pub const FEED_PAGE_SIZE_MAX: i64 = 1000;

/// One event as consumers see it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct FeedEvent {
    /// Dense, gap-free, starting at 1.
    pub position: i64,
    /// The de-duplication key: `<aggregate type>:<aggregate id>:<sequence>`.
    pub event_id: String,
    /// The raw position in the event table (not commit-ordered; for tracing only).
    pub global_position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: serde_json::Value,
    pub user_id: Option<i64>,
    pub occurred_at: DateTime<Utc>,
    pub recorded_at: DateTime<Utc>,
}

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
            sqlx::query_as(
                "SELECT * FROM feed WHERE position > $1 AND position <= $2 ORDER BY position",
            )
            .bind(after)
            .bind(after.saturating_add(limit))
            .fetch_all(pool)
            .await
        }
        Some(user) => {
            sqlx::query_as(
                "SELECT * FROM feed WHERE user_id = $1 AND position > $2
                 ORDER BY position LIMIT $3",
            )
            .bind(user)
            .bind(after)
            .bind(limit)
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
    sqlx::query_as(
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
    .fetch_all(pool)
    .await
}

/// One user's events, in feed order, up to a position or a time if given.
pub async fn user_events_upto(
    pool: &PgPool,
    user_id: i64,
    upto_position: Option<i64>,
    upto_time: Option<DateTime<Utc>>,
) -> Result<Vec<FeedEvent>, sqlx::Error> {
    sqlx::query_as(
        "SELECT * FROM feed WHERE user_id = $1
           AND ($2::bigint IS NULL OR position <= $2)
           AND ($3::timestamptz IS NULL OR occurred_at <= $3)
         ORDER BY position",
    )
    .bind(user_id)
    .bind(upto_position)
    .bind(upto_time)
    .fetch_all(pool)
    .await
}

/// The latest domain time of the events up to feed position `position` (none for an empty
/// prefix).
pub async fn time_upto(pool: &PgPool, position: i64) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar::<_, Option<DateTime<Utc>>>(
        "SELECT max(occurred_at) FROM feed WHERE position <= $1",
    )
    .bind(position)
    .fetch_one(pool)
    .await
}
