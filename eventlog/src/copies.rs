//! A partition move's copy of events (ADR 0023 §5): the source's events of one partition's
//! users, read window by window of feed positions, and their append to the target's feed with
//! the target's next dense positions under the feed's lock, each keeping its key and its
//! payload's text and carrying its origin in its metadata (`origin_cell`, `origin_position`, `origin_move`; never part of the log's leaf). The
//! caller (`adapters::pg::move_copy`) holds the target's transaction and its INCOMING check.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

/// An event as the copy reads it: key, type, version, payload text, metadata, owner, domain
/// time and its position in the source's feed.
pub type Copied = (
    String,
    String,
    i64,
    String,
    String,
    String,
    serde_json::Value,
    i64,
    DateTime<Utc>,
    i64,
);

/// The events of partition `partition`'s users at source feed positions in `(mark, upto]`, in
/// feed order.
pub async fn partition_window(
    pool: &PgPool,
    mark: i64,
    upto: i64,
    partition: i32,
) -> Result<Vec<Copied>, sqlx::Error> {
    sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, sequence, event_type, event_version,
                payload::text, metadata::jsonb, user_id, occurred_at, feed_position
         FROM events
         WHERE feed_position > $1 AND feed_position <= $2
           AND user_id IS NOT NULL AND user_partition(user_id) = $3
         ORDER BY feed_position",
    )
    .bind(mark)
    .bind(upto)
    .bind(partition)
    .fetch_all(pool)
    .await
}

/// Appends `rows` to the target's feed in their order, skipping keys it holds, each with its
/// origin in its metadata: `origin_cell`, `origin_position` and `origin_move`, as strings (an
/// event's metadata is a flat map of strings to the aggregate's store); answers how many it
/// wrote.
pub async fn append_copies(
    conn: &mut PgConnection,
    rows: &[Copied],
    from_cell: i32,
    move_id: &str,
) -> Result<u64, sqlx::Error> {
    fn column<T>(rows: &[Copied], f: impl Fn(&Copied) -> T) -> Vec<T> {
        rows.iter().map(f).collect()
    }
    Ok(sqlx::query(
        "WITH src AS (
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[],
                                  $6::text[], $7::jsonb[], $8::bigint[], $9::timestamptz[],
                                  $10::bigint[])
                 WITH ORDINALITY AS u(t, id, seq, et, v, p, m, owner, at, origin, n)),
              fresh AS MATERIALIZED (
             SELECT src.*, row_number() OVER (ORDER BY n) AS k FROM src
             WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.aggregate_type = src.t
                                  AND e.aggregate_id = src.id AND e.sequence = src.seq)),
              head AS MATERIALIZED (SELECT feed_take() AS before WHERE EXISTS (SELECT 1 FROM fresh))
         INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version,
                             payload, metadata, user_id, occurred_at, feed_position)
         SELECT f.t, f.id, f.seq, f.et, f.v, f.p::json,
                (f.m || jsonb_build_object('origin_cell', $11::int::text,
                    'origin_position', f.origin::text, 'origin_move', $12::text))::json,
                f.owner, f.at, head.before + f.k
         FROM fresh f, head ORDER BY f.k",
    )
    .bind(column(rows, |r| r.0.clone()))
    .bind(column(rows, |r| r.1.clone()))
    .bind(column(rows, |r| r.2))
    .bind(column(rows, |r| r.3.clone()))
    .bind(column(rows, |r| r.4.clone()))
    .bind(column(rows, |r| r.5.clone()))
    .bind(column(rows, |r| r.6.clone()))
    .bind(column(rows, |r| r.7))
    .bind(column(rows, |r| r.8))
    .bind(column(rows, |r| r.9))
    .bind(from_cell)
    .bind(move_id)
    .execute(conn)
    .await?
    .rows_affected())
}

/// Per user of `users`, a fingerprint of their history at feed positions in `(after, upto]`:
/// every event's key and type, in feed order (md5 of the list). Equal fingerprints in two cells
/// mean the same events in the same order (ADR 0023 §4: the check before the switch). A user
/// with no event in the range is not answered. Read down `events_user_feed_position`, so a
/// range after a cut reads only the events after it.
pub async fn history_fingerprints(
    pool: &PgPool,
    users: &[i64],
    after: i64,
    upto: i64,
) -> Result<Vec<(i64, String)>, sqlx::Error> {
    // One index range per user (`events_user_feed_position`), whatever the planner's statistics
    // say: with `user_id = ANY(..)` a database without them read far more than the tail (a
    // move's pause at 1M events, docs/perf-log.md). A user with no event in the range has no row.
    sqlx::query_as(
        "SELECT u.user_id, f.fingerprint
         FROM unnest($1::bigint[]) AS u(user_id)
         CROSS JOIN LATERAL (
             SELECT md5(string_agg(e.aggregate_type || ':' || e.aggregate_id || ':' || e.sequence
                                   || ':' || e.event_type, ';' ORDER BY e.feed_position))
                        AS fingerprint
             FROM events e
             WHERE e.user_id = u.user_id AND e.feed_position > $2 AND e.feed_position <= $3
         ) f
         WHERE f.fingerprint IS NOT NULL",
    )
    .bind(users)
    .bind(after)
    .bind(upto)
    .fetch_all(pool)
    .await
}

