//! The relay's PostgreSQL side: the leader lock (a session advisory lock held on a connection of
//! its own), the checkpoint row (`relay_checkpoint`, migration 0009) written through that same
//! connection, and the status read by `/metrics` and the RELAY-LAG monitor.

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection, PgPool};

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

/// Where one stream's relay stands, as every instance sees it (read from PostgreSQL).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RelayStatus {
    pub stream: String,
    /// The last feed position JetStream acknowledged (the events relayed so far).
    pub position: i64,
    pub stream_sequence: i64,
    /// The last feed position handed out.
    pub head: i64,
    /// `head - position`, never negative.
    pub lag_positions: i64,
    /// Age of the oldest event not relayed yet (0 when none).
    pub lag_seconds: f64,
    /// The leader's last checkpoint or heartbeat.
    pub updated_at: DateTime<Utc>,
    pub leader: Option<String>,
    pub leader_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    pub lag_alerts: i64,
}

/// Every stream's relay status (none when no relay ever ran).
pub async fn status(pool: &PgPool) -> Result<Vec<RelayStatus>, sqlx::Error> {
    eventlog::lag::relay_status(pool).await
}

/// One stream's relay status, if it ever ran.
pub async fn status_of(pool: &PgPool, stream: &str) -> Result<Option<RelayStatus>, sqlx::Error> {
    eventlog::lag::relay_status_of(pool, stream).await
}
