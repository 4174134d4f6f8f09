//! Whether a server is the one to write to: the watcher's cadence, the one question asked of a
//! PostgreSQL session (`WRITABLE_SQL`) and its time limit.

use std::time::Duration;

use sqlx::PgConnection;

/// How often the watcher asks the current server whether it is still writable.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long one probe (connect, or the question on a kept connection) may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One statement answers whether a session may write: not in recovery (a standby, or a
/// promotion still under way) and not read-only by setting (libpq's `read-write` test).
pub const WRITABLE_SQL: &str =
    "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'";

/// Whether the session may write; a failed or slow question counts as "no".
pub async fn is_writable(conn: &mut PgConnection) -> bool {
    let asked = sqlx::query_scalar::<_, bool>(WRITABLE_SQL).fetch_one(&mut *conn);
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, asked).await,
        Ok(Ok(true))
    )
}
