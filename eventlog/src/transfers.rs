//! One transfer's events, read by key: the raw read of its events, its first trace, whether it
//! has any, the conservation check's read of many transfers' first and last events, and the
//! stuck listing's join of open transfers with their creations.

use futures_util::{Stream, TryStreamExt};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, PgPool};

/// One stored event of a transfer, its payload parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferEventRow {
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: Value,
    /// The raw position in the event table (not commit-ordered; for tracing only).
    pub global_position: i64,
}

/// One transfer's events, in order, from the event log itself (not the feed: events above the
/// projector's commit watermark are included).
pub async fn transfer_events(
    pool: &PgPool,
    req_id: &str,
) -> Result<Vec<TransferEventRow>, sqlx::Error> {
    let rows: Vec<(i64, String, String, Value, i64)> = sqlx::query_as(
        "SELECT sequence, event_type, event_version, payload::jsonb, global_position
         FROM events WHERE aggregate_type = 'Transfer' AND aggregate_id = $1
         ORDER BY sequence",
    )
    .bind(req_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(sequence, event_type, event_version, payload, global_position)| TransferEventRow {
                sequence,
                event_type,
                event_version,
                payload,
                global_position,
            },
        )
        .collect())
}

/// The transfer's first trace (a W3C traceparent), if any: kept in its creation's metadata
/// under [`crate::TRACE_METADATA_KEY`]; transfers created by earlier versions kept it in
/// `transfer_traces`, which this reads as well.
pub async fn first_trace(pool: &PgPool, req_id: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(
             (SELECT metadata->>'traceparent' FROM events
              WHERE aggregate_type = 'Transfer' AND aggregate_id = $1 AND sequence = 1),
             (SELECT traceparent FROM transfer_traces WHERE req_id = $1))",
    )
    .bind(req_id)
    .fetch_one(pool)
    .await
}

/// Whether the transfer `req_id` has any event (it was created), in the caller's transaction.
pub async fn transfer_has_events(
    conn: &mut PgConnection,
    req_id: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM events
                        WHERE aggregate_type = 'Transfer' AND aggregate_id = $1)",
    )
    .bind(req_id)
    .fetch_one(conn)
    .await
}

/// A transfer as the conservation check reads it: its first event (the creation) with the
/// transaction that wrote it, and its last event, both payloads parsed, not decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRow {
    pub req_id: String,
    pub created: Value,
    pub created_version: String,
    /// The creating transaction's id (`xid8`, as a number).
    pub created_tx: i64,
    pub last: Value,
    pub last_version: String,
}

/// Every transfer with an event whose transaction id is at or above `since` (0: every transfer)
/// or whose req_id is in `ids`, each read by key, streamed on `conn` (the caller's snapshot).
/// Events a partition move copied in (an `origin_move` in their metadata) are not this cell's work:
/// the move brings their partition's totals in at its switch (ADR 0023 §5).
/// Its cost follows the events after `since` plus `ids`, not the log's length.
pub fn audit_transfers<'c>(
    conn: &'c mut PgConnection,
    since: u64,
    ids: &'c [String],
) -> impl Stream<Item = Result<AuditRow, sqlx::Error>> + Send + Unpin + 'c {
    // The ids come from the (tx_id, global_position) index (no condition on the aggregate type
    // there: the primary key's would tempt the planner into reading every transfer's events);
    // each transfer's first and last events are then read by key, which drops other aggregates.
    // Both lookups are LATERAL with a LIMIT, which the planner cannot turn into a join against
    // every transfer's first event (a hash join over the whole log, as a plain join was planned
    // at 100k transfers).
    let rows = sqlx::query_as::<_, (String, Value, String, i64, Value, String)>(
        "WITH ids AS (
             SELECT aggregate_id FROM events
             WHERE tx_id >= $1::text::xid8 AND NOT (metadata::jsonb ? 'origin_move')
             UNION
             SELECT unnest($2::text[])
         )
         SELECT ids.aggregate_id, c.payload::jsonb, c.event_version, c.tx_id::text::bigint,
                l.payload::jsonb, l.event_version
         FROM ids
         CROSS JOIN LATERAL (
             SELECT e.payload, e.event_version, e.tx_id FROM events e
             WHERE e.aggregate_type = 'Transfer' AND e.aggregate_id = ids.aggregate_id
             ORDER BY e.sequence LIMIT 1
         ) c
         CROSS JOIN LATERAL (
             SELECT e.payload, e.event_version FROM events e
             WHERE e.aggregate_type = 'Transfer' AND e.aggregate_id = ids.aggregate_id
             ORDER BY e.sequence DESC LIMIT 1
         ) l",
    )
    .bind(since.to_string())
    .bind(ids)
    .fetch(conn);
    rows.map_ok(
        |(req_id, created, created_version, created_tx, last, last_version)| AuditRow {
            req_id,
            created,
            created_version,
            created_tx,
            last,
            last_version,
        },
    )
}

/// Open transfers unchanged for at least `older_than_ms`, oldest first, at most `limit`, with
/// their retry records and what their `TransferCreated` says (null where it cannot be read).
/// The row type is the caller's (`recovery::stuck::StuckTransfer`): it reads these columns by
/// name: req_id, user_id, from_account, to_account, asset, amount, state, status, updated_at,
/// age_ms, attempts, refund_failures, last_error_category, last_attempt_at, next_retry_at,
/// lease_owner, lease_until.
pub async fn stuck_transfers<R>(
    pool: &PgPool,
    older_than_ms: i64,
    limit: i64,
) -> Result<Vec<R>, sqlx::Error>
where
    R: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    sqlx::query_as(
        "SELECT o.req_id,
                (c.payload -> 'TransferCreated' ->> 'user_id')::bigint AS user_id,
                c.payload -> 'TransferCreated' ->> 'from' AS from_account,
                c.payload -> 'TransferCreated' ->> 'to' AS to_account,
                c.payload -> 'TransferCreated' ->> 'asset' AS asset,
                (c.payload -> 'TransferCreated' ->> 'amount')::numeric AS amount,
                o.state,
                CASE WHEN o.state = 'COMPENSATING' AND r.last_error_category = 'REFUSED_BY_TARGET'
                     THEN 'REFUND_REFUSED' ELSE 'RETRYING' END AS status,
                o.recorded_at AS updated_at,
                (EXTRACT(EPOCH FROM (now() - o.recorded_at)) * 1000)::bigint AS age_ms,
                COALESCE(r.attempts, 0) AS attempts,
                COALESCE(r.refund_failures, 0) AS refund_failures,
                r.last_error_category, r.last_attempt_at, r.next_retry_at, r.lease_owner,
                r.lease_until
         FROM open_transfers o
         LEFT JOIN transfer_retries r USING (req_id)
         LEFT JOIN events c ON c.aggregate_type = 'Transfer' AND c.aggregate_id = o.req_id
                           AND c.event_type = 'TransferCreated'
         WHERE o.recorded_at <= now() - $1 * interval '1 millisecond'
         ORDER BY o.recorded_at LIMIT $2",
    )
    .bind(older_than_ms)
    .bind(limit)
    .fetch_all(pool)
    .await
}
