//! Rate limits (contract §5.4): requests per second per user (in this process's
//! memory), and the daily count and amount (in PostgreSQL, enforced by the coordinator so every
//! `ledger serve` process shares them). The `ledger` binary's settings read their values.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use application::DailyLimits;
use domain::{ErrorCode, UserId};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::Quota;

/// The values of contract §5.4, the defaults of `ledger up` and `ledger serve`.
pub const RATE_PER_SECOND_DEFAULT: u32 = 10;
pub const DAILY_COUNT_MAX_DEFAULT: u64 = 100;

/// Checks between two sweeps of the users the limiter no longer needs to remember.
const RETAIN_EVERY_CHECKS: u64 = 4096;

/// The per-second limiter is the core's rate gate.
impl application::RateGate for RateLimiter {
    fn admit(&self, user: UserId) -> Result<(), ErrorCode> {
        self.check(user)
    }
}

/// Every limit the edge and the coordinator apply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitsConfig {
    pub requests_per_second: Option<u32>,
    pub daily: DailyLimits,
}

impl LimitsConfig {
    /// No limit at all: what an in-process server starts with.
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// Contract §5.4's defaults: 10 requests per second and 100 transfers per day per user; no daily
    /// amount limit unless one is configured per asset.
    pub fn seed_defaults() -> Self {
        Self {
            requests_per_second: Some(RATE_PER_SECOND_DEFAULT),
            daily: DailyLimits {
                count_max: Some(DAILY_COUNT_MAX_DEFAULT),
                amount_max: BTreeMap::new(),
            },
        }
    }
}

/// governor's keyed limiter on clock `C`.
type Keyed<C> = governor::RateLimiter<
    UserId,
    DashMapStateStore<UserId>,
    C,
    NoOpMiddleware<<C as Clock>::Instant>,
>;

/// Per user: `per_second` requests at once, then one more every `1/per_second` s (governor's
/// GCRA, so never more than the limit in a burst and no doubled burst across a second boundary
/// as a fixed window has). A refusal's wait is at most 1 s, which the 429's `Retry-After: 1`
/// states. Per process on purpose: a second is too short for a database round trip to be worth
/// it, and N processes allow at most N times the rate.
pub struct RateLimiter<C: Clock = DefaultClock> {
    per_second: Option<u32>,
    /// None when off or when the limit is 0 (every request refused).
    limiter: Option<Keyed<C>>,
    checks: AtomicU64,
}

impl<C: Clock> std::fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("per_second", &self.per_second)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    pub fn new(per_second: Option<u32>) -> Self {
        Self::with_clock(per_second, DefaultClock::default())
    }
}

impl<C: Clock> RateLimiter<C> {
    /// The same on a given clock (tests pass governor's `FakeRelativeClock`).
    pub fn with_clock(per_second: Option<u32>, clock: C) -> Self {
        let limiter = per_second
            .and_then(NonZeroU32::new)
            .map(|n| governor::RateLimiter::dashmap_with_clock(Quota::per_second(n), clock));
        Self {
            per_second,
            limiter,
            checks: AtomicU64::new(0),
        }
    }

    /// Counts one request of `user` now; RATE_LIMIT_EXCEEDED past the limit.
    pub fn check(&self, user: UserId) -> Result<(), ErrorCode> {
        let Some(max) = self.per_second else {
            return Ok(());
        };
        let Some(limiter) = &self.limiter else {
            debug_assert_eq!(max, 0);
            return Err(ErrorCode::RateLimitExceeded);
        };
        // The keyed limiter keeps one entry per user it has seen. Every RETAIN_EVERY_CHECKS
        // checks (here, not in a background task) it forgets the users whose state is back to
        // that of a new user, i.e. not seen for about a second: memory stays bounded by the
        // users active in the last second plus at most RETAIN_EVERY_CHECKS others.
        if self.checks.fetch_add(1, Ordering::Relaxed) % RETAIN_EVERY_CHECKS
            == RETAIN_EVERY_CHECKS - 1
        {
            limiter.retain_recent();
        }
        limiter
            .check_key(&user)
            .map_err(|_| ErrorCode::RateLimitExceeded)
    }

    /// Users remembered right now (tests check the sweep).
    #[cfg(test)]
    fn users_tracked(&self) -> usize {
        self.limiter.as_ref().map_or(0, |l| l.len())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use governor::clock::FakeRelativeClock;

    use super::*;

    fn user(n: u64) -> UserId {
        UserId::new(n).unwrap()
    }

    #[test]
    fn the_limit_holds_per_user_and_per_second() {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::with_clock(Some(2), clock.clone());
        assert!(limiter.check(user(1)).is_ok());
        assert!(limiter.check(user(1)).is_ok());
        assert_eq!(limiter.check(user(1)), Err(ErrorCode::RateLimitExceeded));
        assert!(limiter.check(user(2)).is_ok(), "another user");
        clock.advance(Duration::from_secs(1));
        assert!(limiter.check(user(1)).is_ok(), "the next second");
    }

    #[test]
    fn no_limit_means_no_refusal() {
        let limiter = RateLimiter::with_clock(None, FakeRelativeClock::default());
        for _ in 0..1000 {
            assert!(limiter.check(user(1)).is_ok());
        }
        let limiter = RateLimiter::new(None);
        assert!(limiter.check(user(1)).is_ok());
    }

    #[test]
    fn a_zero_limit_refuses_everything() {
        let limiter = RateLimiter::new(Some(0));
        assert_eq!(limiter.check(user(1)), Err(ErrorCode::RateLimitExceeded));
    }

    #[test]
    fn users_not_seen_for_a_second_are_forgotten() {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::with_clock(Some(10), clock.clone());
        for n in 1..=100 {
            assert!(limiter.check(user(n)).is_ok());
        }
        assert_eq!(limiter.users_tracked(), 100);
        clock.advance(Duration::from_secs(2));
        for _ in 0..RETAIN_EVERY_CHECKS {
            // One user, refilled by the clock as it goes: never refused.
            clock.advance(Duration::from_millis(100));
            assert!(limiter.check(user(1_000)).is_ok());
        }
        assert_eq!(limiter.users_tracked(), 1);
    }
}
