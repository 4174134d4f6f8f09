//! The recovery worker's side of the read ports (`application::reads::RecoveryReads`): the
//! stuck listing, one transfer's attempts and the worker's heartbeat, over the queries of
//! `stuck` and `heartbeat` (their rows read by hand into the core's values in `rows`).

use std::time::Duration;

use application::reads::{Attempt, Heartbeat, RecoveryReads, StuckTransfer};
use application::StoreError;
use async_trait::async_trait;
use sqlx::PgPool;

/// The recovery worker's listings over one database.
#[derive(Debug, Clone)]
pub struct PgRecoveryReads {
    pool: PgPool,
}

impl PgRecoveryReads {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl RecoveryReads for PgRecoveryReads {
    async fn stuck(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> Result<Vec<StuckTransfer>, StoreError> {
        crate::stuck_transfers(&self.pool, older_than, limit)
            .await
            .map_err(StoreError::new)
    }

    async fn attempts(&self, req_id: &str) -> Result<Vec<Attempt>, StoreError> {
        crate::heartbeat::attempts(&self.pool, req_id)
            .await
            .map_err(StoreError::new)
    }

    async fn heartbeat(&self) -> Result<Option<Heartbeat>, StoreError> {
        crate::heartbeat::last(&self.pool)
            .await
            .map_err(StoreError::new)
    }
}
