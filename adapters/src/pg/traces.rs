//! `application::reads::TraceReads` over PostgreSQL: the traceparent a transfer was created
//! under, read by `event_store::first_trace`.

use application::reads::TraceReads;
use application::StoreError;
use async_trait::async_trait;
use sqlx::PgPool;

/// The transfers' first traces in one database.
#[derive(Debug, Clone)]
pub struct PgTraces {
    pool: PgPool,
}

impl PgTraces {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl TraceReads for PgTraces {
    async fn first_trace(&self, req_id: &str) -> Result<Option<String>, StoreError> {
        crate::event_store::first_trace(&self.pool, req_id)
            .await
            .map_err(super::store)
    }
}
