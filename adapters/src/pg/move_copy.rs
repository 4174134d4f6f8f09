//! The copy of a move (ADR 0023 §5): a partition's events, read from the source's feed window
//! by window, appended to the target's feed in their order with the target's next positions
//! (dense, under the feed's lock, as every appender takes it), each keeping its key
//! (`aggregate_type`, `aggregate_id`, `sequence`: the event id is the same in both cells) and
//! carrying its origin in its metadata (`origin: {cell, position, move}`).
//!
//! The mark is a source feed position: each call reads the positions after it, up to a window,
//! so the whole history is read once while the partition is live and each later pass reads only
//! what was appended since (no index on the partition is needed). The copy is idempotent: an
//! event whose key the target holds is skipped, and numbered positions go only to the rest. It
//! writes only while the target's partition is INCOMING for this move (read under a share lock
//! of its row, so a void waits for a copy in flight), under `ledger.move_copy`, which the fence
//! lets through for that move alone.

use application::moves::MoveId;
use application::StoreError;
use cells::{CellId, Partition};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::driver::store;

/// What one window's copy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopiedEvents {
    /// Events written into the target (those it held already are not counted).
    pub rows: u64,
    /// The source feed position read up to: the next window starts after it.
    pub mark: i64,
    /// Whether the mark reached the source's head when it was read.
    pub at_end: bool,
}

/// An event as read from the source; its payload as stored, text for text (a `json` column
/// keeps its text, and a copy must not reformat what the source's log hashed).
type Row = (
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

/// Copies the events of partition `p`'s users from `source` (cell `from`) after feed position
/// `mark`, up to `window` positions, into `target` for move `id`.
pub async fn copy_events(
    source: &PgPool,
    target: &PgPool,
    id: &MoveId,
    p: Partition,
    from: CellId,
    mark: i64,
    window: i64,
) -> Result<CopiedEvents, StoreError> {
    let head: i64 = sqlx::query_scalar("SELECT position FROM feed_head")
        .fetch_one(source)
        .await
        .map_err(store)?;
    let upto = head.min(mark.saturating_add(window));
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, sequence, event_type, event_version,
                payload::text, metadata::jsonb, user_id, occurred_at, feed_position
         FROM events
         WHERE feed_position > $1 AND feed_position <= $2
           AND user_id IS NOT NULL AND user_partition(user_id) = $3
         ORDER BY feed_position",
    )
    .bind(mark)
    .bind(upto)
    .bind(i32::from(p.get()))
    .fetch_all(source)
    .await
    .map_err(store)?;
    let written = append(target, id, p, from, &rows).await?;
    Ok(CopiedEvents {
        rows: written,
        mark: upto.max(mark),
        at_end: upto >= head,
    })
}

/// Appends `rows` to the target's feed for move `id`, skipping keys it holds; nothing when the
/// partition is not INCOMING for this move there.
async fn append(
    target: &PgPool,
    id: &MoveId,
    p: Partition,
    from: CellId,
    rows: &[Row],
) -> Result<u64, StoreError> {
    let mut tx = target.begin().await.map_err(store)?;
    let incoming: Option<String> = sqlx::query_scalar(
        "SELECT move_id FROM cell_partitions WHERE partition = $1 AND state = 'INCOMING' FOR SHARE",
    )
    .bind(i16::from(p.get()))
    .fetch_optional(&mut *tx)
    .await
    .map_err(store)?;
    if incoming.as_deref() != Some(id.0.as_str()) || rows.is_empty() {
        tx.rollback().await.map_err(store)?;
        return Ok(0);
    }
    sqlx::query("SELECT set_config('ledger.move_copy', $1, true)")
        .bind(&id.0)
        .execute(&mut *tx)
        .await
        .map_err(store)?;
    let column = |f: fn(&Row) -> String| rows.iter().map(f).collect::<Vec<_>>();
    let written = sqlx::query(
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
                (f.m || jsonb_build_object('origin', jsonb_build_object(
                    'cell', $11::int, 'position', f.origin, 'move', $12::text)))::json,
                f.owner, f.at, head.before + f.k
         FROM fresh f, head ORDER BY f.k",
    )
    .bind(column(|r| r.0.clone()))
    .bind(column(|r| r.1.clone()))
    .bind(rows.iter().map(|r| r.2).collect::<Vec<_>>())
    .bind(column(|r| r.3.clone()))
    .bind(column(|r| r.4.clone()))
    .bind(column(|r| r.5.clone()))
    .bind(rows.iter().map(|r| r.6.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.7).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.8).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.9).collect::<Vec<_>>())
    .bind(i32::from(from.get()))
    .bind(&id.0)
    .execute(&mut *tx)
    .await
    .map_err(store)?
    .rows_affected();
    tx.commit().await.map_err(store)?;
    Ok(written)
}
