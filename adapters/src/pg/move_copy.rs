//! The copy of a move (ADR 0023 §5): a partition's state rows ([`copy_state`]: FUNDING accounts
//! and journal, deposits, client keys, daily counters) and its events, read from the source's feed window
//! by window, appended to the target's feed in their order with the target's next positions
//! (dense, under the feed's lock, as every appender takes it), each keeping its key
//! (`aggregate_type`, `aggregate_id`, `sequence`: the event id is the same in both cells) and
//! carrying its origin in its metadata (`origin_cell`, `origin_position`, `origin_move`).
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
    let head = eventlog::feed::head(source).await.map_err(store)?;
    let upto = head.min(mark.saturating_add(window));
    let rows = eventlog::copies::partition_window(source, mark, upto, i32::from(p.get()))
        .await
        .map_err(store)?;
    let mut written = 0;
    if !rows.is_empty() {
        let mut tx = target.begin().await.map_err(store)?;
        if incoming(&mut tx, id, p).await? {
            written = eventlog::copies::append_copies(&mut tx, &rows, i32::from(from.get()), &id.0)
                .await
                .map_err(store)?;
            tx.commit().await.map_err(store)?;
        } else {
            tx.rollback().await.map_err(store)?;
        }
    }
    Ok(CopiedEvents {
        rows: written,
        mark: upto.max(mark),
        at_end: upto >= head,
    })
}

/// What one copy of a partition's state rows did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopiedState {
    /// Rows written or changed in the target.
    pub rows: u64,
    /// The last FUNDING journal id of the source copied: the next copy starts after it.
    pub journal_mark: i64,
    /// Whether the journal's read was a full page: more rows may follow the mark.
    pub journal_more: bool,
}

/// FUNDING journal rows one copy reads at most.
const JOURNAL_PAGE: usize = 20_000;

/// Per table: the source's rows of the partition (as a JSON array; `$1` the partition, `$2` a
/// mark where the table has one), and the target's statement taking them (`$1` the array).
/// FUNDING balances, statuses and the daily counters are state, copied as they are now (the
/// last copy, under the freeze, is exact); the journal, deposits and client keys are records,
/// written once by their own keys. The journal's and deposits' copies name the move
/// (`move_id`): the target's conservation check never counts them row by row (ADR 0023 §5).
const STATE: [(&str, &str); 6] = [
    (
        "SELECT coalesce(json_agg(t), '[]') FROM funding_accounts t WHERE partition = $1",
        "INSERT INTO funding_accounts (user_id, asset, balance, status, created_at, updated_at)
         SELECT user_id, asset, balance, status, created_at, updated_at
         FROM jsonb_populate_recordset(NULL::funding_accounts, $1)
         ON CONFLICT (user_id, asset) DO UPDATE SET balance = EXCLUDED.balance,
             status = EXCLUDED.status, updated_at = EXCLUDED.updated_at
         WHERE (funding_accounts.balance, funding_accounts.status)
               IS DISTINCT FROM (EXCLUDED.balance, EXCLUDED.status)",
    ),
    (
        "SELECT coalesce(json_agg(t ORDER BY id), '[]') FROM (SELECT * FROM funding_journal
         WHERE id > $2 AND user_partition(user_id) = $1 ORDER BY id LIMIT 20000) t",
        "INSERT INTO funding_journal (req_id, operation, user_id, asset, amount, outcome, code,
                                      created_at, move_id)
         SELECT req_id, operation, user_id, asset, amount, outcome, code, created_at,
                current_setting('ledger.move_copy')
         FROM jsonb_populate_recordset(NULL::funding_journal, $1) ORDER BY id
         ON CONFLICT (req_id, operation) DO NOTHING",
    ),
    (
        "SELECT coalesce(json_agg(t), '[]') FROM external_deposits t WHERE user_partition(user_id) = $1",
        "INSERT INTO external_deposits (external_id, user_id, asset, amount, created_at, move_id)
         SELECT external_id, user_id, asset, amount, created_at,
                current_setting('ledger.move_copy')
         FROM jsonb_populate_recordset(NULL::external_deposits, $1)
         ON CONFLICT (external_id) DO NOTHING",
    ),
    (
        "SELECT coalesce(json_agg(t), '[]') FROM transfer_cids t WHERE user_partition(user_id) = $1",
        "INSERT INTO transfer_cids (user_id, cid, req_id, fingerprint, created_at)
         SELECT user_id, cid, req_id, fingerprint, created_at
         FROM jsonb_populate_recordset(NULL::transfer_cids, $1)
         ON CONFLICT DO NOTHING",
    ),
    (
        "SELECT coalesce(json_agg(t), '[]') FROM daily_transfer_counts t WHERE user_partition(user_id) = $1",
        "INSERT INTO daily_transfer_counts (user_id, day, count)
         SELECT user_id, day, count FROM jsonb_populate_recordset(NULL::daily_transfer_counts, $1)
         ON CONFLICT (user_id, day) DO UPDATE SET count = EXCLUDED.count
         WHERE daily_transfer_counts.count <> EXCLUDED.count",
    ),
    (
        "SELECT coalesce(json_agg(t), '[]') FROM daily_transfer_amounts t WHERE user_partition(user_id) = $1",
        "INSERT INTO daily_transfer_amounts (user_id, day, asset, amount)
         SELECT user_id, day, asset, amount
         FROM jsonb_populate_recordset(NULL::daily_transfer_amounts, $1)
         ON CONFLICT (user_id, day, asset) DO UPDATE SET amount = EXCLUDED.amount
         WHERE daily_transfer_amounts.amount <> EXCLUDED.amount",
    ),
];

