//! The recovery worker (contract §6.2): finds transfers left in a non-terminal state longer
//! than a threshold and resumes each by its state, at start-up and then periodically.
//!
//! - Open transfers come from `open_transfers`, kept by a trigger on the event table in each
//!   event's transaction, not from the read models, so a frozen projector cannot hide one.
//! - Leases: a transfer is worked only under a lease taken with one conditional upsert on
//!   `transfer_retries` and renewed while it is driven, so several `ledger serve` processes never drive one transfer at once; a
//!   crashed holder's lease expires. The aggregate's optimistic concurrency is the backstop (a
//!   request still driving its own transfer, or a lease outlived by a very slow drive).
//! - Unknown outcomes are retried forever with exponential backoff and a cap; every attempt is
//!   recorded (`transfer_retries`: attempts, last error, next retry; `recovery_attempts`: one row
//!   per attempt with worker and times).
//! - Before a pending call is retried, the account system is asked what it recorded
//!   (`Coordinator::resume`).
//! - Alerts (MON-001, MON-002): a CRITICAL log line, once per transfer, when a transfer sits in
//!   TARGET_PENDING longer than a threshold or a refund has failed 3 times.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use application::{Clock, Coordinator, CoordinatorError, LeaseRequest, Leases, Resumed, StillOpen};
use async_trait::async_trait;
use domain::{AdapterOutcome, ReqId, TransferState};
use futures_util::future::Either;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tracing::Instrument;

use crate::book::{AttemptPolicy, AttemptRecord, PgRetryBook, RetryBook, Tally};
use sqlx::PgPool;

/// The worker's knobs. Every one has a limit; names carry their unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// How long a transfer must sit unchanged before the worker touches it; keeps the worker out
    /// of the way of a request still driving its own transfer.
    pub stale_after: Duration,
    /// Time between passes.
    pub interval: Duration,
    /// Most transfers claimed in one pass.
    pub batch_max: i64,
    /// Most transfers driven at once by one worker.
    pub concurrency_max: usize,
    /// How long a claim holds without renewal; renewed every third of it while a drive runs, so
    /// a drive longer than this (a few adapter calls, each up to its timeout) keeps its claim.
    pub lease: Duration,
    /// First retry delay after an unknown outcome; doubles per attempt up to `backoff_ms_max`.
    pub backoff_ms_base: u64,
    pub backoff_ms_max: u64,
    /// MON-001: a transfer in TARGET_PENDING longer than this raises a CRITICAL alert.
    pub target_pending_alert_after: Duration,
    /// MON-002: this many failed refunds of one transfer raise a CRITICAL alert.
    pub refund_failures_alert: i32,
    /// The read models' projector failing to catch up for this long (over at least
    /// `PROJECTOR_FAILED_PASSES_CRITICAL` passes in a row) raises a CRITICAL alert.
    pub projector_stalled_alert_after: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            stale_after: Duration::from_secs(5),
            interval: Duration::from_secs(1),
            batch_max: 100,
            concurrency_max: 8,
            lease: Duration::from_secs(60),
            backoff_ms_base: 500,
            backoff_ms_max: 60_000,
            target_pending_alert_after: Duration::from_secs(60),
            refund_failures_alert: 3,
            projector_stalled_alert_after: Duration::from_secs(30),
        }
    }
}

/// Operator overrides of the defaults (milliseconds unless named otherwise), as the settings
/// read them (`LEDGER_RECOVERY_*`, `LEDGER_RETRY_*`, `LEDGER_ALERT_*`); `None` keeps the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryOverrides {
    pub stale_ms: Option<u64>,
    pub interval_ms: Option<u64>,
    pub lease_ms: Option<u64>,
    pub batch_max: Option<u64>,
    pub backoff_ms_base: Option<u64>,
    pub backoff_ms_max: Option<u64>,
    pub alert_target_pending_ms: Option<u64>,
}

/// Upper bounds on what an override may ask for, so a typo cannot stall recovery for years.
const MS_MAX: u64 = 24 * 60 * 60 * 1000;
const BATCH_MAX_MAX: i64 = 10_000;

