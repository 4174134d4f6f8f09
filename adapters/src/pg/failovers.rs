//! `application::reads::FailoverRecords` over PostgreSQL: a cell's `failovers` table (the leader
//! changes its processes observed) and what the database says of its own role (writable, the
//! synchronous standbys it names), for the HA view (`edge::cluster`).

use application::reads::{FailoverRecord, FailoverRecords, StoredFailover};
use application::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::store;

/// One cell's failover records and role, over its pool.
#[derive(Debug, Clone)]
pub struct PgFailovers {
    pool: PgPool,
}

impl PgFailovers {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[derive(sqlx::FromRow)]
struct FailoverRow {
    at: DateTime<Utc>,
    kind: String,
    from_member: Option<String>,
    to_member: String,
    epoch: Option<i64>,
    cause: String,
    observed_by: String,
}

impl From<FailoverRow> for StoredFailover {
    fn from(r: FailoverRow) -> Self {
        Self {
            at: r.at,
            kind: r.kind,
            from_member: r.from_member,
            to_member: r.to_member,
            epoch: r.epoch,
            cause: r.cause,
            observed_by: r.observed_by,
        }
    }
}

#[async_trait]
impl FailoverRecords for PgFailovers {
    async fn writable(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar::<_, bool>(schema::failover::WRITABLE_SQL)
            .fetch_one(&self.pool)
            .await
            .map_err(store)
    }

    async fn sync_standbys(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(store)
    }

    async fn last(&self) -> Result<Option<StoredFailover>, StoreError> {
        let row = sqlx::query_as::<_, FailoverRow>(
            "SELECT at, kind, from_member, to_member, epoch, cause, observed_by FROM failovers \
             ORDER BY at DESC, id DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await
        .map_err(store)?;
        Ok(row.map(StoredFailover::from))
    }

    async fn record(&self, rows: &[FailoverRecord], observed_by: &str) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(store)?;
        for r in rows {
            sqlx::query(
                "INSERT INTO failovers (at, kind, from_member, to_member, epoch, cause, observed_by) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(DateTime::<Utc>::from(r.at))
            .bind(r.kind)
            .bind(&r.from)
            .bind(&r.to)
            .bind(r.epoch.map(|e| i64::try_from(e).unwrap_or(i64::MAX)))
            .bind(&r.cause)
            .bind(observed_by)
            .execute(&mut *tx)
            .await
            .map_err(store)?;
        }
        tx.commit().await.map_err(store)
    }
}
