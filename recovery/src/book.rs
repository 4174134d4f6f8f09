//! The recovery worker's retry book: which open transfers are due, the attempt log, the retry
//! count, backoff and alerts of each transfer, and the worker's heartbeat. A port, so the worker
//! runs over PostgreSQL (`PgRetryBook`: `open_transfers`, `transfer_retries`,
//! `recovery_attempts`, `recovery_heartbeat`) in production and in memory in the simulation.
//! The lease itself is the coordinator's port (`application::Leases`), shared with manual
//! resolution.

use application::CoordinatorError;
use async_trait::async_trait;
use domain::{ReqId, TransferState};
use sqlx::PgPool;

/// A database error in the book: the outcome is unknown.
fn unknown(e: sqlx::Error) -> CoordinatorError {
    CoordinatorError::outcome_unknown(e)
}

/// How one attempt ended, to be recorded with the lease's release.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord<'a> {
    pub attempt_id: i64,
    pub req_id: ReqId,
    pub state_after: Option<TransferState>,
    /// `TERMINAL`, `UNKNOWN`, `CONFLICT` or `ERROR`.
    pub outcome: &'static str,
    pub error: Option<&'a str>,
    pub category: Option<&'static str>,
    /// Whether it counts as an attempt.
    pub counts: bool,
    /// A refund that did not succeed (the transfer stays COMPENSATING).
    pub refund_failed: bool,
}

/// What the book holds for the transfer after the attempt was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub attempts: i32,
    pub refund_failures: i32,
    /// No refund alert (MON-002) was raised for it yet.
    pub refund_not_alerted: bool,
}

/// The decisions `record_attempt` takes inside its transaction from the tally.
pub trait AttemptPolicy: Send + Sync {
    /// The delay before the next retry after `attempts` (`None`: no retry to schedule).
    fn retry_delay_ms(&self, tally: &Tally) -> Option<u64>;
    /// Whether the refund alert is to be marked raised now.
    fn alert_refund(&self, tally: &Tally) -> bool;
}

/// The worker's bookkeeping. A store error means the outcome is unknown
/// (`CoordinatorError::OutcomeUnknown`).
#[async_trait]
pub trait RetryBook: Send + Sync {
    /// Open transfers unchanged for `stale_ms`, due for a retry and not leased: (req_id, state),
    /// the longest waiting first, at most `limit`. Under a cell map, only those of partitions
    /// this cell owns and has not frozen (ADR 0023): a transfer copied in by a move is driven
    /// by its target only after the switch, and one of a partition moved away never again here.
    async fn due(
        &self,
        stale_ms: i64,
        limit: i64,
    ) -> Result<Vec<(ReqId, TransferState)>, CoordinatorError>;

    /// Opens an attempt log entry; its id.
    async fn begin_attempt(
        &self,
        req_id: &ReqId,
        worker: &str,
        state_before: TransferState,
    ) -> Result<i64, CoordinatorError>;

    /// In one transaction: ends the attempt's entry, counts it and releases the lease, schedules
    /// the next retry and marks the refund alert as `policy` decides from the new tally.
    async fn record_attempt(
        &self,
        attempt: &AttemptRecord<'_>,
        policy: &dyn AttemptPolicy,
    ) -> Result<Tally, CoordinatorError>;

    /// MON-001: marks, once per transfer, every transfer in TARGET_PENDING for longer than
    /// `older_than_ms`; the newly marked ones with their age in ms.
    async fn mark_stuck_target_pending(
        &self,
        older_than_ms: i64,
    ) -> Result<Vec<(String, i64)>, CoordinatorError>;

    /// Records the end of a pass by `worker`.
    async fn heartbeat(&self, worker: &str) -> Result<(), CoordinatorError>;

    /// The transfer's first trace, a W3C traceparent (in its creation's metadata), which
    /// an attempt's span links (`docs/adr/0018-traces.md`); `None` when it has none (traces were
    /// not exported when it was created) or this book keeps none. Asked only when traces are
    /// exported; a failure to read it is `None`: a missing link never stops a recovery.
    async fn first_trace(&self, _req_id: &ReqId) -> Option<String> {
        None
    }
}

/// A due row of `open_transfers`, typed; a malformed one is logged and skipped (the check
/// constraints make it impossible, and one bad row must not stop every other recovery).
fn typed_due((req_id, state): (String, String)) -> Option<(ReqId, TransferState)> {
    let Ok(typed) = ReqId::parse(&req_id) else {
        tracing::error!(%req_id, "malformed req_id in open_transfers");
        return None;
    };
    let Some(state) = TransferState::parse(&state) else {
        tracing::error!(%req_id, %state, "unknown state in open_transfers");
        return None;
    };
    Some((typed, state))
}

/// The retry book in PostgreSQL.
#[derive(Clone)]
pub struct PgRetryBook {
    pool: PgPool,
}