impl RecoveryConfig {
    /// The defaults with `overrides` applied, each clamped to its bounds.
    pub fn with_overrides(overrides: &RecoveryOverrides) -> Self {
        let mut c = Self::default();
        let ms = |v: Option<u64>| v.map(|v| v.min(MS_MAX));
        if let Some(v) = ms(overrides.stale_ms) {
            c.stale_after = Duration::from_millis(v);
        }
        if let Some(v) = ms(overrides.interval_ms) {
            c.interval = Duration::from_millis(v.max(10));
        }
        if let Some(v) = ms(overrides.lease_ms) {
            c.lease = Duration::from_millis(v.max(1000));
        }
        if let Some(v) = ms(overrides.batch_max) {
            c.batch_max = i64::try_from(v)
                .unwrap_or(BATCH_MAX_MAX)
                .clamp(1, BATCH_MAX_MAX);
        }
        if let Some(v) = ms(overrides.backoff_ms_base) {
            c.backoff_ms_base = v.max(1);
        }
        if let Some(v) = ms(overrides.backoff_ms_max) {
            c.backoff_ms_max = v.max(1);
        }
        if let Some(v) = ms(overrides.alert_target_pending_ms) {
            c.target_pending_alert_after = Duration::from_millis(v);
        }
        c.backoff_ms_max = c.backoff_ms_max.max(c.backoff_ms_base);
        c
    }

    /// The delay before retry number `attempts + 1`: base × 2^(attempts − 1), capped.
    pub fn backoff_ms(&self, attempts: i32) -> u64 {
        let exponent = u32::try_from(attempts.saturating_sub(1).max(0)).unwrap_or(0);
        let factor = 1u64.checked_shl(exponent.min(62)).unwrap_or(u64::MAX);
        self.backoff_ms_base
            .saturating_mul(factor)
            .min(self.backoff_ms_max)
    }
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How long a pass waits for the read models' projector to catch up (it only watches it: the
/// worker itself never reads the read models).
const PROJECTOR_CHECK_WAIT: Duration = Duration::from_millis(500);
/// Passes in a row the projector must fail to catch up before a stall is CRITICAL.
pub const PROJECTOR_FAILED_PASSES_CRITICAL: u32 = 3;

/// The categories of `last_error` the admin API shows (the detail stays in logs and the table).
pub const TIMEOUT: &str = "TIMEOUT";
pub const NETWORK: &str = "NETWORK";
pub const STORE: &str = "STORE";
pub const REFUSED_BY_TARGET: &str = "REFUSED_BY_TARGET";
pub const MISMATCH: &str = "MISMATCH";
pub const UNKNOWN: &str = "UNKNOWN";
/// An internal invariant broke (`CoordinatorError::Invariant`): a bug, not the store.
pub const INVARIANT: &str = "INVARIANT";

/// The category of how an attempt ended, or `None` when it did not end in an error.
pub fn error_category(result: &Result<Resumed, CoordinatorError>) -> Option<&'static str> {
    match result {
        Ok(Resumed { unknown: None, .. }) | Err(CoordinatorError::Conflict) => None,
        Ok(Resumed {
            unknown: Some(open),
            ..
        }) => Some(match open {
            StillOpen::Call { outcome, .. } => match outcome {
                AdapterOutcome::ExplicitFail { .. } => REFUSED_BY_TARGET,
                AdapterOutcome::Timeout => TIMEOUT,
                AdapterOutcome::NetworkError(_) => NETWORK,
                AdapterOutcome::Mismatch(_) => MISMATCH,
                AdapterOutcome::Success | AdapterOutcome::Pending | AdapterOutcome::Unknown(_) => {
                    UNKNOWN
                }
            },
            StillOpen::FollowUp(CoordinatorError::OutcomeUnknown(_)) => STORE,
            StillOpen::FollowUp(CoordinatorError::Invariant(_)) => INVARIANT,
            StillOpen::FollowUp(_) => UNKNOWN,
        }),
        Err(CoordinatorError::OutcomeUnknown(_)) => Some(STORE),
        Err(CoordinatorError::Invariant(_)) => Some(INVARIANT),
        Err(_) => Some(UNKNOWN),
    }
}

/// How a recovery attempt ended, as recorded.
struct AttemptEnd {
    state_after: Option<TransferState>,
    /// `TERMINAL`, `UNKNOWN`, `CONFLICT` or `ERROR`.
    outcome: &'static str,
    error: Option<String>,
    /// Whether it counts as an attempt.
    counts: bool,
    /// Whether the next retry waits (the transfer is still open, or the attempt failed).
    backoff: bool,
}

impl AttemptEnd {
    fn of(key: &ReqId, result: &Result<Resumed, CoordinatorError>) -> AttemptEnd {
        let end = |state_after, outcome, error, counts, backoff| AttemptEnd {
            state_after,
            outcome,
            error,
            counts,
            backoff,
        };
        match result {
            Ok(Resumed {
                data,
                unknown: None,
            }) => {
                tracing::info!(req_id = %key, state = %data.state, "recovery finished transfer");
                end(Some(data.state), "TERMINAL", None, true, false)
            }
            Ok(Resumed {
                data,
                unknown: Some(why),
            }) => end(
                Some(data.state),
                "UNKNOWN",
                Some(why.to_string()),
                true,
                true,
            ),
            // Someone else moved it first: not a failure, and no reason to wait longer.
            Err(CoordinatorError::Conflict) => end(None, "CONFLICT", None, false, false),
            Err(e) => end(None, "ERROR", Some(application::error_chain(e)), true, true),
        }
    }
}

