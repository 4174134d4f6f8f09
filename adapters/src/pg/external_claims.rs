//! A claim cell's external_id claims in `external_claims` (migration 0022, written only here):
//! `application::external_ids::ExternalClaims`. The rule (who holds, what is refused) is
//! `application::external_ids`'; this file only takes and reads the row.

use application::external_ids::ExternalClaims;
use application::StoreError;
use async_trait::async_trait;
use domain::UserId;
use sqlx::PgPool;

use super::driver::store;

/// The external_id claims in one cell's PostgreSQL.
#[derive(Clone)]
pub struct PgExternalClaims {
    pool: PgPool,
}

impl PgExternalClaims {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl ExternalClaims for PgExternalClaims {
    async fn claim(&self, external_id: &str, user: UserId) -> Result<UserId, StoreError> {
        // Two statements, each committed on its own: the INSERT waits for a concurrent claim of
        // the same external_id to commit, and the SELECT, a new snapshot, then sees its row.
        // (One statement with a CTE could read a snapshot older than that commit, and no row.)
        sqlx::query(
            "INSERT INTO external_claims (external_id, user_id) VALUES ($1, $2) \
             ON CONFLICT (external_id) DO NOTHING",
        )
        .bind(external_id)
        .bind(user.as_i64())
        .execute(&self.pool)
        .await
        .map_err(store)?;
        let holder: i64 =
            sqlx::query_scalar("SELECT user_id FROM external_claims WHERE external_id = $1")
                .bind(external_id)
                .fetch_one(&self.pool)
                .await
                .map_err(store)?;
        u64::try_from(holder)
            .ok()
            .and_then(|raw| UserId::new(raw).ok())
            .ok_or_else(|| {
                StoreError::msg(format!(
                    "external_claims keeps an invalid user id {holder} for {external_id:?}"
                ))
            })
    }
}
