//! How far a reader of the log is behind its head: each reader's position joined with the age
//! of the first event past it.

use sqlx::PgPool;

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
