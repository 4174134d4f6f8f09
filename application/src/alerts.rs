//! Alerts kept for operators to read back (`stores::AlertLog`; `alerts`, migration 0018), and
//! MON-004: a user whose transfer requests exceed a configured frequency raises a WARNING alert.
//!
//! The frequency is watched in this process's memory by [`FrequencyMonitor`] (per user, a
//! sliding minute estimated from two fixed one-minute buckets, so one small entry per user
//! whatever the rate) and wraps the per-second [`RateGate`] as [`WatchedGate`]: every transfer
//! request that reaches the gate is counted, and a refusal by the gate (`RATE_LIMIT_EXCEEDED`)
//! is counted apart. An episode starts when either count goes over its threshold and ends when
//! both are back under half of it; each episode is logged (`WARNING MON-004 ...`), stored in `alerts` and
//! counted in `alert_totals` once. Users not seen for two windows are forgotten.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::stores::AlertLog;
use domain::{ErrorCode, UserId};

use crate::ledger::RateGate;

/// The request-frequency alert's code.
pub const MON_004: &str = "MON-004";

/// Rows `alerts` keeps; older ones are deleted as new ones arrive.
pub const ALERTS_KEPT: i64 = 10_000;

/// The sliding window the frequency is measured over.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Requests in a sliding minute above which a user raises MON-004, unless configured otherwise.
pub const REQUESTS_PER_MINUTE_DEFAULT: u32 = 300;

/// Rate-limit refusals in a sliding minute above which a user raises MON-004.
pub const REFUSALS_PER_MINUTE_DEFAULT: u32 = 30;

/// Users remembered at most; past it, new users are not watched until a sweep frees room.
pub const USERS_TRACKED_MAX: usize = 1_000_000;

/// Observations between two sweeps of idle users.
const SWEEP_EVERY: u64 = 4096;

/// MON-004's thresholds; `None` turns that count's alert off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrequencyConfig {
    pub requests_per_minute: Option<u32>,
    pub refusals_per_minute: Option<u32>,
}

impl Default for FrequencyConfig {
    fn default() -> Self {
        Self {
            requests_per_minute: Some(REQUESTS_PER_MINUTE_DEFAULT),
            refusals_per_minute: Some(REFUSALS_PER_MINUTE_DEFAULT),
        }
    }
}

pub use crate::stores::StoredAlert;

/// One user's counts: the current one-minute bucket and the one before it.
#[derive(Debug, Clone, Copy)]
struct UserWindow {
    bucket: u64,
    requests: [u32; 2],
    refusals: [u32; 2],
    alerting: bool,
}

impl UserWindow {
    fn new(bucket: u64) -> Self {
        Self {
            bucket,
            requests: [0; 2],
            refusals: [0; 2],
            alerting: false,
        }
    }

    /// Moves to `bucket`: the current counts become the previous ones (or none, after a gap).
    fn roll(&mut self, bucket: u64) {
        if bucket == self.bucket {
            return;
        }
        let previous = if bucket == self.bucket + 1 {
            (self.requests[1], self.refusals[1])
        } else {
            (0, 0)
        };
        self.requests = [previous.0, 0];
        self.refusals = [previous.1, 0];
        self.bucket = bucket;
    }
}

/// A sliding-window estimate: the current bucket plus the part of the previous one the window
/// still covers.
#[allow(clippy::float_arithmetic)]
fn estimate(counts: [u32; 2], into_bucket: f64) -> f64 {
    f64::from(counts[0]) * (1.0 - into_bucket) + f64::from(counts[1])
}

/// The start of a MON-004 episode: what went over, for the log line and the stored detail.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    pub user: UserId,
    /// Requests in the last minute (estimated) and the threshold.
    pub requests: f64,
    pub requests_max: Option<u32>,
    /// Rate-limit refusals in the last minute (estimated) and the threshold.
    pub refusals: f64,
    pub refusals_max: Option<u32>,
}

