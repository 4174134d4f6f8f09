//! The halt flag (MON-003): after a fund-conservation violation no new transfer starts until an
//! admin clears it. Kept in a store every serving process shares (`stores::HaltFlag`;
//! PostgreSQL's `service_halt` in production), and cached briefly per process.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::stores::HaltFlag;

/// How long a read of the halt flag is trusted. The flag is in PostgreSQL so every process sees
/// it; reading it for every transfer cost one round trip per request, a fifth of the database's
/// transactions under load. A halt set by another process (or the periodic check) therefore
/// takes effect here within this long; one set or cleared through this process at once.
pub const HALT_CACHE_TTL: Duration = Duration::from_millis(100);

/// The last halt flag read by this process and when, per database.
#[derive(Debug, Default)]
pub struct HaltCache {
    last: Mutex<Option<(Instant, bool)>>,
}

impl HaltCache {
    fn fresh(&self) -> Option<bool> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.filter(|(at, _)| at.elapsed() < HALT_CACHE_TTL)
            .map(|(_, halted)| halted)
    }

    fn store(&self, halted: bool) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), halted));
    }

    /// Forgets the cached value, so the next request reads the flag.
    pub fn invalidate(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether transfers are halted, from the cache while it is fresh.
    pub async fn is_halted(&self, flag: &dyn HaltFlag) -> Result<bool, StoreError> {
        if let Some(halted) = self.fresh() {
            return Ok(halted);
        }
        let halted = flag.is_halted().await?;
        self.store(halted);
        Ok(halted)
    }
}
