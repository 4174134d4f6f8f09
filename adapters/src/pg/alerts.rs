//! The stored alerts (`alerts`, bounded to `application::alerts::ALERTS_KEPT` rows) and their
//! totals per code (`alert_totals`, never pruned): `application::stores::AlertLog`.

use application::alerts::{StoredAlert, ALERTS_KEPT};
use application::stores::AlertLog;
use application::StoreError;
use async_trait::async_trait;
use domain::UserId;
use sqlx::PgPool;

use super::driver::store;

/// The alerts in PostgreSQL.
#[derive(Clone)]
pub struct PgAlerts {
    pool: PgPool,
}

impl PgAlerts {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Stores one alert and counts it, then deletes what lies beyond the newest `ALERTS_KEPT`.
    async fn insert(
        &self,
        code: &str,
        severity: &str,
        user: Option<UserId>,
        detail: &str,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO alerts (code, severity, user_id, detail) VALUES ($1, $2, $3, $4)")
            .bind(code)
            .bind(severity)
            .bind(user.map(|u| u.as_i64()))
            .bind(detail)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO alert_totals (code, total) VALUES ($1, 1) \
             ON CONFLICT (code) DO UPDATE SET total = alert_totals.total + 1",
        )
        .bind(code)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM alerts WHERE id <= \
             (SELECT id FROM alerts ORDER BY id DESC OFFSET $1 LIMIT 1)",
        )
        .bind(ALERTS_KEPT)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }
}

type AlertRow = (
    i64,
    String,
    String,
    Option<i64>,
    chrono::DateTime<chrono::Utc>,
    String,
);

#[async_trait]
impl AlertLog for PgAlerts {
    async fn record(
        &self,
        code: &str,
        severity: &str,
        user: Option<UserId>,
        detail: &str,
    ) -> Result<(), StoreError> {
        self.insert(code, severity, user, detail)
            .await
            .map_err(store)
    }

    async fn recent(&self, limit: i64) -> Result<Vec<StoredAlert>, StoreError> {
        let rows: Vec<AlertRow> = sqlx::query_as(
            "SELECT id, code, severity, user_id, at, detail FROM alerts ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(store)?;
        Ok(rows
            .into_iter()
            .map(|(id, code, severity, user_id, at, detail)| StoredAlert {
                id,
                code,
                severity,
                user_id,
                at,
                detail,
            })
            .collect())
    }

    async fn total(&self, code: &str) -> Result<i64, StoreError> {
        let total: Option<i64> =
            sqlx::query_scalar("SELECT total FROM alert_totals WHERE code = $1")
                .bind(code)
                .fetch_optional(&self.pool)
                .await
                .map_err(store)?;
        Ok(total.unwrap_or(0))
    }
}
