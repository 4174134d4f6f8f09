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
//! last one. Large append-only tables (the event log, the journals) are left to autovacuum: they
//! have no dead rows to speak of.

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

/// Vacuums the hot tables every `interval`, forever; a failure is logged and tried again at the
/// next tick.
pub async fn run(pool: PgPool, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = vacuum_hot_tables(&pool).await {
            tracing::warn!(error = %e, "vacuum of the hot tables failed; trying again next time");
        }
    }
}
