//! The halt flag (MON-003): after a fund-conservation violation no new transfer starts until an
//! admin clears it. Kept in PostgreSQL (`service_halt`) so every serving process sees it, and
//! cached briefly per process.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;

/// How long a read of the halt flag is trusted. The flag is in PostgreSQL so every process sees
/// it; reading it for every transfer cost one round trip per request, a fifth of the database's
/// transactions under load. A halt set by another process (or the periodic check) therefore
/// takes effect here within this long; one set or cleared through this process at once.
pub const HALT_CACHE_TTL: Duration = Duration::from_millis(100);

/// Sets the halt flag.
pub async fn halt(pool: &PgPool, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE service_halt SET halted = true, reason = $1, halted_at = now() WHERE NOT halted",
    )
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn is_halted(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT halted FROM service_halt")
        .fetch_one(pool)
        .await
}

/// Whether transfers are halted, and the reason given when they were.
pub async fn status(pool: &PgPool) -> Result<(bool, Option<String>), sqlx::Error> {
    let (halted, reason): (bool, Option<String>) =
        sqlx::query_as("SELECT halted, reason FROM service_halt")
            .fetch_one(pool)
            .await?;
    Ok((halted, reason.filter(|_| halted)))
}

/// Lifts the halt; `admin` is recorded as who cleared it.
pub async fn clear(pool: &PgPool, admin: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE service_halt SET halted = false, cleared_at = now(), cleared_by = $1")
        .bind(admin)
        .execute(pool)
        .await?;
    Ok(())
}

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
    pub async fn is_halted(&self, pool: &PgPool) -> Result<bool, sqlx::Error> {
        if let Some(halted) = self.fresh() {
            return Ok(halted);
        }
        let halted = is_halted(pool).await?;
        self.store(halted);
        Ok(halted)
    }
}
