//! Simulated time (`SimClock`): the executor's clock and timers, req_ids from its time and the
//! run's random source.

use std::sync::Arc;
use std::time::Duration;

use application::Clock;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use domain::ReqId;

use crate::exec::Rt;

/// Simulated time; req_ids from its time and the run's random source.
#[derive(Debug, Clone)]
pub struct SimClock {
    pub rt: Arc<Rt>,
}

#[async_trait]
impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        let ms = i64::try_from(self.rt.now_ms()).unwrap_or(i64::MAX);
        DateTime::from_timestamp_millis(ms).unwrap_or_default()
    }

    fn now_ms(&self) -> u64 {
        self.rt.now_ms()
    }

    async fn sleep(&self, duration: Duration) {
        self.rt.sleep(duration).await;
    }

    fn req_id(&self) -> ReqId {
        let random = self.rt.with_rng(|r| r.ulid_random());
        ReqId::from_parts(self.rt.now_ms(), random)
    }
}
