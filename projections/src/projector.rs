//! The projector: reads the event log in a commit-safe order and applies each event exactly once
//! to every read model (`transfers_view`, `transfer_balances`, `transfer_state_counts`), storing
//! its position in the same transaction as its rows. The consumer feed is not among them: its
//! dense positions are handed out when events are appended (migration 0013, `feed.rs`).
//!
//! Why the order is safe (docs/adr/0002-global-position.md): `global_position` comes from a
//! sequence, so a higher position can commit before a lower one. The projector only reads events
//! whose writing transaction is older than every transaction still running
//! (`tx_id < pg_snapshot_xmin(pg_current_snapshot())`, the commit watermark): those
//! transactions have ended, so no event can ever appear below it again. Taking them in
//! (tx_id, global_position) order, and remembering the last pair applied, every event is applied once, in one fixed order. A
//! transaction-scoped advisory lock makes one projector at a time the writer.

//!
//! This module is the live pass and its loop; the pure fold is in `fold.rs`, the bulk rebuild in
//! `bulk.rs`, the table writes in `tables.rs` and `copy.rs`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sqlx::{PgPool, Postgres, Transaction};

use crate::error::ProjectionError;
use crate::fold::Fold;
use crate::log::BatchEvent;
use crate::log::TRANSFER_AGGREGATE;
use crate::tables::{self, Cursor};
use eventlog::batches::{events_page, Bounds};

/// The advisory lock the live projector holds while it writes (an arbitrary, fixed key).
pub const LIVE_LOCK_KEY: i64 = 0x4c45_4447_4552_0001;

/// The most events one projector transaction applies; bounds its duration and memory.
pub const BATCH_EVENTS_MAX: i64 = 2000;

/// How long a background pass sleeps when it found nothing to do.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What one projector pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Events applied in this pass.
    pub applied: usize,
    /// The commit watermark used: every transaction below it had ended, and (when `exhausted`) every event
    /// they wrote is now projected.
    pub watermark: i64,
    /// True when the pass applied everything below the watermark (it was not cut by the batch size
    /// or by `upto`).
    pub exhausted: bool,
}

/// A projector over one set of read-model tables: the live ones (`schema == None`) or a fresh
/// copy in another schema (the replay).
#[derive(Debug, Clone)]
pub struct Projector {
    pool: PgPool,
    schema: Option<String>,
    lock_key: i64,
}

