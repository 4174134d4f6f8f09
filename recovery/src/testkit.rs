//! Test support (feature `testkit`, enabled by test code only: this crate's tests and `sim`): the
//! retry book in memory, `MemRetryBook`: due transfers from the testkit's event log and the
//! `transfer_retries` rows the leases share (`application::testkit::Durable`), the attempt log
//! kept beside them. Its calls go through the testkit's store, so the store's hook decides their
//! faults (`StoreCall::RetryBook`) like any store call's, and sees each attempt begin and end.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::book::{AttemptPolicy, AttemptRecord, RetryBook, Tally};
use application::testkit::{RetryRow, Seen, Store, StoreCall};
use application::CoordinatorError;
use async_trait::async_trait;
use domain::{ReqId, TransferState};

/// One row of the attempt log (`recovery_attempts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub req_id: ReqId,
    pub worker: String,
    pub state_before: TransferState,
    pub state_after: Option<TransferState>,
    /// `None` while it runs (or when its worker died).
    pub outcome: Option<&'static str>,
    pub category: Option<&'static str>,
}

/// The worker's own rows: the attempt log and the heartbeats.
#[derive(Debug, Default)]
pub struct BookRows {
    pub attempts: Vec<Attempt>,
    pub heartbeats: u64,
}

/// The retry book in memory. Cheap to clone; clones share the rows.
#[derive(Debug, Clone)]
pub struct MemRetryBook {
    pub store: Store,
    rows: Arc<Mutex<BookRows>>,
}

impl MemRetryBook {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            rows: Arc::default(),
        }
    }

    /// The attempt log and heartbeats, locked.
    pub fn rows(&self) -> MutexGuard<'_, BookRows> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl RetryBook for MemRetryBook {
    async fn due(
        &self,
        stale_ms: i64,
        limit: i64,
    ) -> Result<Vec<(ReqId, TransferState)>, CoordinatorError> {
        self.store
            .call(StoreCall::RetryBook, |rows, now| {
                let stale = u64::try_from(stale_ms).unwrap_or(0);
                let mut due: Vec<(u64, ReqId, TransferState)> = rows
                    .streams
                    .iter()
                    .filter(|(_, s)| s.recorded_at_ms.saturating_add(stale) <= now)
                    .filter_map(|(id, s)| {
                        let state = s.state().filter(|st| !st.is_terminal())?;
                        match rows.retries.get(id) {
                            None => Some((s.recorded_at_ms, *id, state)),
                            Some(r) if r.next_retry_at_ms <= now && r.lease_free(now) => {
                                Some((r.next_retry_at_ms, *id, state))
                            }
                            Some(_) => None,
                        }
                    })
                    .collect();
                due.sort_by_key(|(at, id, _)| (*at, *id));
                due.truncate(usize::try_from(limit).unwrap_or(0));
                Ok(due.into_iter().map(|(_, id, st)| (id, st)).collect())
            })
            .await
    }

    async fn begin_attempt(
        &self,
        req_id: &ReqId,
        worker: &str,
        state_before: TransferState,
    ) -> Result<i64, CoordinatorError> {
        let attempt = Attempt {
            req_id: *req_id,
            worker: worker.to_owned(),
            state_before,
            state_after: None,
            outcome: None,
            category: None,
        };
        let book = Arc::clone(&self.rows);
        let store = &self.store;
        store
            .call(StoreCall::RetryBook, move |rows, _| {
                let mut book = book.lock().unwrap_or_else(|e| e.into_inner());
                book.attempts.push(attempt);
                let attempt = i64::try_from(book.attempts.len()).unwrap_or(i64::MAX);
                let seen = Seen::AttemptBegun {
                    attempt,
                    req_id: *req_id,
                    worker,
                    state_before,
                };
                store.seen(rows, seen);
                Ok(attempt)
            })
            .await
    }

    async fn record_attempt(
        &self,
        a: &AttemptRecord<'_>,
        policy: &dyn AttemptPolicy,
    ) -> Result<Tally, CoordinatorError> {
        let book = Arc::clone(&self.rows);
        let store = &self.store;
        store
            .call(StoreCall::RetryBook, |rows, now| {
                let mut book = book.lock().unwrap_or_else(|e| e.into_inner());
                let index = usize::try_from(a.attempt_id - 1).unwrap_or(usize::MAX);
                if let Some(entry) = book.attempts.get_mut(index) {
                    entry.state_after = a.state_after;
                    entry.outcome = Some(a.outcome);
                    entry.category = a.category;
                }
                let row = rows
                    .retries
                    .get_mut(&a.req_id)
                    .ok_or_else(|| CoordinatorError::invariant("no retry row"))?;
                let tally = record(row, a, policy, now)?;
                let (req_id, outcome) = (a.req_id, a.outcome);
                store.seen(rows, Seen::AttemptEnded { req_id, outcome });
                Ok(tally)
            })
            .await
    }

    async fn mark_stuck_target_pending(
        &self,
        older_than_ms: i64,
    ) -> Result<Vec<(String, i64)>, CoordinatorError> {
        self.store
            .call(StoreCall::RetryBook, |rows, now| {
                let older = u64::try_from(older_than_ms).unwrap_or(0);
                let stuck: Vec<(ReqId, u64)> = rows
                    .streams
                    .iter()
                    .filter(|(_, s)| s.state() == Some(TransferState::TargetPending))
                    .filter(|(_, s)| s.recorded_at_ms.saturating_add(older) <= now)
                    .map(|(id, s)| (*id, s.recorded_at_ms))
                    .collect();
                let mut raised = Vec::new();
                for (id, at) in stuck {
                    let row = rows.retries.entry(id).or_insert_with(|| RetryRow {
                        state: Some(TransferState::TargetPending),
                        next_retry_at_ms: now,
                        ..RetryRow::default()
                    });
                    if !row.stuck_alerted {
                        row.stuck_alerted = true;
                        let age = i64::try_from(now - at).unwrap_or(i64::MAX);
                        raised.push((id.to_string(), age));
                    }
                }
                Ok(raised)
            })
            .await
    }

    async fn heartbeat(&self, _worker: &str) -> Result<(), CoordinatorError> {
        let rows = Arc::clone(&self.rows);
        self.store
            .call(StoreCall::RetryBook, move |_, _| {
                rows.lock().unwrap_or_else(|e| e.into_inner()).heartbeats += 1;
                Ok(())
            })
            .await
    }
}

/// `record_attempt`'s update of the transfer's row: count, release the lease, schedule, alert.
fn record(
    row: &mut RetryRow,
    a: &AttemptRecord<'_>,
    policy: &dyn AttemptPolicy,
    now: u64,
) -> Result<Tally, CoordinatorError> {
    if let Some(state) = a.state_after {
        row.state = Some(state);
    }
    row.attempts += i32::from(a.counts);
    row.refund_failures += i32::from(a.refund_failed);
    if a.category.is_some() {
        row.last_error_category = a.category;
    }
    row.lease_owner = None;
    row.lease_until_ms = None;
    let tally = Tally {
        attempts: row.attempts,
        refund_failures: row.refund_failures,
        refund_not_alerted: !row.refund_alerted,
    };
    if let Some(delay) = policy.retry_delay_ms(&tally) {
        row.next_retry_at_ms = now.saturating_add(delay);
    }
    if policy.alert_refund(&tally) {
        row.refund_alerted = true;
    }
    Ok(tally)
}
