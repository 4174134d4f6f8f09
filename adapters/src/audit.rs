//! What the conservation check reads from each account system: its live totals and the
//! movements it applied after a position, keyed by req_id. The funding ledger answers from one
//! consistent PostgreSQL snapshot (`FundingLedger::audit_read`), spot-core from its journal and
//! totals (`SpotAdapter::audit_read`); the conservation check itself, and its checkpoint, are the
//! application's (`application::audit`).
//!
//! Rows are handed to a sink one by one as they stream in, so a full check from zero holds no
//! list of every record (there is no record count past which it refuses to run).

pub use application::books::{FundingItem, FundingRead, SpotRead, SpotReadError};

/// The snapshot watermark of the calling transaction's snapshot (run it as the first statement of a
/// REPEATABLE READ transaction, so that it is the transaction's snapshot): a transaction id H
/// such that every transaction below H that could have written to this database had ended when
/// the snapshot was taken, so every committed row with `tx_id < H` is visible in it, and no row
/// with `tx_id < H` can ever commit later. Any transaction starting later gets an id at or
/// above the snapshot's `xmax`.
///
/// `pg_snapshot_xmin` alone is such an H, but it is cluster-wide: one long transaction in
/// another database on the same server (a bulk load, a benchmark) would hold it back, and the
/// incremental check would read everything after it again at every run. So the in-progress
/// transactions of the snapshot (`pg_snapshot_xip`) that provably belong to another database
/// are skipped: a backend is connected to one database for life, and a transaction listed in
/// `pg_stat_activity` with that id (its 32 low bits; running transactions are never 2^31 ids
/// apart) under another database cannot write here. Anything not proven foreign (ended since,
/// a prepared transaction, a subtransaction id, a session whose details are hidden from this
/// role) bounds H, as with `pg_snapshot_xmin`.
///
/// Because a transaction proven foreign at one run may be hidden at the next (a role without
/// `pg_read_all_stats`), H could step back below the previous run's; callers take the larger of
/// H and the position they read from: every row below that position was consumed before.
pub(crate) const SNAPSHOT_WATERMARK_SQL: &str = "
    SELECT LEAST(
        pg_snapshot_xmax(q.s),
        (SELECT min(x) FROM pg_snapshot_xip(q.s) AS x
         WHERE NOT EXISTS (
             SELECT 1 FROM pg_stat_activity a
             WHERE a.backend_xid IS NOT NULL AND a.datid IS NOT NULL
               AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database())
               AND a.backend_xid::text::bigint = x::text::bigint % 4294967296))
    )::text::bigint
    FROM (SELECT pg_current_snapshot() AS s) AS q";

/// Makes the rest of an incremental check's transaction read by index. Its reads after a position
/// (`tx_id >= $1` on the event log, the funding journal and external deposits) have an index each,
/// but a planner without statistics (a database whose autovacuum is off, as on this project's
/// test machines, or a table grown far since its last ANALYZE) guesses that a range matches a
/// third of the table and scans all of it: the check's cost would follow the history again. With
/// sequential scans priced out, the only plans left are the indexed ones (a table with no usable
/// index, like the per-account balances summed in full, is still read whole). Not used by the
/// full check, which reads everything anyway.
///
/// JIT is turned off with it: a plan that must still read a table whole (the balances) carries
/// the priced-out scan's cost (10^10), far above `jit_above_cost`, so PostgreSQL compiled every
/// such read before running it: 0.6-1.2 s for a sum over 26 rows (`ledger-bench move`, 2026-12-07),
/// the fixed part of each incremental check. Nothing these reads do is worth compiling.
pub async fn prefer_indexes(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(&mut *conn)
        .await?;
    sqlx::query("SET LOCAL jit = off")
        .execute(conn)
        .await
        .map(|_| ())
}

/// Opens one of the conservation check's reads: a REPEATABLE READ, read-only transaction whose first statement
/// takes the snapshot and its snapshot watermark ([`SNAPSHOT_WATERMARK_SQL`]), never behind
/// `since` (everything below it was consumed before); an incremental read (`since > 0`) is then
/// made to go by index ([`prefer_indexes`]).
pub(crate) async fn begin_snapshot(
    pool: &sqlx::PgPool,
    since: u64,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, u64), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let watermark: i64 = sqlx::query_scalar(SNAPSHOT_WATERMARK_SQL)
        .fetch_one(&mut *tx)
        .await?;
    let watermark = u64::try_from(watermark).unwrap_or(0).max(since);
    if since > 0 {
        prefer_indexes(&mut tx).await?;
    }
    Ok((tx, watermark))
}
