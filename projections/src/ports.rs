//! The read side's ports (`application::reads`) that the read models answer: the transfer
//! views ([`TransferView`]), the operators' views ([`AdminView`]) and the consumer feed
//! ([`PgFeed`]), over the queries of `transfers`, `admin` and `feed`. A driver error becomes
//! the core's `StoreError` here.

use application::reads::{
    AdminFilter, AdminReads, FeedEvent, FeedReads, HistoryFilter, MetricFigures, PageCursor,
    ProjectorLag, TransferReads, TransferRow,
};
use application::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::admin::AdminView;
use crate::feed;
use crate::transfers::TransferView;

fn store(e: sqlx::Error) -> StoreError {
    StoreError::new(e)
}

#[async_trait]
impl TransferReads for TransferView {
    async fn in_flight(&self, user_id: i64) -> Result<Vec<(String, Decimal)>, StoreError> {
        TransferView::in_flight(self, user_id).await.map_err(store)
    }

    async fn history(
        &self,
        filter: &HistoryFilter,
        after: Option<&PageCursor>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, StoreError> {
        TransferView::history(self, filter, after, limit)
            .await
            .map_err(store)
    }

    async fn state_counts(&self) -> Result<Vec<(i16, String, i64)>, StoreError> {
        TransferView::state_counts(self).await.map_err(store)
    }

    async fn metric_figures(&self) -> Result<(Vec<(String, i64)>, MetricFigures), StoreError> {
        TransferView::metric_figures(self).await.map_err(store)
    }
}

#[async_trait]
impl AdminReads for AdminView {
    async fn transfers(
        &self,
        filter: &AdminFilter,
        after: Option<&PageCursor>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, StoreError> {
        AdminView::transfers(self, filter, after, limit)
            .await
            .map_err(store)
    }

    async fn state_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        AdminView::state_counts(self).await.map_err(store)
    }

    async fn created_since(&self, since: DateTime<Utc>) -> Result<i64, StoreError> {
        AdminView::created_since(self, since).await.map_err(store)
    }

    async fn projector_lag(&self) -> Result<ProjectorLag, StoreError> {
        AdminView::projector_lag(self).await.map_err(store)
    }
}

/// The consumer feed's reads over one database.
#[derive(Debug, Clone)]
pub struct PgFeed {
    pool: PgPool,
}

impl PgFeed {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl FeedReads for PgFeed {
    async fn head(&self) -> Result<i64, StoreError> {
        feed::head(&self.pool).await.map_err(store)
    }

    async fn after(
        &self,
        after: i64,
        limit: i64,
        user_id: Option<i64>,
    ) -> Result<Vec<FeedEvent>, StoreError> {
        feed::read_after(&self.pool, after, limit, user_id)
            .await
            .map_err(store)
    }
}
