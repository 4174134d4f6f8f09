//! The consumer feed as stored: the views `feed` (every event at its dense position, with its
//! event id) and `feed_head` over the `events` table (migrations 0013, 0015), and the reads of
//! them. Positions are handed out when events are appended, under the feed's advisory lock,
//! which the appending transaction holds until it ends, so a reader of `position > P` never
//! misses an event. The consumers' JSON of an event is `application::reads::event_json`.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

pub use application::reads::{EventOrigin, FeedEvent, FEED_PAGE_SIZE_MAX};

/// A `feed` row (`SELECT *`) read by hand into the core's [`FeedEvent`], which names no driver.
struct FeedRow(FeedEvent);

impl<'r> sqlx::FromRow<'r, PgRow> for FeedRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self(FeedEvent {
            position: row.try_get("position")?,
            event_id: row.try_get("event_id")?,
            global_position: row.try_get("global_position")?,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            sequence: row.try_get("sequence")?,
            event_type: row.try_get("event_type")?,
            event_version: row.try_get("event_version")?,
            payload: row.try_get("payload")?,
            user_id: row.try_get("user_id")?,
            occurred_at: row.try_get("occurred_at")?,
            recorded_at: row.try_get("recorded_at")?,
            origin: match (
                row.try_get::<Option<i64>, _>("origin_cell")?,
                row.try_get::<Option<i64>, _>("origin_position")?,
                row.try_get::<Option<String>, _>("origin_move")?,
            ) {
                (Some(cell), Some(position), Some(move_id)) => Some(EventOrigin {
                    cell,
                    position,
                    move_id,
                }),
                _ => None,
            },
        }))
    }
}

fn events(rows: Vec<FeedRow>) -> Vec<FeedEvent> {
    rows.into_iter().map(|r| r.0).collect()
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
        None => sqlx::query_as::<_, FeedRow>(
            "SELECT * FROM feed WHERE position > $1 AND position <= $2 ORDER BY position",
        )
        .bind(after)
        .bind(after.saturating_add(limit))
        .fetch_all(pool)
        .await
        .map(events),
        Some(user) => sqlx::query_as::<_, FeedRow>(
            "SELECT * FROM feed WHERE user_id = $1 AND position > $2
                 ORDER BY position LIMIT $3",
        )
        .bind(user)
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await
        .map(events),
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
    sqlx::query_as::<_, FeedRow>(
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
    .map(events)
}

/// One user's events, in feed order, up to a position or a time if given.
pub async fn user_events_upto(
    pool: &PgPool,
    user_id: i64,
    upto_position: Option<i64>,
    upto_time: Option<DateTime<Utc>>,
) -> Result<Vec<FeedEvent>, sqlx::Error> {
    sqlx::query_as::<_, FeedRow>(
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
    .map(events)
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
