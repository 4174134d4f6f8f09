//! The relay's side of the read ports (`application::reads::RelayReads`): every stream's status,
//! over `checkpoint::status`, its rows read by hand into the core's [`RelayStatus`].

use application::reads::{RelayReads, RelayStatus};
use application::StoreError;
use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

/// The relay's status over one database.
#[derive(Debug, Clone)]
pub struct PgRelayReads {
    pool: PgPool,
}

impl PgRelayReads {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl RelayReads for PgRelayReads {
    async fn status(&self) -> Result<Vec<RelayStatus>, StoreError> {
        crate::status(&self.pool).await.map_err(StoreError::new)
    }
}

/// A status row (`checkpoint::STATUS_SQL`) as a [`RelayStatus`].
pub(crate) fn status_row(row: PgRow) -> Result<RelayStatus, sqlx::Error> {
    Ok(RelayStatus {
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
    })
}