/// MON-002 for a transfer whose refund keeps failing, or was refused for good.
fn raise_refund_alert(key: &ReqId, refused: bool, refund_failures: i32, end: &AttemptEnd) {
    let last_error = end.error.as_deref().unwrap_or("");
    if refused {
        tracing::error!(
            alert = "CRITICAL",
            code = "MON-002",
            req_id = %key,
            status = "REFUND_REFUSED",
            last_error,
            "CRITICAL MON-002: refund of transfer {key} was REFUSED by the source account system; retrying cannot succeed, it stays COMPENSATING (REFUND_REFUSED) until an operator acts"
        );
    } else {
        tracing::error!(
            alert = "CRITICAL",
            code = "MON-002",
            req_id = %key,
            refund_failures,
            last_error,
            "CRITICAL MON-002: refund of transfer {key} failed {refund_failures} times; it stays COMPENSATING and is retried"
        );
    }
}

/// Whether the read models' projector keeps up with the event log. The worker only watches it
/// (it never reads the read models), through this port, so recovery does not depend on the read
/// side; the `ledger` binary wires in the real projector.
#[async_trait]
pub trait ProjectorProbe: Send + Sync {
    /// Whether the projector caught up with every event committed before the call within
    /// `wait_max`.
    async fn caught_up(
        &self,
        wait_max: Duration,
    ) -> Result<bool, Box<dyn std::error::Error + Send + Sync>>;
}

/// How the read models' projector has fared over the last passes.
#[derive(Debug, Default)]
struct ProjectorWatch {
    failed_passes: u32,
    failing_since: Option<std::time::Instant>,
    alerted: bool,
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Transfers claimed and driven.
    pub driven: usize,
    /// Of those, the ones that reached a terminal state.
    pub finished: usize,
    /// CRITICAL alerts raised in this pass.
    pub alerts: usize,
}

/// The retry policy of one attempt, applied by the book inside its transaction.
struct Policy<'a> {
    config: &'a RecoveryConfig,
    /// The transfer is still open (or the attempt failed): the next retry waits.
    backoff: bool,
    refund_failed: bool,
    /// The source recorded the refund as refused: alerted at once.
    refund_refused: bool,
}

impl AttemptPolicy for Policy<'_> {
    fn retry_delay_ms(&self, tally: &Tally) -> Option<u64> {
        self.backoff.then(|| self.config.backoff_ms(tally.attempts))
    }

    fn alert_refund(&self, tally: &Tally) -> bool {
        // A refused refund is recorded for good (the same refusal answers every retry): no
        // retry can end it, so it is raised at once instead of after `refund_failures_alert`.
        self.refund_failed
            && tally.refund_not_alerted
            && (self.refund_refused || tally.refund_failures >= self.config.refund_failures_alert)
    }
}

/// The recovery worker. Cheap to clone.
#[derive(Clone)]
pub struct RecoveryWorker {
    coordinator: Coordinator,
    book: Arc<dyn RetryBook>,
    leases: Arc<dyn Leases>,
    clock: Arc<dyn Clock>,
    pub config: RecoveryConfig,
    /// Names this worker in leases and the attempt log.
    pub id: String,
    probe: Option<Arc<dyn ProjectorProbe>>,
    projector: Arc<std::sync::Mutex<ProjectorWatch>>,
}

impl RecoveryWorker {
    /// A worker driving through `coordinator`'s commands with `config`, its retry book in
    /// `pool`'s database (the coordinator's). It watches no projector until given one
    /// ([`RecoveryWorker::watching`]).
    pub fn with_config(coordinator: Coordinator, pool: PgPool, config: RecoveryConfig) -> Self {
        let book: Arc<dyn RetryBook> = Arc::new(PgRetryBook::new(pool));
        Self::with_book(coordinator, config, book)
    }

    /// A worker over the retry book `book` (the simulation's in-memory one, or any other); its
    /// leases are the coordinator's (`Coordinator::leases`), its time the coordinator's clock.
    pub fn with_book(
        coordinator: Coordinator,
        config: RecoveryConfig,
        book: Arc<dyn RetryBook>,
    ) -> Self {
        let clock = coordinator.clock().clone();
        let leases = coordinator.leases().clone();
        let id = format!("pid{}-{}", std::process::id(), clock.req_id());
        Self {
            coordinator,
            book,
            leases,
            clock,
            config,
            id,
            probe: None,
            projector: Arc::default(),
        }
    }

