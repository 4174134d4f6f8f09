//! The idempotency horizon: spot-core may forget the `(req_id, op)` records of every
//! `req_id` created before it, so its memory follows what is live, not the whole history.
//!
//! H = min(now − retention, ULID time of the oldest transfer that is not terminal). The oldest
//! open transfer is `min(req_id)` of `open_transfers` (kept by a trigger in the same commit as
//! the events; a ULID's text sorts by its time, and the primary key makes the read index-only).
//! [`Horizon::run`] computes it every interval and sends `advance_horizon` to spot-core, which
//! never moves backwards; the last value sent is kept to skip repeats.
//!
//! Why it is safe, even with several `ledger serve` processes each advancing it:
//! - An open transfer is never passed: a transfer open when H is read holds it back, and one
//!   created after the read has `req_id` time t_gen ≥ t_commit − d, where d is the time from the
//!   req_id's generation to its `TransferCreated` commit; since t_commit > t_read,
//!   t_gen > t_read − d ≥ t_read − retention ≥ H as long as d < retention. Fresh req_ids are
//!   generated right before the commit (d is milliseconds); a client key's claim is re-keyed once
//!   it is half a retention old (`submit.rs`), so d < retention / 2 + [`CLAIM_GRACE_MAX`]. The
//!   retention has a floor ([`RETENTION_MIN`]) so that holds with room to spare.
//! - A terminal transfer is never driven again, so no movement, cancel or lookup is ever sent
//!   under its req_id after it left `open_transfers`.
//! - Each process computes H from the same committed state and a clock; a process with an older
//!   view sends an older H, which spot-core ignores. A later H is only later in time, and every
//!   process's H satisfies the bound above on its own. Clocks count against the retention too: a
//!   ledger clock δ ahead of the one that made a req_id needs d + δ < retention (spot-core
//!   refuses a horizon ahead of its own clock).
//!
//! A transfer stuck open holds the horizon back for as long as it stays open (spot-core's memory
//! then grows with the traffic since it); once it is older than the retention that is logged at
//! warn level, naming it, each time the transfer holding the horizon changes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::books::{SpotBook, SpotError};
use crate::error::StoreError;
use crate::stores::OpenTransfers;

/// How long a `req_id` is remembered at least, unless configured otherwise: 7 days.
pub const RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest retention accepted: it must exceed the time between a req_id's generation and
/// its `TransferCreated` commit (see the module doc).
pub const RETENTION_MIN: Duration = Duration::from_secs(1);
/// How often the horizon is computed and sent, unless configured otherwise.
pub const INTERVAL_DEFAULT: Duration = Duration::from_secs(60);
/// The longest a request with a half-retention-old, orphan client-key claim waits before
/// re-keying it (`submit.rs`): bounds the creation delay the claim's first user may still be in.
pub const CLAIM_GRACE_MAX: Duration = Duration::from_secs(10);

/// The horizon's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HorizonConfig {
    /// Every req_id younger than this is remembered by spot-core.
    pub retention: Duration,
    /// Time between two computations.
    pub interval: Duration,
}