impl Episode {
    /// The alert's text.
    pub fn detail(&self) -> String {
        let limit = |m: Option<u32>| m.map_or_else(|| "off".to_owned(), |m| m.to_string());
        format!(
            "user {} made {:.0} transfer requests (threshold {}) and had {:.0} rate-limit \
             refusals (threshold {}) in the last minute",
            self.user,
            self.requests,
            limit(self.requests_max),
            self.refusals,
            limit(self.refusals_max)
        )
    }
}

/// Per-user request frequency in this process's memory; bounded by the users seen in the last
/// two minutes (and [`USERS_TRACKED_MAX`]).
#[derive(Debug)]
pub struct FrequencyMonitor {
    config: FrequencyConfig,
    origin: Instant,
    users: Mutex<HashMap<UserId, UserWindow>>,
    observed: AtomicU64,
}

impl FrequencyMonitor {
    pub fn new(config: FrequencyConfig) -> Self {
        Self {
            config,
            origin: Instant::now(),
            users: Mutex::default(),
            observed: AtomicU64::new(0),
        }
    }

    /// Counts one request of `user` at `now` (`refused` when the rate gate refused it); the
    /// episode's start when this request took the user over a threshold.
    pub fn observe_at(&self, user: UserId, refused: bool, now: Instant) -> Option<Episode> {
        if self.config.requests_per_minute.is_none() && self.config.refusals_per_minute.is_none() {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.origin);
        let window_ms = WINDOW.as_millis().max(1);
        let bucket = u64::try_from(elapsed.as_millis() / window_ms).unwrap_or(u64::MAX);
        #[allow(clippy::float_arithmetic, clippy::cast_precision_loss)]
        let into_bucket = (elapsed.as_millis() % window_ms) as f64 / window_ms as f64;
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        if self.observed.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1
            || users.len() >= USERS_TRACKED_MAX
        {
            users.retain(|_, w| w.bucket + 1 >= bucket);
        }
        if users.len() >= USERS_TRACKED_MAX && !users.contains_key(&user) {
            return None;
        }
        let window = users.entry(user).or_insert_with(|| UserWindow::new(bucket));
        window.roll(bucket);
        window.requests[1] = window.requests[1].saturating_add(1);
        if refused {
            window.refusals[1] = window.refusals[1].saturating_add(1);
        }
        let requests = estimate(window.requests, into_bucket);
        let refusals = estimate(window.refusals, into_bucket);
        // An episode ends only once both counts are back under half their threshold, so a
        // rate hovering at the threshold is one episode, not one alert per crossing.
        #[allow(clippy::float_arithmetic)]
        let share = if window.alerting { 0.5 } else { 1.0 };
        #[allow(clippy::float_arithmetic)]
        let over = |count: f64, max: Option<u32>| max.is_some_and(|m| count > f64::from(m) * share);
        let over_now = over(requests, self.config.requests_per_minute)
            || over(refusals, self.config.refusals_per_minute);
        let started = over_now && !window.alerting;
        window.alerting = over_now;
        started.then_some(Episode {
            user,
            requests,
            requests_max: self.config.requests_per_minute,
            refusals,
            refusals_max: self.config.refusals_per_minute,
        })
    }

    /// Users remembered right now.
    pub fn users_tracked(&self) -> usize {
        self.users.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The per-second gate with MON-004 watching every request it sees.
pub struct WatchedGate {
    inner: Arc<dyn RateGate>,
    monitor: FrequencyMonitor,
    alerts: Arc<dyn AlertLog>,
}

impl std::fmt::Debug for WatchedGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedGate")
            .field("monitor", &self.monitor)
            .finish_non_exhaustive()
    }
}

impl WatchedGate {
    pub fn new(
        inner: Arc<dyn RateGate>,
        config: FrequencyConfig,
        alerts: Arc<dyn AlertLog>,
    ) -> Self {
        Self {
            inner,
            monitor: FrequencyMonitor::new(config),
            alerts,
        }
    }