impl Projector {
    /// The live projector.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            schema: None,
            lock_key: LIVE_LOCK_KEY,
        }
    }

    /// A projector writing the tables of `schema` (created by the replay), under its own lock.
    pub fn in_schema(pool: PgPool, schema: String, lock_key: i64) -> Self {
        Self {
            pool,
            schema: Some(schema),
            lock_key,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Begins a transaction that resolves the read-model tables in this projector's schema.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if let Some(schema) = &self.schema {
            // The event table exists only in `public`, so it still resolves there.
            sqlx::query(&format!("SET LOCAL search_path TO \"{schema}\", public"))
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    /// Begins a transaction in this projector's schema holding its advisory lock: the one writer
    /// of its tables until the transaction ends. With `seqscan` false, its statements are planned
    /// without sequential scans (set in the same round trip as the lock).
    pub(crate) async fn begin_locked(
        &self,
        seqscan: bool,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1), set_config('enable_seqscan', $2, true)")
            .bind(self.lock_key)
            .bind(if seqscan { "on" } else { "off" })
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// One pass: applies up to [`BATCH_EVENTS_MAX`] events below the commit watermark (and at or
    /// below `upto`, a (tx_id, global_position) bound, if given) in one transaction, together
    /// with the new stored position.
    pub async fn pass(&self, upto: Option<(i64, i64)>) -> Result<Pass, ProjectionError> {
        // Every statement of a pass reads or writes a few rows by key. Plans are cached per
        // connection, and one made while the tables were small (a fresh database) is a
        // sequential scan that grows with the history for as long as the connection lives:
        // reading a batch's transfer rows took 3.3 ms instead of 0.15 in `ledger-bench`. Planned
        // without sequential scans, every lookup stays on its index whatever the statistics say.
        let mut tx = self.begin_locked(false).await?;
        let (cur_tx, cur_pos, applied_total): (i64, i64, i64) = sqlx::query_as(
            "SELECT tx_id::text::bigint, global_position, events_applied
             FROM projector_cursor WHERE projector = 'main' FOR UPDATE",
        )
        .fetch_one(&mut *tx)
        .await?;
        let watermark = commit_watermark(&mut tx).await?;
        let (up_tx, up_pos) = upto.unwrap_or((i64::MAX, i64::MAX));
        let bounds = Bounds {
            watermark,
            from: (cur_tx, cur_pos),
            upto: (up_tx, up_pos),
        };
        let rows = events_page(&mut tx, bounds, BATCH_EVENTS_MAX).await?;
        let exhausted = i64::try_from(rows.len()).unwrap_or(i64::MAX) < BATCH_EVENTS_MAX;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(Pass {
                applied: 0,
                watermark,
                exhausted,
            });
        }
        let events = rows
            .into_iter()
            .map(BatchEvent::decode)
            .collect::<Result<Vec<_>, _>>()?;
        apply_batch(&mut tx, &events, applied_total).await?;
        tx.commit().await?;
        Ok(Pass {
            applied: events.len(),
            watermark,
            exhausted,
        })
    }

    /// Projects until every event committed before this call is applied, or until `wait_max`
    /// passes (a transaction still running anywhere on the server holds the watermark back).
    /// Returns whether it caught up.
    pub async fn catch_up(&self, wait_max: Duration) -> Result<bool, ProjectionError> {
        // Every transaction that had committed when this call began has an id below this.
        let target: i64 =
            sqlx::query_scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
                .fetch_one(&self.pool)
                .await?;
        let deadline = Instant::now() + wait_max;
        loop {
            let pass = self.pass(None).await?;
            if pass.exhausted && pass.watermark >= target {
                return Ok(true);
            }
            if pass.exhausted {
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                // The watermark moves when the transactions running now end; they are short.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    /// Projects forever: a pass, then a short sleep when there was nothing to do. Errors are
    /// logged and retried with bounded backoff; the stored position never moves past a failure.
    pub async fn run(self) {
        let mut backoff = POLL_INTERVAL;
        loop {
            match self.pass(None).await {
                Ok(pass) => {
                    backoff = POLL_INTERVAL;
                    if pass.exhausted {
                        tokio::time::sleep(POLL_INTERVAL).await;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "projector pass failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// The commit watermark: every transaction below it has ended. Read in a statement of its
/// own, so the statements after it (with later snapshots) see all of those transactions' events.
pub(crate) async fn commit_watermark(
    tx: &mut Transaction<'static, Postgres>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        .fetch_one(&mut **tx)
        .await
}

/// The transfers a batch continues but does not create: their rows
/// must be read from the table first. Those it creates cannot be there yet (their TransferCreated
/// was never applied; had it been, the table's primary key refuses the second insert and the
/// batch rolls back). Sorted, without repeats.
fn continued_elsewhere(events: &[BatchEvent]) -> Vec<&str> {
    let created_here: HashSet<&str> = events
        .iter()
        .filter(|e| e.aggregate_type == TRANSFER_AGGREGATE && e.sequence == 1)
        .map(|e| e.aggregate_id.as_str())
        .collect();
    let mut known: Vec<&str> = events
        .iter()
        .filter(|e| e.aggregate_type == TRANSFER_AGGREGATE && e.sequence > 1)
        .map(|e| e.aggregate_id.as_str())
        .filter(|id| !created_here.contains(id))
        .collect();
    known.sort_unstable();
    known.dedup();
    known
}

/// Applies one batch (in log order, right after the stored position) inside `tx`: the transfer
/// rows, balances and counts, and the new stored position, so they commit or roll back together.
/// Used by the live pass (and so by the replay's final catch-up); the bulk rebuild keeps one fold
/// across batches instead.
async fn apply_batch(
    tx: &mut Transaction<'static, Postgres>,
    events: &[BatchEvent],
    applied_total: i64,
) -> Result<(), ProjectionError> {
    let Some(last) = events.last() else {
        return Ok(());
    };
    let mut fold = Fold::default();
    let known = continued_elsewhere(events);
    if !known.is_empty() {
        fold.rows = tables::load_rows(tx, &known)
            .await?
            .into_iter()
            .map(|r| (r.req_id.clone(), r))
            .collect();
    }
    for e in events {
        fold.apply_decoded(
            &e.aggregate_type,
            &e.aggregate_id,
            e.sequence,
            e.event.as_ref(),
        )?;
    }
    tables::write_transfers(tx, &fold).await?;
    tables::write_balances(tx, &fold).await?;
    tables::write_counts(tx, &fold).await?;
    tables::write_cursor(
        tx,
        &Cursor {
            tx_id: last.tx_id,
            global_position: last.global_position,
            events_applied: applied_total + i64::try_from(events.len()).unwrap_or(i64::MAX),
        },
    )
    .await?;
    Ok(())
}
