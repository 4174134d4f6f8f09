//! What one relay process knows about itself, as atomics any task may read (the edge, a bench,
//! a test): whether it leads, how far JetStream acknowledged, its lag and its last error. The
//! cluster-wide view, the same from every instance, is [`crate::status`].

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};

#[derive(Debug, Default)]
pub struct RelayStats {
    leader: AtomicBool,
    published: AtomicU64,
    acked_position: AtomicI64,
    lag_positions: AtomicI64,
    lag_millis: AtomicI64,
    lag_alerts: AtomicU64,
    last_error: Mutex<Option<(DateTime<Utc>, String)>>,
}

impl RelayStats {
    /// Whether this process holds the stream's lock and publishes.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::Relaxed);
    }

    /// Events this process published and JetStream acknowledged (a rate is its derivative).
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// The last feed position JetStream acknowledged (0 before the first).
    pub fn acked_position(&self) -> i64 {
        self.acked_position.load(Ordering::Relaxed)
    }

    pub(crate) fn acked(&self, position: i64, count: u64) {
        self.acked_position.store(position, Ordering::Relaxed);
        self.published.fetch_add(count, Ordering::Relaxed);
    }

    pub(crate) fn resumed_at(&self, position: i64) {
        self.acked_position.store(position, Ordering::Relaxed);
    }

    /// Positions behind the feed's head, and the age in milliseconds of the oldest event not
    /// relayed yet, as last measured by the lag monitor.
    pub fn lag(&self) -> (i64, i64) {
        (
            self.lag_positions.load(Ordering::Relaxed),
            self.lag_millis.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn set_lag(&self, positions: i64, millis: i64) {
        self.lag_positions.store(positions, Ordering::Relaxed);
        self.lag_millis.store(millis, Ordering::Relaxed);
    }

    /// RELAY-LAG alerts this process raised.
    pub fn lag_alerts(&self) -> u64 {
        self.lag_alerts.load(Ordering::Relaxed)
    }

    pub(crate) fn lag_alert_raised(&self) {
        self.lag_alerts.fetch_add(1, Ordering::Relaxed);
    }

    /// The last error and when it happened.
    pub fn last_error(&self) -> Option<(DateTime<Utc>, String)> {
        self.last_error.lock().map(|e| e.clone()).unwrap_or(None)
    }

    pub(crate) fn set_error(&self, error: &str) {
        if let Ok(mut slot) = self.last_error.lock() {
            *slot = Some((Utc::now(), error.to_owned()));
        }
    }
}