    /// Logs the episode now and stores it in the background (the request does not wait for it;
    /// the task ends with the insert).
    fn raise(&self, episode: &Episode) {
        let detail = episode.detail();
        tracing::warn!(
            code = MON_004,
            user_id = %episode.user,
            "WARNING MON-004 abnormal request frequency: {detail}"
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("MON-004 not stored: no runtime");
            return;
        };
        let alerts = self.alerts.clone();
        let user = episode.user;
        runtime.spawn(async move {
            if let Err(e) = alerts.record(MON_004, "WARNING", Some(user), &detail).await {
                tracing::warn!(error = %e, "could not store the MON-004 alert");
            }
        });
    }
}

impl RateGate for WatchedGate {
    fn admit(&self, user: UserId) -> Result<(), ErrorCode> {
        let admitted = self.inner.admit(user);
        let refused = admitted == Err(ErrorCode::RateLimitExceeded);
        if let Some(episode) = self.monitor.observe_at(user, refused, Instant::now()) {
            self.raise(&episode);
        }
        admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(n: u64) -> UserId {
        UserId::new(n).unwrap()
    }

    fn monitor(requests: Option<u32>, refusals: Option<u32>) -> FrequencyMonitor {
        FrequencyMonitor::new(FrequencyConfig {
            requests_per_minute: requests,
            refusals_per_minute: refusals,
        })
    }

    #[test]
    fn mon_004_raised_once_per_episode_when_requests_exceed_the_threshold() {
        let m = monitor(Some(5), None);
        let t0 = m.origin;
        let raised: Vec<_> = (0..20)
            .filter_map(|i| m.observe_at(user(1), false, t0 + Duration::from_millis(i)))
            .collect();
        assert_eq!(raised.len(), 1, "one episode, not one alert per request");
        assert_eq!(raised[0].user, user(1));
        assert!(raised[0].detail().contains("threshold 5"), "{raised:?}");
        assert!(m.observe_at(user(2), false, t0).is_none(), "another user");
        // Two minutes later the rate is back under: a new burst is a new episode.
        let later = t0 + WINDOW * 2 + Duration::from_millis(1);
        assert!(m.observe_at(user(1), false, later).is_none());
        let again = (1..10)
            .filter_map(|i| m.observe_at(user(1), false, later + Duration::from_millis(i)))
            .count();
        assert_eq!(again, 1);
    }

    #[test]
    fn mon_004_counts_rate_limit_refusals_apart() {
        let m = monitor(Some(1000), Some(3));
        let t0 = m.origin;
        for i in 0..3 {
            assert!(m
                .observe_at(user(1), true, t0 + Duration::from_millis(i))
                .is_none());
        }
        let episode = m.observe_at(user(1), true, t0 + Duration::from_millis(4));
        assert!(episode.is_some_and(|e| e.refusals > 3.0));
    }

    #[test]
    fn the_sliding_minute_carries_the_previous_bucket_over() {
        let m = monitor(Some(10), None);
        let t0 = m.origin;
        // 8 requests late in the first minute, 4 early in the next: 12 in a sliding minute.
        for i in 0..8 {
            assert!(m
                .observe_at(user(1), false, t0 + Duration::from_millis(59_000 + i))
                .is_none());
        }
        let raised = (0..4)
            .filter_map(|i| {
                m.observe_at(
                    user(1),
                    false,
                    t0 + WINDOW + Duration::from_millis(1_000 + i),
                )
            })
            .count();
        assert_eq!(raised, 1);
    }

    #[test]
    fn idle_users_are_forgotten_and_off_means_nothing_is_kept() {
        let m = monitor(Some(1000), None);
        let t0 = m.origin;
        for n in 1..=100 {
            m.observe_at(user(n), false, t0);
        }
        assert_eq!(m.users_tracked(), 100);
        let later = t0 + WINDOW * 3;
        for i in 0..SWEEP_EVERY {
            m.observe_at(user(1_000), false, later + Duration::from_millis(i));
        }
        assert_eq!(m.users_tracked(), 1);
        let off = monitor(None, None);
        assert!(off.observe_at(user(1), true, t0).is_none());
        assert_eq!(off.users_tracked(), 0);
    }
}
