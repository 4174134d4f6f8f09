//! The sweeper: periodically resumes transfers that have sat in a non-terminal state for longer
//! than a threshold. The full retry engine (backoff, leases, alerts) builds on this.

use std::time::Duration;

use chrono::Utc;
use domain::ReqId;

use crate::coordinator::{Coordinator, CoordinatorError};

/// Resumes stale open transfers every `interval`.
pub struct Sweeper {
    coordinator: Coordinator,
    /// How long a transfer must sit unchanged before the sweeper touches it; keeps the sweeper out
    /// of the way of a request that is still driving its own transfer.
    pub stale_after: Duration,
    pub interval: Duration,
    pub batch_max: i64,
}

impl Sweeper {
    pub fn new(coordinator: Coordinator) -> Self {
        Self {
            coordinator,
            stale_after: Duration::from_secs(5),
            interval: Duration::from_secs(2),
            batch_max: 100,
        }
    }

    /// One pass: drives every stale open transfer once. Returns how many it touched.
    pub async fn sweep_once(&self) -> Result<usize, CoordinatorError> {
        let cutoff = Utc::now()
            - chrono::Duration::from_std(self.stale_after).unwrap_or(chrono::Duration::zero());
        let rows = self
            .coordinator
            .view()
            .open_transfers(cutoff, self.batch_max)
            .await?;
        let count = rows.len();
        for row in rows {
            let Ok(req_id) = ReqId::parse(&row.req_id) else {
                tracing::error!(req_id = %row.req_id, "malformed req_id in transfers_view");
                continue;
            };
            match self.coordinator.drive(&req_id).await {
                Ok(data) => {
                    tracing::info!(%req_id, state = %data.state, "sweeper resumed transfer")
                }
                Err(CoordinatorError::Conflict) => {}
                Err(e) => tracing::warn!(%req_id, error = %e, "sweeper could not resume transfer"),
            }
        }
        Ok(count)
    }

    /// Runs forever: one pass at start-up, then one per interval.
    pub async fn run(self) {
        loop {
            if let Err(e) = self.sweep_once().await {
                tracing::warn!(error = %e, "sweep failed");
            }
            tokio::time::sleep(self.interval).await;
        }
    }
}
