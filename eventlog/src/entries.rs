//! The log by feed position, as the tamper-evident log reads it: an entry's fields by one
//! expression list (the follower's COPY, the routes' entry, `verify`'s COPY), a transfer's
//! entries and positions for receipts, and the external deposits held to their entries. The
//! domain time is the database's text of it in UTC, the payload the stored JSON text.

use std::collections::HashMap;

use sqlx::{PgConnection, PgPool};

/// The columns of an entry, in [`EntryRow`]'s order, over `events e`. The COPY forms send
/// these fields in this order.
const ENTRY_COLUMNS: &str = "e.feed_position AS position, e.aggregate_type, \
     e.aggregate_id, e.sequence, e.event_type, e.event_version, \
     (e.occurred_at AT TIME ZONE 'UTC')::text AS occurred_at, \
     e.user_id, e.payload::text AS payload";

/// One entry of the log, owned, as stored (`occurred_at` is the database's text of the time in
/// UTC, not yet the leaf's form).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EntryRow {
    pub position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub occurred_at: String,
    pub user_id: Option<i64>,
    pub payload: String,
}

/// The entry at feed `position`, if the log has one.
pub async fn entry_at(pool: &PgPool, position: i64) -> Result<Option<EntryRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {ENTRY_COLUMNS} FROM events e WHERE e.feed_position = $1"
    ))
    .bind(position)
    .fetch_optional(pool)
    .await
}

/// The statement streaming (COPY's text format, [`EntryRow`]'s fields) the entries after feed
/// position `after`, at most `batch_max` of them, whose transactions are below the commit
/// watermark, in feed order. COPY takes no parameters; both values are integers.
pub fn copy_settled_after(after: i64, batch_max: i64) -> String {
    format!(
        "COPY (SELECT {ENTRY_COLUMNS}
               FROM events e
               WHERE e.feed_position > {after} AND e.feed_position <= {after} + {batch_max}
                 AND e.tx_id < pg_snapshot_xmin(pg_current_snapshot())
               ORDER BY e.feed_position) TO STDOUT"
    )
}

/// The statement streaming every entry in feed order (COPY's text format, [`EntryRow`]'s
/// fields), each followed by one more column, `extra`: an expression over the entry's row `e`
/// (`verify` adds the tree's tiles that start at it).
pub fn copy_all_with(extra: &str) -> String {
    format!(
        "COPY (SELECT {ENTRY_COLUMNS},
                      {extra}
               FROM events e ORDER BY e.feed_position) TO STDOUT"
    )
}

/// One event of a transfer as a receipt names it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ReceiptEntry {
    pub position: i64,
    pub sequence: i64,
    pub event_type: String,
    pub user_id: Option<i64>,
}

/// A transfer's events with their feed positions, in sequence order (empty for an unknown
/// req_id).
pub async fn transfer_entries(
    pool: &PgPool,
    req_id: &str,
) -> Result<Vec<ReceiptEntry>, sqlx::Error> {
    sqlx::query_as(
        "SELECT feed_position AS position, sequence, event_type, user_id FROM events
         WHERE aggregate_type = 'Transfer' AND aggregate_id = $1 ORDER BY sequence",
    )
    .bind(req_id)
    .fetch_all(pool)
    .await
}

/// The feed positions of the events of each transfer in `req_ids`, in sequence order, by
/// req_id (a req_id without events is absent), in one query.
pub async fn transfer_positions<'c>(
    db: impl sqlx::PgExecutor<'c>,
    req_ids: &[String],
) -> Result<HashMap<String, Vec<i64>>, sqlx::Error> {
    let rows: Vec<(String, Vec<i64>)> = sqlx::query_as(
        "SELECT aggregate_id, array_agg(feed_position ORDER BY sequence) FROM events
         WHERE aggregate_type = 'Transfer' AND aggregate_id = ANY($1)
         GROUP BY aggregate_id",
    )
    .bind(req_ids)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().collect())
}

/// The first deposit row and entry that do not match, in feed position order (rows without an
/// entry after every entry, by external_id). The payload is read with `json`'s operators, which
/// never fail on a payload of another shape (they answer null); an amount that is not a plain
/// decimal compares as null, so it differs from every row's.
const FIRST_UNMATCHED: &str = r#"
SELECT e.feed_position, COALESCE(e.aggregate_id, d.external_id),
       e.user_id, e.body ->> 'external_id', e.body ->> 'asset', e.body ->> 'amount',
       d.external_id IS NOT NULL, d.user_id, d.asset, trim_scale(d.amount)::text
FROM (SELECT feed_position, aggregate_id, user_id, payload -> 'ExternalDeposited' AS body
      FROM events WHERE aggregate_type = 'Deposit') e
     FULL JOIN external_deposits d ON d.external_id = e.aggregate_id
WHERE e.aggregate_id IS NULL OR d.external_id IS NULL
   OR e.user_id IS DISTINCT FROM d.user_id
   OR e.body ->> 'external_id' IS DISTINCT FROM d.external_id
   OR e.body ->> 'asset' IS DISTINCT FROM d.asset
   OR CASE WHEN e.body ->> 'amount' ~ '^[0-9]{1,20}(\.[0-9]{1,18})?$'
           THEN (e.body ->> 'amount')::numeric END IS DISTINCT FROM d.amount
ORDER BY e.feed_position NULLS LAST, d.external_id COLLATE "C"
LIMIT 1"#;

/// One unmatched pair: the entry's side (position, external_id, user, and the external_id,
/// asset and amount its payload names) and the row's (whether there is one, its user, asset
/// and amount).
pub type UnmatchedDeposit = (
    Option<i64>,
    String,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    bool,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// The first `external_deposits` row and `Deposit` entry that do not match, in the caller's
/// snapshot; none when every row has its entry and every entry its row.
pub async fn first_unmatched_deposit(
    conn: &mut PgConnection,
) -> Result<Option<UnmatchedDeposit>, sqlx::Error> {
    sqlx::query_as(FIRST_UNMATCHED).fetch_optional(conn).await
}