/// Money in flight per user and asset of `partition`'s open transfers (the sum as decimal
/// text): the amount of each transfer whose state holds it between the two systems.
pub async fn partition_in_flight(
    pool: &PgPool,
    partition: i32,
) -> Result<Vec<(i64, String, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT c.user_id, c.payload -> 'TransferCreated' ->> 'asset',
                sum((c.payload -> 'TransferCreated' ->> 'amount')::numeric)::text
         FROM open_transfers o
         JOIN events c ON c.aggregate_type = 'Transfer' AND c.aggregate_id = o.req_id
                      AND c.sequence = 1
         WHERE user_partition(c.user_id) = $1
           AND o.state IN ('SOURCE_DONE', 'TARGET_PENDING', 'COMPENSATING')
         GROUP BY 1, 2",
    )
    .bind(partition)
    .fetch_all(pool)
    .await
}

/// Appends `PartitionMoved` (aggregate `Partition`, id the move's, sequence 1) with `payload` to
/// the feed at the next position, once: a second call finds it and writes nothing. Answers its
/// feed position.
pub async fn append_partition_moved(
    conn: &mut PgConnection,
    move_id: &str,
    payload: &serde_json::Value,
) -> Result<i64, sqlx::Error> {
    append_map_fact(conn, ("Partition", move_id, "PartitionMoved"), payload).await
}

/// Appends `CellAdded` (aggregate `Cell`, id the added cell's, sequence 1; ADR 0023 §6) with
/// `payload` to the feed at the next position, once. Answers its feed position.
pub async fn append_cell_added(
    conn: &mut PgConnection,
    cell: u16,
    payload: &serde_json::Value,
) -> Result<i64, sqlx::Error> {
    append_map_fact(conn, ("Cell", &cell.to_string(), "CellAdded"), payload).await
}

/// One fact of the map (`(aggregate type, aggregate id, event type)`, sequence 1, no user),
/// appended once.
async fn append_map_fact(
    conn: &mut PgConnection,
    (aggregate_type, aggregate_id, event_type): (&str, &str, &str),
    payload: &serde_json::Value,
) -> Result<i64, sqlx::Error> {
    sqlx::query(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version,
                             payload, metadata, user_id, occurred_at, feed_position)
         SELECT $1, $2, 1, $3, '1', $4::json, '{}'::json, NULL, now(), feed_take() + 1
         WHERE NOT EXISTS (SELECT 1 FROM events WHERE aggregate_type = $1
                              AND aggregate_id = $2 AND sequence = 1)",
    )
    .bind(aggregate_type)
    .bind(aggregate_id)
    .bind(event_type)
    .bind(payload)
    .execute(&mut *conn)
    .await?;
    sqlx::query_scalar(
        "SELECT feed_position FROM events
         WHERE aggregate_type = $1 AND aggregate_id = $2 AND sequence = 1",
    )
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_one(conn)
    .await
}

/// Forgets the open transfers that move `move_id` copied in (a void move's leftovers): the
/// cell's recovery never drives them (not its partition), and an open transfer left behind
/// would hold its idempotency horizon back for good. A later move of the partition copies their
/// later events again. Answers how many it forgot.
pub async fn forget_open_copies(pool: &PgPool, move_id: &str) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM open_transfers o
         WHERE EXISTS (SELECT 1 FROM events c
                       WHERE c.aggregate_type = 'Transfer' AND c.aggregate_id = o.req_id
                         AND c.sequence = 1 AND c.metadata::jsonb ->> 'origin_move' = $1)",
    )
    .bind(move_id)
    .execute(pool)
    .await?
    .rows_affected())
}

/// How many events of partition `partition`'s users this cell's feed holds (copies included):
/// a full read of the feed, for tools that size a partition's history (`ledger-bench move`).
pub async fn partition_event_count(pool: &PgPool, partition: i32) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE user_id IS NOT NULL AND user_partition(user_id) = $1",
    )
    .bind(partition)
    .fetch_one(pool)
    .await
}
