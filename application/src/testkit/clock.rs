//! A manual clock: time moves only when a test (or a `sleep`) moves it, and req_ids are ULIDs
//! of that time and a counter, so every run of a test sees the same values.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use domain::ReqId;

use crate::ports::Clock;
use crate::testkit::exec::YieldOnce;

/// 2026-03-02T10:00:00Z: every scenario starts here, far from a UTC midnight.
pub const START_MS: u64 = 1_772_445_600_000;

/// Manual time shared by a scenario's ports and processes. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TestClock {
    now_ms: Arc<AtomicU64>,
    minted: Arc<AtomicU64>,
}

impl Default for TestClock {
    fn default() -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(START_MS)),
            minted: Arc::default(),
        }
    }
}

impl TestClock {
    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

#[async_trait]
impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        let ms = i64::try_from(self.now_ms()).unwrap_or(i64::MAX);
        DateTime::from_timestamp_millis(ms).unwrap_or_default()
    }

    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    /// Yields to the executor once, then moves time on by `duration` and returns: a process
    /// that sleeps lets the executor see a crash elsewhere in it (a recovery worker's lease
    /// renewal beside a drive that will never answer), and nothing else runs meanwhile.
    async fn sleep(&self, duration: Duration) {
        YieldOnce::new().await;
        self.advance(duration);
    }

    fn req_id(&self) -> ReqId {
        let n = self.minted.fetch_add(1, Ordering::SeqCst) + 1;
        ReqId::from_parts(self.now_ms(), u128::from(n))
    }
}
