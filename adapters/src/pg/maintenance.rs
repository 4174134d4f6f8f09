//! Keeps the ledger's hot tables vacuumed, whatever the server's autovacuum does.
//!
//! A few small tables are updated in place or entered and left at every transfer:
//! `open_transfers` (every transfer enters and leaves it), `funding_accounts` (a balance per
//! movement), the projector's counters and cursor, the conservation check's checkpoint, the recovery totals,
//! the relay's checkpoint. PostgreSQL keeps each old row version until a VACUUM; without one
//! (a server with autovacuum off, as this project's development machine runs) they grow with
//! history: at 680k transfers `open_transfers` held 1.16M dead rows for 42 live ones and the write
//! path had slowed six-fold (docs/adr/0007-run-for-years.md). Their live rows are few (accounts,
//! open transfers, single rows), so a VACUUM of them every minute costs what changed since the
//! last one. Large append-only tables (the event log, the journals) have no dead rows to speak of
//! and are not vacuumed here.
//!
//! Every table is also ANALYZEd here once its changes since the last analyze pass autovacuum's
//! own default threshold (50 rows and a tenth of the table), checked every few seconds. Without
//! it (autovacuum off) a table's statistics are never taken, and each pooled connection keeps the
//! generic plan it made while the table was a few pages: the receipts' read of a transfer's feed
//! positions (`aggregate_id = ANY($1)`) stayed a sequential scan of the whole event log, and the
//! single route fell from 663 to 318 transfers/s within 36 s of a fresh database (PostgreSQL's
//! CPU 2.1 -> 5.4 ms a transfer; `docs/perf-log.md`). An ANALYZE invalidates the plans that
//! depend on the table, so the next execution plans against its real size. With autovacuum on,
//! it has usually analyzed first and this finds nothing to do.

use std::time::Duration;

use sqlx::PgPool;

/// The tables vacuumed, each small in live rows and changed by every transfer.
pub const HOT_TABLES: &[&str] = &[
    "open_transfers",
    "funding_accounts",
    "transfer_balances",
    "transfer_state_counts",
    "projector_cursor",
    "audit_checkpoint",
    "audit_checkpoint_assets",
    "audit_checkpoint_open",
    "recovery_totals",
    "relay_checkpoint",
    // The tamper-evident log's head (one row, rewritten by every follower pass) and its tiles
    // (a pass rewrites the rightmost tile of each level it touched: up to 8 KiB out of line).
    "tlog_state",
    "tlog_tiles",
];

/// How often [`run`] vacuums.
pub const INTERVAL: Duration = Duration::from_secs(60);

/// One VACUUM (ANALYZE) of every hot table, one statement per table (a VACUUM cannot run in a
/// transaction block; each statement is its own).
pub async fn vacuum_hot_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    for table in HOT_TABLES {
        sqlx::query(&format!("VACUUM (ANALYZE) {table}"))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// How often [`run`] looks for tables grown past the analyze threshold.
pub const ANALYZE_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// autovacuum's defaults: `autovacuum_analyze_threshold` rows plus
/// `autovacuum_analyze_scale_factor` of the table's live rows.
const ANALYZE_THRESHOLD_ROWS: f64 = 50.0;
const ANALYZE_SCALE_FACTOR: f64 = 0.1;

/// ANALYZEs every table of the ledger's schema (but the hot ones, which [`vacuum_hot_tables`]
/// analyzes) whose rows changed since its last analyze pass the threshold autovacuum would use.
/// Returns the tables analyzed.
pub async fn analyze_grown_tables(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let grown: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_stat_user_tables
         WHERE schemaname = current_schema() AND NOT (relname = ANY($1))
           AND n_mod_since_analyze > $2 + $3 * n_live_tup
         ORDER BY relname",
    )
    .bind(HOT_TABLES)
    .bind(ANALYZE_THRESHOLD_ROWS)
    .bind(ANALYZE_SCALE_FACTOR)
    .fetch_all(pool)
    .await?;
    for table in &grown {
        let quoted = table.replace('"', "\"\"");
        sqlx::query(&format!("ANALYZE \"{quoted}\""))
            .execute(pool)
            .await?;
    }
    Ok(grown)
}

/// Vacuums the hot tables every `vacuum_interval` and analyzes grown tables every
/// [`ANALYZE_CHECK_INTERVAL`], forever; a failure is logged and tried again at the next tick.
pub async fn run(pool: PgPool, vacuum_interval: Duration) {
    use tokio::time::MissedTickBehavior::Delay;
    let mut vacuum = tokio::time::interval(vacuum_interval);
    vacuum.set_missed_tick_behavior(Delay);
    let mut analyze = tokio::time::interval(ANALYZE_CHECK_INTERVAL);
    analyze.set_missed_tick_behavior(Delay);
    loop {
        tokio::select! {
            _ = vacuum.tick() => {
                if let Err(e) = vacuum_hot_tables(&pool).await {
                    tracing::warn!(error = %e, "vacuum of the hot tables failed; trying again next time");
                }
            }
            _ = analyze.tick() => match analyze_grown_tables(&pool).await {
                Ok(tables) if !tables.is_empty() => tracing::debug!(?tables, "analyzed grown tables"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "analyze of grown tables failed; trying again next time"),
            },
        }
    }
}
