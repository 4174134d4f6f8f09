//! The failover repairs' rows (`failover_repairs`, one per req_id):
//! `application::stores::RepairRecords`.

use application::stores::{RepairRecords, RepairRequest, RepairRow};
use application::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use domain::{ReqId, TransferState};
use rust_decimal::Decimal;
use sqlx::PgPool;

use super::driver::store;

/// The failover repairs in PostgreSQL.
#[derive(Clone)]
pub struct PgRepairs {
    pool: PgPool,
}

impl PgRepairs {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

type Row = (
    i64,
    String,
    String,
    String,
    Decimal,
    String,
    String,
    DateTime<Utc>,
);

#[async_trait]
impl RepairRecords for PgRepairs {
    async fn find(&self, req_id: &ReqId) -> Result<Option<RepairRow>, StoreError> {
        let row: Option<Row> = sqlx::query_as(
            "SELECT user_id, from_type, to_type, asset, amount, operator, reason, requested_at
             FROM failover_repairs WHERE req_id = $1",
        )
        .bind(req_id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(store)?;
        Ok(row.map(
            |(user_id, from_type, to_type, asset, amount, operator, reason, requested_at)| {
                RepairRow {
                    user_id,
                    from_type,
                    to_type,
                    asset,
                    amount,
                    operator,
                    reason,
                    requested_at,
                }
            },
        ))
    }

    async fn insert(&self, r: &RepairRequest<'_>) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO failover_repairs
                 (req_id, action, user_id, from_type, to_type, asset, amount, spot_record,
                  operator, reason)
             VALUES ($1, 'RE_RECORD', $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (req_id) DO NOTHING",
        )
        .bind(r.req_id.to_string())
        .bind(r.user_id)
        .bind(r.from_type)
        .bind(r.to_type)
        .bind(r.asset)
        .bind(r.amount)
        .bind(r.spot_record)
        .bind(r.operator)
        .bind(r.reason)
        .execute(&self.pool)
        .await
        .map_err(store)?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn finish(&self, req_id: &ReqId, state: TransferState) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE failover_repairs SET final_state = $2, finished_at = now()
             WHERE req_id = $1 AND final_state IS NULL",
        )
        .bind(req_id.to_string())
        .bind(state.as_str())
        .execute(&self.pool)
        .await
        .map_err(store)?;
        Ok(())
    }
}