    /// Watches the read models' projector in every pass (CRITICAL `PROJECTOR_STALLED`).
    pub fn watching(mut self, probe: Arc<dyn ProjectorProbe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Runs forever: one pass at start-up, then one per interval. A failing pass (database down)
    /// is logged and the next one tries again.
    pub async fn run(self) {
        tracing::info!(worker = %self.id, config = ?self.config, "recovery worker started");
        loop {
            if let Err(e) = self.pass().await {
                tracing::warn!(error = %e, "recovery pass failed");
            }
            self.clock.sleep(self.config.interval).await;
        }
    }

    /// One pass: raise due alerts, then claim and drive every due open transfer once.
    pub async fn pass(&self) -> Result<PassReport, CoordinatorError> {
        // The worker finds open transfers in `open_transfers`, kept by a trigger in the same
        // transaction as each event (schema/migrations/0005_recovery_events.sql), never through
        // the read models: a frozen projector cannot hide a transfer from recovery. The projector
        // is only watched here, so a stall is raised loudly.
        let mut report = PassReport {
            alerts: self.watch_projector().await + self.alert_stuck_target_pending().await?,
            ..PassReport::default()
        };
        let due = self
            .book
            .due(millis(self.config.stale_after), self.config.batch_max)
            .await?;

        // At most `concurrency_max` drives at once, all in this pass's task (no runtime's
        // spawn, so the simulation's executor runs the same code); a panicking drive is caught
        // and logged as a spawned task's was.
        let mut due = due.into_iter();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < self.config.concurrency_max.max(1) {
                let Some((req_id, state)) = due.next() else {
                    break;
                };
                let worker = self.clone();
                running.push(
                    AssertUnwindSafe(async move { worker.work_one(req_id, state).await })
                        .catch_unwind(),
                );
            }
            let Some(joined) = running.next().await else {
                break;
            };
            match joined {
                Ok(Ok(Some(terminal))) => {
                    report.driven += 1;
                    report.finished += usize::from(terminal);
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "recovery of one transfer failed"),
                Err(_) => tracing::error!("recovery task ended abnormally (panicked)"),
            }
        }
        if let Err(e) = self.book.heartbeat(&self.id).await {
            tracing::warn!(error = %e, "could not record the recovery worker's heartbeat");
        }
        Ok(report)
    }

    /// Gives the read models' projector a short chance to catch up, and raises a CRITICAL alert
    /// (once per stall) when it has failed for `PROJECTOR_FAILED_PASSES_CRITICAL` passes in a
    /// row and for at least `projector_stalled_alert_after`. Returns the alerts raised.
    async fn watch_projector(&self) -> usize {
        let Some(probe) = &self.probe else {
            return 0;
        };
        let outcome = probe.caught_up(PROJECTOR_CHECK_WAIT).await;
        let failure = match outcome {
            Ok(true) => None,
            Ok(false) => {
                Some("behind the event log (a transaction is holding the horizon)".to_owned())
            }
            Err(e) => Some(e.to_string()),
        };
        let mut watch = self.projector.lock().unwrap_or_else(|e| e.into_inner());
        let Some(failure) = failure else {
            if watch.alerted {
                tracing::info!("projector caught up again");
            }
            *watch = ProjectorWatch::default();
            return 0;
        };
        watch.failed_passes = watch.failed_passes.saturating_add(1);
        let since = *watch
            .failing_since
            .get_or_insert_with(std::time::Instant::now);
        tracing::warn!(failed_passes = watch.failed_passes, error = %failure, "projector could not catch up");
        if watch.alerted
            || watch.failed_passes < PROJECTOR_FAILED_PASSES_CRITICAL
            || since.elapsed() < self.config.projector_stalled_alert_after
        {
            return 0;
        }
        watch.alerted = true;
        let failed_passes = watch.failed_passes;
        let stalled_ms = since.elapsed().as_millis();
        tracing::error!(
            alert = "CRITICAL",
            code = "PROJECTOR_STALLED",
            failed_passes,
            stalled_ms,
            error = %failure,
            "CRITICAL PROJECTOR_STALLED: the projector has not caught up for {failed_passes} passes ({stalled_ms} ms); read models, feed and history are stale (recovery goes on from the event log)"
        );
        1
    }

