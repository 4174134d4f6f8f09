//! The relay's PostgreSQL side: the leader lock (a session advisory lock held on a connection of
//! its own), the checkpoint row (`relay_checkpoint`, migration 0009) written through that same
//! connection, and the status read by `/metrics` and the RELAY-LAG monitor.

use sqlx::{Connection, PgConnection, PgPool, Row};

pub use application::reads::RelayStatus;

/// The first half of the advisory lock key of every relay (`'LR'`); the second is
/// `hashtext(stream)`, so relays of different streams never exclude each other.
const LOCK_CLASS: i32 = 0x4c52;

/// The leadership of one stream: the session advisory lock and the connection that holds it.
/// Dropping it closes the connection, which releases the lock.
#[derive(Debug)]
pub struct Leadership {
    conn: PgConnection,
    stream: String,
}

impl Leadership {
    /// Takes the stream's lock if no other session holds it, on a connection of its own taken
    /// out of the pool; `None` when another relay leads. Also makes the checkpoint row exist and
    /// records who leads.
    pub async fn try_take(
        pool: &PgPool,
        stream: &str,
        instance: &str,
    ) -> Result<Option<Self>, sqlx::Error> {
        // A pooled connection, detached (the pool may open another in its place): it was made
        // with the pool's liveness settings (an idle one whose server vanished is noticed within
        // seconds, not hours) and checked writable and clean, and waiting for it is bounded by
        // the pool's acquire timeout.
        let mut conn = pool.acquire().await?.detach();
        let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(LOCK_CLASS)
            .bind(stream)
            .fetch_one(&mut conn)
            .await?;
        if !taken {
            conn.close().await.ok();
            return Ok(None);
        }
        sqlx::query(
            "INSERT INTO relay_checkpoint (stream, leader, leader_since) VALUES ($1, $2, now())
             ON CONFLICT (stream) DO UPDATE
             SET leader = EXCLUDED.leader, leader_since = now(), updated_at = now()",
        )
        .bind(stream)
        .bind(instance)
        .execute(&mut conn)
        .await?;
        Ok(Some(Self {
            conn,
            stream: stream.to_owned(),
        }))
    }

    /// The stored checkpoint: the last position JetStream acknowledged.
    pub async fn checkpoint(&mut self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT position FROM relay_checkpoint WHERE stream = $1")
            .bind(&self.stream)
            .fetch_one(&mut self.conn)
            .await
    }

    /// Records that JetStream acknowledged everything up to `position` (stream sequence
    /// `sequence`); never moves the checkpoint back. Also the leader's heartbeat: an error here
    /// means the lock's connection is gone, and the caller must stop publishing.
    pub async fn advance(&mut self, position: i64, sequence: u64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE relay_checkpoint
             SET position = GREATEST(position, $2),
                 stream_sequence = CASE WHEN $2 >= position THEN $3 ELSE stream_sequence END,
                 updated_at = now()
             WHERE stream = $1",
        )
        .bind(&self.stream)
        .bind(position)
        .bind(i64::try_from(sequence).unwrap_or(i64::MAX))
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }

    /// Proves the lock's connection is alive (and says so in `updated_at`).
    pub async fn heartbeat(&mut self) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE relay_checkpoint SET updated_at = now() WHERE stream = $1")
            .bind(&self.stream)
            .execute(&mut self.conn)
            .await?;
        Ok(())
    }

    /// Gives the lock up in order (a crash gives it up too: the server ends the session).
    pub async fn release(mut self) {
        let _ = sqlx::query("UPDATE relay_checkpoint SET leader = NULL WHERE stream = $1")
            .bind(&self.stream)
            .execute(&mut self.conn)
            .await;
        self.conn.close().await.ok();
    }
}

/// Records the relay's last error (through the pool: the lock's connection may be the failure).
pub async fn record_error(pool: &PgPool, stream: &str, error: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO relay_checkpoint (stream, last_error, last_error_at) VALUES ($1, $2, now())
         ON CONFLICT (stream) DO UPDATE
         SET last_error = EXCLUDED.last_error, last_error_at = now()",
    )
    .bind(stream)
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// Counts one RELAY-LAG alert raised.
pub async fn record_lag_alert(pool: &PgPool, stream: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE relay_checkpoint SET lag_alerts = lag_alerts + 1 WHERE stream = $1")
        .bind(stream)
        .execute(pool)
        .await?;
    Ok(())
}

/// Every stream's relay status (none when no relay ever ran).
pub async fn status(pool: &PgPool) -> Result<Vec<RelayStatus>, sqlx::Error> {
    let rows: Vec<StatusRow> = eventlog::lag::relay_status(pool).await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

/// One stream's relay status, if it ever ran.
pub async fn status_of(pool: &PgPool, stream: &str) -> Result<Option<RelayStatus>, sqlx::Error> {
    let row: Option<StatusRow> = eventlog::lag::relay_status_of(pool, stream).await?;
    Ok(row.map(|r| r.0))
}

/// A status row (`eventlog::lag::relay_status`) read by hand into the core's [`RelayStatus`],
/// which names no driver.
struct StatusRow(RelayStatus);

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for StatusRow {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self(RelayStatus {
            stream: row.try_get("stream")?,
            position: row.try_get("position")?,
            stream_sequence: row.try_get("stream_sequence")?,
            head: row.try_get("head")?,
            lag_positions: row.try_get("lag_positions")?,
            lag_seconds: row.try_get("lag_seconds")?,
            updated_at: row.try_get("updated_at")?,
            leader: row.try_get("leader")?,
            leader_since: row.try_get("leader_since")?,
            last_error: row.try_get("last_error")?,
            last_error_at: row.try_get("last_error_at")?,
            lag_alerts: row.try_get("lag_alerts")?,
        }))
    }
}
