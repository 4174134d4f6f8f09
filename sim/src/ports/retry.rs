//! The recovery worker's retry book in memory (`SimRetryBook`): due transfers, the attempt
//! log, backoff and alerts.

use application::CoordinatorError;
use async_trait::async_trait;
use domain::{ReqId, TransferState};
use recovery::{AttemptPolicy, AttemptRecord, RetryBook, Tally};

use crate::world::{short, RetryRow};

use super::{lease_free, store_error, Sim};

/// The retry book in memory.
#[derive(Debug, Clone)]
pub struct SimRetryBook {
    pub sim: Sim,
}

#[async_trait]
impl RetryBook for SimRetryBook {
    async fn due(
        &self,
        stale_ms: i64,
        limit: i64,
    ) -> Result<Vec<(ReqId, TransferState)>, CoordinatorError> {
        self.sim
            .store("retry.due", |w| {
                let now = w.now_ms;
                let stale = u64::try_from(stale_ms).unwrap_or(0);
                let mut due: Vec<(u64, String, TransferState)> = w
                    .log
                    .iter()
                    .filter(|(_, s)| s.recorded_at_ms.saturating_add(stale) <= now)
                    .filter_map(|(id, s)| {
                        let state = s.state.filter(|st| !st.is_terminal())?;
                        match w.retries.get(id) {
                            None => Some((s.recorded_at_ms, id.clone(), state)),
                            Some(r) if r.next_retry_at_ms <= now && lease_free(r, now) => {
                                Some((r.next_retry_at_ms, id.clone(), state))
                            }
                            Some(_) => None,
                        }
                    })
                    .collect();
                due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
                due.truncate(usize::try_from(limit).unwrap_or(0));
                due.into_iter()
                    .map(|(_, id, st)| {
                        let id = ReqId::parse(&id).map_err(|_| {
                            CoordinatorError::invariant("stored req_id is malformed")
                        })?;
                        Ok((id, st))
                    })
                    .collect()
            })
            .await
    }

    async fn begin_attempt(
        &self,
        req_id: &ReqId,
        worker: &str,
        state_before: TransferState,
    ) -> Result<i64, CoordinatorError> {
        let req_id = req_id.to_string();
        self.sim
            .store("retry.begin", |w| {
                w.attempts += 1;
                let n = w.attempts;
                w.note(|| {
                    format!(
                        "attempt {n} on {} by {worker} from {state_before}",
                        short(&req_id)
                    )
                });
                Ok(n)
            })
            .await
    }

    async fn record_attempt(
        &self,
        a: &AttemptRecord<'_>,
        policy: &dyn AttemptPolicy,
    ) -> Result<Tally, CoordinatorError> {
        self.sim
            .store("retry.record", |w| {
                let now = w.now_ms;
                let key = a.req_id.to_string();
                let row = w
                    .retries
                    .get_mut(&key)
                    .ok_or_else(|| store_error("no retry row"))?;
                if let Some(s) = a.state_after {
                    row.state = s.as_str().to_owned();
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
                let outcome = a.outcome;
                w.note(|| format!("attempt on {} ended {outcome}", short(&key)));
                Ok(tally)
            })
            .await
    }

    async fn mark_stuck_target_pending(
        &self,
        older_than_ms: i64,
    ) -> Result<Vec<(String, i64)>, CoordinatorError> {
        self.sim
            .store("retry.stuck", |w| {
                let now = w.now_ms;
                let older = u64::try_from(older_than_ms).unwrap_or(0);
                let stuck: Vec<(String, u64)> = w
                    .log
                    .iter()
                    .filter(|(_, s)| s.state == Some(TransferState::TargetPending))
                    .filter(|(_, s)| s.recorded_at_ms.saturating_add(older) <= now)
                    .map(|(id, s)| (id.clone(), s.recorded_at_ms))
                    .collect();
                let mut raised = Vec::new();
                for (id, at) in stuck {
                    let row = w.retries.entry(id.clone()).or_insert_with(|| RetryRow {
                        state: "TARGET_PENDING".to_owned(),
                        next_retry_at_ms: now,
                        ..RetryRow::default()
                    });
                    if !row.stuck_alerted {
                        row.stuck_alerted = true;
                        raised.push((id, i64::try_from(now - at).unwrap_or(i64::MAX)));
                    }
                }
                Ok(raised)
            })
            .await
    }

    async fn heartbeat(&self, _worker: &str) -> Result<(), CoordinatorError> {
        self.sim.store("retry.heartbeat", |_| Ok(())).await
    }
}
