//! The relay's side of the read ports (`application::reads::RelayReads`): every stream's status,
//! over `checkpoint::status` (its rows read by hand into the core's [`RelayStatus`] there).

use application::reads::{RelayReads, RelayStatus};
use application::StoreError;
use async_trait::async_trait;
use sqlx::PgPool;

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