    /// Resumes a transfer while renewing this worker's lease every third of its length, so a
    /// drive slower than the lease (several adapter calls, each up to its timeout) never lets
    /// another worker take the transfer mid-call.
    async fn resume_renewing(&self, req_id: &ReqId) -> Result<Resumed, CoordinatorError> {
        let resume = self.coordinator.resume(req_id);
        futures_util::pin_mut!(resume);
        let period = (self.config.lease / 3).max(Duration::from_millis(100));
        loop {
            // The drive is polled first, so an ended drive never waits for a renewal.
            let tick = self.clock.sleep(period);
            match futures_util::future::select(resume.as_mut(), tick).await {
                Either::Left((result, _)) => return result,
                Either::Right(((), _)) => {
                    let renewed = self.leases.renew(req_id, &self.id, self.config.lease).await;
                    match renewed {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::error!(%req_id, worker = %self.id, "lease lost while driving")
                        }
                        Err(e) => {
                            tracing::warn!(%req_id, error = %e, "could not renew the lease")
                        }
                    }
                }
            }
        }
    }

    /// Claims one transfer and drives it. `None` when another worker holds it or it is not due;
    /// otherwise whether it reached a terminal state.
    async fn work_one(
        &self,
        req_id: ReqId,
        state: TransferState,
    ) -> Result<Option<bool>, CoordinatorError> {
        let claimed = self
            .leases
            .take(&LeaseRequest {
                req_id,
                state,
                owner: &self.id,
                lease: self.config.lease,
                wait_for_retry_time: true,
            })
            .await?;
        if claimed.is_none() {
            return Ok(None);
        }
        let attempt_id = self.book.begin_attempt(&req_id, &self.id, state).await?;

        let span = crate::traced::attempt_span(self.book.as_ref(), &req_id, state, &self.id).await;
        let result = self.resume_renewing(&req_id).instrument(span).await;
        let terminal = matches!(&result, Ok(Resumed { unknown: None, .. }));
        self.record(&req_id, attempt_id, result).await?;
        Ok(Some(terminal))
    }

    /// Records how an attempt ended and releases the lease, in one transaction: the attempt's end
    /// is visible no later than the lease's release, so a later holder's attempt starts after it.
    async fn record(
        &self,
        key: &ReqId,
        attempt_id: i64,
        result: Result<Resumed, CoordinatorError>,
    ) -> Result<(), CoordinatorError> {
        let category = error_category(&result);
        let end = AttemptEnd::of(key, &result);
        let refund_failed = end.backoff && end.state_after == Some(TransferState::Compensating);
        let refund_refused = refund_failed && category == Some(REFUSED_BY_TARGET);
        let policy = Policy {
            config: &self.config,
            backoff: end.backoff,
            refund_failed,
            refund_refused,
        };
        let attempt = AttemptRecord {
            attempt_id,
            req_id: *key,
            state_after: end.state_after,
            outcome: end.outcome,
            error: end.error.as_deref(),
            category,
            counts: end.counts,
            refund_failed,
        };
        let tally = self.book.record_attempt(&attempt, &policy).await?;
        if let Some(delay) = policy.retry_delay_ms(&tally) {
            tracing::warn!(req_id = %key, attempts = tally.attempts, next_retry_ms = delay, error = end.error.as_deref().unwrap_or(""), "transfer still open; retry scheduled");
        }
        if policy.alert_refund(&tally) {
            raise_refund_alert(key, refund_refused, tally.refund_failures, &end);
        }
        Ok(())
    }

    /// MON-001: raises a CRITICAL alert, once per transfer across all workers, for each transfer
    /// in TARGET_PENDING longer than the threshold. Returns how many it raised.
    async fn alert_stuck_target_pending(&self) -> Result<usize, CoordinatorError> {
        let raised = self
            .book
            .mark_stuck_target_pending(millis(self.config.target_pending_alert_after))
            .await?;
        for (req_id, age_ms) in &raised {
            tracing::error!(
                alert = "CRITICAL",
                code = "MON-001",
                %req_id,
                age_ms,
                "CRITICAL MON-001: transfer {req_id} stuck in TARGET_PENDING for {age_ms} ms"
            );
        }
        Ok(raised.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_and_stops_at_the_cap() {
        let c = RecoveryConfig {
            backoff_ms_base: 100,
            backoff_ms_max: 1_000,
            ..RecoveryConfig::default()
        };
        let delays: Vec<u64> = (1..=7).map(|a| c.backoff_ms(a)).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1_000, 1_000, 1_000]);
        assert_eq!(c.backoff_ms(0), 100);
        assert_eq!(c.backoff_ms(i32::MAX), 1_000);
    }
}