impl PgRetryBook {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl RetryBook for PgRetryBook {
    async fn due(
        &self,
        stale_ms: i64,
        limit: i64,
    ) -> Result<Vec<(ReqId, TransferState)>, CoordinatorError> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT o.req_id, o.state FROM open_transfers o
             LEFT JOIN transfer_retries r USING (req_id)
             WHERE o.recorded_at <= now() - $1 * interval '1 millisecond'
               AND (r.req_id IS NULL OR (r.next_retry_at <= now()
                    AND (r.lease_until IS NULL OR r.lease_until < now())))
               AND transfer_is_ours(o.req_id)
             ORDER BY COALESCE(r.next_retry_at, o.recorded_at) LIMIT $2",
        )
        .bind(stale_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(unknown)?;
        Ok(rows.into_iter().filter_map(typed_due).collect())
    }

    async fn first_trace(&self, req_id: &ReqId) -> Option<String> {
        // The one read `adapters::event_store::first_trace` makes too: the creation's metadata,
        // or the table earlier versions kept it in.
        let read = eventlog::transfers::first_trace(&self.pool, &req_id.to_string()).await;
        match read {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(%req_id, error = %e, "reading the transfer's first trace failed");
                None
            }
        }
    }

    async fn begin_attempt(
        &self,
        req_id: &ReqId,
        worker: &str,
        state_before: TransferState,
    ) -> Result<i64, CoordinatorError> {
        Ok(sqlx::query_scalar(
            "INSERT INTO recovery_attempts (req_id, worker, state_before)
             VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(req_id.to_string())
        .bind(worker)
        .bind(state_before.as_str())
        .fetch_one(&self.pool)
        .await
        .map_err(unknown)?)
    }

    async fn record_attempt(
        &self,
        a: &AttemptRecord<'_>,
        policy: &dyn AttemptPolicy,
    ) -> Result<Tally, CoordinatorError> {
        let mut tx = self.pool.begin().await.map_err(unknown)?;
        sqlx::query(
            "UPDATE recovery_attempts SET finished_at = clock_timestamp(), state_after = $2,
                outcome = $3, error = $4, error_category = $5 WHERE id = $1",
        )
        .bind(a.attempt_id)
        .bind(a.state_after.map(TransferState::as_str))
        .bind(a.outcome)
        .bind(a.error)
        .bind(a.category)
        .execute(&mut *tx)
        .await
        .map_err(unknown)?;
        let (attempts, refund_failures, refund_not_alerted): (i32, i32, bool) = sqlx::query_as(
            "UPDATE transfer_retries SET
                state = COALESCE($2, state),
                attempts = attempts + $3,
                refund_failures = refund_failures + $4,
                last_error = COALESCE($5, last_error),
                last_error_category = COALESCE($6, last_error_category),
                last_attempt_at = CASE WHEN $3 = 1 THEN clock_timestamp() ELSE last_attempt_at END,
                lease_owner = NULL, lease_until = NULL, updated_at = now()
             WHERE req_id = $1 RETURNING attempts, refund_failures, refund_alerted_at IS NULL",
        )
        .bind(a.req_id.to_string())
        .bind(a.state_after.map(TransferState::as_str))
        .bind(i32::from(a.counts))
        .bind(i32::from(a.refund_failed))
        .bind(a.error)
        .bind(a.category)
        .fetch_one(&mut *tx)
        .await
        .map_err(unknown)?;
        let tally = Tally {
            attempts,
            refund_failures,
            refund_not_alerted,
        };
        if let Some(delay) = policy.retry_delay_ms(&tally) {
            sqlx::query(
                "UPDATE transfer_retries
                 SET next_retry_at = clock_timestamp() + $2 * interval '1 millisecond'
                 WHERE req_id = $1",
            )
            .bind(a.req_id.to_string())
            .bind(i64::try_from(delay).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await
            .map_err(unknown)?;
        }
        if policy.alert_refund(&tally) {
            sqlx::query("UPDATE transfer_retries SET refund_alerted_at = now() WHERE req_id = $1")
                .bind(a.req_id.to_string())
                .execute(&mut *tx)
                .await
                .map_err(unknown)?;
        }
        tx.commit().await.map_err(unknown)?;
        Ok(tally)
    }

    async fn mark_stuck_target_pending(
        &self,
        older_than_ms: i64,
    ) -> Result<Vec<(String, i64)>, CoordinatorError> {
        Ok(sqlx::query_as(
            "WITH stuck AS (
                SELECT req_id, state, recorded_at AS updated_at FROM open_transfers
                WHERE state = 'TARGET_PENDING'
                  AND recorded_at <= now() - $1 * interval '1 millisecond'
             ), marked AS (
                INSERT INTO transfer_retries (req_id, state, stuck_alerted_at)
                SELECT req_id, state, now() FROM stuck
                ON CONFLICT (req_id) DO UPDATE SET stuck_alerted_at = now()
                  WHERE transfer_retries.stuck_alerted_at IS NULL
                RETURNING req_id
             )
             SELECT m.req_id, (EXTRACT(EPOCH FROM (now() - s.updated_at)) * 1000)::bigint
             FROM marked m JOIN stuck s USING (req_id)",
        )
        .bind(older_than_ms)
        .fetch_all(&self.pool)
        .await
        .map_err(unknown)?)
    }

    async fn heartbeat(&self, worker: &str) -> Result<(), CoordinatorError> {
        Ok(crate::heartbeat::beat(&self.pool, worker)
            .await
            .map_err(unknown)?)
    }
}