impl Default for HorizonConfig {
    fn default() -> Self {
        Self {
            retention: RETENTION_DEFAULT,
            interval: INTERVAL_DEFAULT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HorizonError {
    #[error("reading the oldest open transfer")]
    Store(#[from] StoreError),
    #[error("an open transfer's req_id is not a ULID: {0:?}")]
    NotUlid(String),
    #[error("spot-core")]
    Spot(#[from] SpotError),
}

impl HorizonError {
    /// Whether spot-core may have taken the horizon although the call failed (no answer after
    /// the request may have been sent). Sending it again at the next tick is safe either way:
    /// spot-core never moves its horizon backwards.
    pub fn spot_may_have_advanced(&self) -> bool {
        matches!(self, HorizonError::Spot(e) if e.outcome_unknown())
    }
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time (Unix ms) a ULID in its canonical 26-character form was created: its first ten
/// Crockford base32 characters. `None` when `text` is not such a ULID.
pub fn ulid_time_ms(text: &str) -> Option<u64> {
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    if text.len() != 26 {
        return None;
    }
    let mut ms: u64 = 0;
    for (i, c) in text.bytes().enumerate() {
        let digit = ALPHABET.iter().position(|a| *a == c)?;
        // 26 characters hold 130 bits; the first may only be 0..7 (128 bits).
        if i == 0 && digit > 7 {
            return None;
        }
        if i < 10 {
            ms = (ms << 5) | u64::try_from(digit).ok()?;
        }
    }
    Some(ms)
}

/// The horizon at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Computed {
    /// min(now − retention, creation time of the oldest open transfer), Unix ms.
    pub before_ms: u64,
    /// The open transfer holding the horizon back, when it is older than the retention.
    pub held_by: Option<String>,
}

/// The horizon now: the earlier of `now_ms − retention` and the creation time of the oldest
/// transfer that is not terminal.
pub async fn compute(
    open: &dyn OpenTransfers,
    retention: Duration,
    now_ms: u64,
) -> Result<Computed, HorizonError> {
    let oldest = open.oldest().await?;
    let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    let by_age = now_ms.saturating_sub(retention_ms);
    match oldest {
        None => Ok(Computed {
            before_ms: by_age,
            held_by: None,
        }),
        Some(req_id) => {
            let created =
                ulid_time_ms(&req_id).ok_or_else(|| HorizonError::NotUlid(req_id.clone()))?;
            Ok(Computed {
                before_ms: by_age.min(created),
                held_by: (created < by_age).then_some(req_id),
            })
        }
    }
}

/// The periodic task: computes the horizon and tells spot-core. Cheap to clone; the clones share
/// the last value sent.
#[derive(Clone)]
pub struct Horizon {
    open: Arc<dyn OpenTransfers>,
    spot: Arc<dyn SpotBook>,
    config: HorizonConfig,
    /// The last horizon spot-core accepted from this process (0: none yet).
    sent: Arc<AtomicU64>,
    /// The open transfer last reported as holding the horizon back.
    held_by: Arc<Mutex<Option<String>>>,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// spot-core was told `before_ms`; its horizon is now `horizon_ms` (later when another
    /// process advanced it further).
    Sent { before_ms: u64, horizon_ms: u64 },
    /// The horizon has not moved past what was already sent.
    Unchanged { before_ms: u64 },
}

impl Horizon {
    pub fn new(
        open: Arc<dyn OpenTransfers>,
        spot: Arc<dyn SpotBook>,
        config: HorizonConfig,
    ) -> Self {
        Self {
            open,
            spot,
            config,
            sent: Arc::default(),
            held_by: Arc::default(),
        }
    }

    /// The last horizon spot-core accepted from this process (0: none yet).
    pub fn last_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Computes the horizon and sends it when it is later than the last one sent.
    pub async fn step(&self) -> Result<Step, HorizonError> {
        let Computed { before_ms, held_by } =
            compute(self.open.as_ref(), self.config.retention, now_ms()).await?;
        self.report_held_by(held_by);
        if before_ms <= self.last_sent() {
            return Ok(Step::Unchanged { before_ms });
        }
        let status = self.spot.advance_horizon(before_ms).await?;
        self.sent.fetch_max(before_ms, Ordering::Relaxed);
        Ok(Step::Sent {
            before_ms,
            horizon_ms: status.horizon_ms,
        })
    }

    /// Warns when the transfer holding the horizon back past the retention changes.
    fn report_held_by(&self, held_by: Option<String>) {
        // A poisoned lock only means a writer panicked mid-assignment of an Option.
        let mut last = self.held_by.lock().unwrap_or_else(|e| e.into_inner());
        if *last == held_by {
            return;
        }
        if let Some(req_id) = &held_by {
            tracing::warn!(
                %req_id,
                retention_secs = self.config.retention.as_secs(),
                "an open transfer older than the retention holds the idempotency horizon back; \
                 spot-core's memory grows until it ends"
            );
        }
        *last = held_by;
    }

    /// Runs [`Horizon::step`] every interval forever. A step that fails (spot-core or the
    /// database down) is logged and tried again at the next tick: an older horizon is always
    /// safe, it only costs spot-core memory.
    pub async fn run(self) {
        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match self.step().await {
                Ok(Step::Sent {
                    before_ms,
                    horizon_ms,
                }) => tracing::debug!(before_ms, horizon_ms, "idempotency horizon advanced"),
                Ok(Step::Unchanged { .. }) => {}
                Err(e) => tracing::warn!(
                    error = %crate::error_chain(&e),
                    spot_may_have_advanced = e.spot_may_have_advanced(),
                    "idempotency horizon not advanced; trying again at the next tick"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ulid_says_when_it_was_made() {
        // The ULID specification's example.
        assert_eq!(
            ulid_time_ms("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
            Some(1_469_922_850_259)
        );
        assert_eq!(ulid_time_ms("00000000000000000000000000"), Some(0));
        assert_eq!(
            ulid_time_ms("7ZZZZZZZZZZZZZZZZZZZZZZZZZ"),
            Some((1 << 48) - 1)
        );
        for bad in [
            "",
            "01ARZ3NDEKTSV4RRFFQ69G5FA",
            "01arz3ndektsv4rrffq69g5fav",
            "01ARZ3NDEKTSV4RRFFQ69G5FAU",
            "81ARZ3NDEKTSV4RRFFQ69G5FAV",
        ] {
            assert_eq!(ulid_time_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_fresh_req_id_is_timed_now() {
        let before = now_ms();
        let id = domain::ReqId::generate().to_string();
        let at = ulid_time_ms(&id).unwrap();
        assert!(at >= before && at <= now_ms(), "{at} vs {before}");
    }
}
