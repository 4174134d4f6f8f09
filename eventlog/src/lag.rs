//! How far a reader of the log is behind its head (the projector, the tamper-evident tree, the
//! relay): each reader's position joined with the feed's head and the age of the first event
//! past it.

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool};

/// The projector's lag: feed positions handed out minus events it applied, and the age in
/// seconds of the first event past what it applied (0 when none). None before the projector's
/// cursor exists.
pub async fn projector_lag(pool: &PgPool) -> Result<Option<(i64, f64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT GREATEST(h.head - c.events_applied, 0) AS positions,
                CASE WHEN h.head > c.events_applied THEN
                    COALESCE((SELECT GREATEST(EXTRACT(EPOCH FROM now() - e.recorded_at), 0)
                              FROM events e WHERE e.feed_position = c.events_applied + 1),
                             0)::float8
                ELSE 0::float8 END AS seconds
         FROM projector_cursor c
         CROSS JOIN (SELECT COALESCE((SELECT position FROM feed_head), 0) AS head) h
         WHERE c.projector = 'main'",
    )
    .fetch_optional(pool)
    .await
}

/// The tamper-evident tree's lag, once a follower has ever signed it (none for a log never
/// kept): the tree's size, the feed's head, and the age in seconds of the first entry not yet
/// in the tree (0 when none).
pub async fn tree_lag(pool: &PgPool) -> Result<Option<(i64, i64, f64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.size, h.position,
                COALESCE((SELECT EXTRACT(EPOCH FROM now() - e.recorded_at)::float8
                          FROM events e WHERE e.feed_position = s.size + 1), 0)
         FROM tlog_state s, feed_head h
         WHERE s.origin IS NOT NULL",
    )
    .fetch_optional(pool)
    .await
}

/// Every relay stream's status and lag: its checkpoint, the feed's head, and the age of the
/// first event past what it relayed. Over the `feed` views; the row type is the caller's
/// (`relay::checkpoint::RelayStatus`, which reads these columns by name).
const RELAY_STATUS: &str = "
    SELECT c.stream, c.position, c.stream_sequence, h.head,
           GREATEST(h.head - c.position, 0) AS lag_positions,
           COALESCE((SELECT GREATEST(EXTRACT(EPOCH FROM now() - f.recorded_at), 0)::float8
                     FROM feed f WHERE f.position = c.position + 1), 0)::float8 AS lag_seconds,
           c.updated_at, c.leader, c.leader_since, c.last_error, c.last_error_at, c.lag_alerts
    FROM relay_checkpoint c
    CROSS JOIN (SELECT COALESCE((SELECT position FROM feed_head), 0) AS head) h";

/// [`RELAY_STATUS`] of every stream, by stream.
pub async fn relay_status<R>(pool: &PgPool) -> Result<Vec<R>, sqlx::Error>
where
    R: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    sqlx::query_as(&format!("{RELAY_STATUS} ORDER BY c.stream"))
        .fetch_all(pool)
        .await
}

/// [`RELAY_STATUS`] of one stream, if it ever ran.
pub async fn relay_status_of<R>(pool: &PgPool, stream: &str) -> Result<Option<R>, sqlx::Error>
where
    R: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    sqlx::query_as(&format!("{RELAY_STATUS} WHERE c.stream = $1"))
        .bind(stream)
        .fetch_optional(pool)
        .await
}