/// Copies partition `p`'s state rows from `source` into `target` for move `id`: FUNDING accounts
/// and journal (after `journal_mark`), deposits, client keys and daily counters. Nothing is
/// written unless the target's partition is INCOMING for this move. Each table is read in a
/// pass over its rows (the journal from its mark), written in one transaction of the target.
pub async fn copy_state(
    source: &PgPool,
    target: &PgPool,
    id: &MoveId,
    p: Partition,
    journal_mark: i64,
) -> Result<CopiedState, StoreError> {
    let mut rows = Vec::with_capacity(STATE.len());
    for (read, _) in STATE {
        let query = sqlx::query_scalar::<_, serde_json::Value>(read).bind(i32::from(p.get()));
        let query = if read.contains("$2") {
            query.bind(journal_mark)
        } else {
            query
        };
        rows.push(query.fetch_one(source).await.map_err(store)?);
    }
    let journal_more = rows[1]
        .as_array()
        .is_some_and(|journal| journal.len() >= JOURNAL_PAGE);
    let next_mark = rows[1]
        .as_array()
        .and_then(|journal| journal.last())
        .and_then(|last| last.get("id"))
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(journal_mark);
    let mut tx = target.begin().await.map_err(store)?;
    if !incoming(&mut tx, id, p).await? {
        tx.rollback().await.map_err(store)?;
        return Ok(CopiedState {
            rows: 0,
            journal_mark,
            journal_more: false,
        });
    }
    let mut written = 0;
    for ((_, write), json) in STATE.iter().zip(rows) {
        written += sqlx::query(write)
            .bind(json)
            .execute(&mut *tx)
            .await
            .map_err(store)?
            .rows_affected();
    }
    tx.commit().await.map_err(store)?;
    Ok(CopiedState {
        rows: written,
        journal_mark: next_mark,
        journal_more,
    })
}

/// Whether the target's partition is INCOMING for move `id` (its row share-locked, so a void
/// waits for this transaction), and if so the fence lets this transaction's writes through.
async fn incoming(
    tx: &mut sqlx::PgConnection,
    id: &MoveId,
    p: Partition,
) -> Result<bool, StoreError> {
    let incoming: Option<String> = sqlx::query_scalar(
        "SELECT move_id FROM cell_partitions WHERE partition = $1 AND state = 'INCOMING' FOR SHARE",
    )
    .bind(i16::from(p.get()))
    .fetch_optional(&mut *tx)
    .await
    .map_err(store)?;
    if incoming.as_deref() != Some(id.0.as_str()) {
        return Ok(false);
    }
    sqlx::query("SELECT set_config('ledger.move_copy', $1, true)")
        .bind(&id.0)
        .execute(&mut *tx)
        .await
        .map_err(store)?;
    Ok(true)
}
