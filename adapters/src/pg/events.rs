//! The core's reads of the event log besides folding a transfer (`application::stores::EventReads`):
//! one transfer's events as stored, and the conservation check's read, through
//! `event_store`, which owns the log's SQL.

use application::stores::{AuditTransfer, EventReads, LogError, LoggedEvent};
use async_trait::async_trait;
use domain::ReqId;
use sqlx::PgPool;

use super::driver::store;
use crate::event_store;

/// The event log's reads in PostgreSQL.
#[derive(Clone)]
pub struct PgEventReads {
    pool: PgPool,
}

impl PgEventReads {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// The store's read error as the core's.
fn core(e: event_store::LogError) -> LogError {
    match e {
        event_store::LogError::Database(e) => LogError::Store(store(e)),
        event_store::LogError::Undecodable { req_id, problem } => {
            LogError::Undecodable { req_id, problem }
        }
    }
}

#[async_trait]
impl EventReads for PgEventReads {
    async fn transfer_events(&self, req_id: &ReqId) -> Result<Vec<LoggedEvent>, LogError> {
        event_store::transfer_events(&self.pool, &req_id.to_string())
            .await
            .map_err(core)
    }

    async fn audit_transfers(
        &self,
        since: u64,
        ids: &[String],
    ) -> Result<(u64, Vec<AuditTransfer>), LogError> {
        event_store::audit_transfers(&self.pool, since, ids)
            .await
            .map_err(core)
    }
}
