//! RELAY-LAG: the relay's lag, measured every second from PostgreSQL (positions behind the feed's
//! head, age of the oldest event not relayed yet); above the threshold the leader raises
//! `CRITICAL RELAY-LAG relay lag` once per episode and counts it in `relay_checkpoint.lag_alerts`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::{checkpoint, RelayConfig, RelayStats};

/// How often the lag is measured.
const INTERVAL: Duration = Duration::from_secs(1);

/// Whether a lag of `lag_ms` is over the threshold.
pub(crate) fn over(lag_ms: i64, threshold: Duration) -> bool {
    lag_ms > i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX)
}

/// Runs until aborted.
pub(crate) async fn watch_lag(pool: PgPool, config: RelayConfig, stats: Arc<RelayStats>) {
    let mut alerting = false;
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let status = match checkpoint::status_of(&pool, &config.stream).await {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "relay lag unreadable");
                continue;
            }
        };
        // Whole milliseconds are all an alert needs.
        #[allow(clippy::float_arithmetic)]
        let lag_ms = (status.lag_seconds * 1000.0) as i64;
        stats.set_lag(status.lag_positions, lag_ms);
        if !stats.is_leader() {
            alerting = false;
            continue;
        }
        let over_now = over(lag_ms, config.lag_alert);
        if over_now && !alerting {
            tracing::error!(
                stream = %config.stream,
                lag_positions = status.lag_positions,
                lag_ms,
                threshold_ms = config.lag_alert.as_millis() as u64,
                last_error = status.last_error.as_deref().unwrap_or(""),
                "CRITICAL RELAY-LAG relay lag {lag_ms} ms ({} positions) behind the feed exceeds {} ms",
                status.lag_positions,
                config.lag_alert.as_millis()
            );
            stats.lag_alert_raised();
            if let Err(e) = checkpoint::record_lag_alert(&pool, &config.stream).await {
                tracing::warn!(error = %e, "could not count the RELAY-LAG alert");
            }
        } else if !over_now && alerting {
            tracing::info!(stream = %config.stream, lag_ms, "RELAY-LAG relay lag back under the threshold");
        }
        alerting = over_now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_exclusive() {
        let t = Duration::from_millis(60_000);
        assert!(!over(60_000, t));
        assert!(over(60_001, t));
        assert!(!over(0, t));
    }
}
