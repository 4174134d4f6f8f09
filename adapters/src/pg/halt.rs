//! The halt flag in `service_halt` (one row, made by its migration): `application::stores::HaltFlag`.

use application::stores::HaltFlag;
use application::StoreError;
use async_trait::async_trait;
use domain::UserId;
use sqlx::PgPool;

use super::driver::store;

/// The halt flag in PostgreSQL.
#[derive(Clone)]
pub struct PgHalt {
    pool: PgPool,
}

impl PgHalt {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl HaltFlag for PgHalt {
    async fn halt(&self, reason: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE service_halt SET halted = true, reason = $1, halted_at = now() WHERE NOT halted",
        )
        .bind(reason)
        .execute(&self.pool)
        .await
        .map_err(store)?;
        Ok(())
    }

    async fn is_halted(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar("SELECT halted FROM service_halt")
            .fetch_one(&self.pool)
            .await
            .map_err(store)
    }

    async fn status(&self) -> Result<(bool, Option<String>), StoreError> {
        let (halted, reason): (bool, Option<String>) =
            sqlx::query_as("SELECT halted, reason FROM service_halt")
                .fetch_one(&self.pool)
                .await
                .map_err(store)?;
        Ok((halted, reason.filter(|_| halted)))
    }

    async fn clear(&self, admin: UserId) -> Result<(), StoreError> {
        sqlx::query("UPDATE service_halt SET halted = false, cleared_at = now(), cleared_by = $1")
            .bind(admin.as_i64())
            .execute(&self.pool)
            .await
            .map_err(store)?;
        Ok(())
    }
}
