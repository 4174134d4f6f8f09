//! Reading the consumer feed: every event once, at a dense position, in an order that never
//! changes. A consumer that has handled everything up to position P asks for `position > P`; it
//! can never miss an event, because positions are handed out when events are appended, under the
//! feed's advisory lock, which the appending transaction holds until it ends: an appender takes
//! positions only after every lower one has committed or been given back (migrations 0013, 0015).
//!
//! The feed's rows and reads are `eventlog::feed`'s (the one crate that knows the event
//! table's stored form); this module keeps the consumers' JSON of an event, one wire shape for
//! the HTTP feed and the relay.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

pub use application::reads::{event_json, FeedEvent, FEED_PAGE_SIZE_MAX};

/// Events after `after`, in order, at most `limit` (bounded by [`FEED_PAGE_SIZE_MAX`]); only one
/// user's when `user_id` is given (`eventlog::feed::read_after`).
pub async fn read_after(
    pool: &PgPool,
    after: i64,
    limit: i64,
    user_id: Option<i64>,
) -> Result<Vec<FeedEvent>, sqlx::Error> {
    eventlog::feed::read_after(pool, after, limit, user_id).await
}

/// The last position handed out (0 when the feed is empty).
pub async fn head(pool: &PgPool) -> Result<i64, sqlx::Error> {
    eventlog::feed::head(pool).await
}

/// One aggregate's events from the feed, in order, up to a position or a time if given.
pub async fn aggregate_events(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
    upto_position: Option<i64>,
    upto_time: Option<DateTime<Utc>>,
) -> Result<Vec<FeedEvent>, sqlx::Error> {
    eventlog::feed::aggregate_events(pool, aggregate_type, aggregate_id, upto_position, upto_time)
        .await
}
