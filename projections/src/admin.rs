//! The operators' reads of the read models: any user's transfers with filters and a keyset cursor
//! (newest first, by (created_at, req_id), so rows inserted meanwhile never shift a page), the
//! counts and the last minute's rate for the overview, and how far the projector lags behind the
//! event log. Each reads by index: the listing on `transfers_view_page` /
//! `transfers_view_user_page` (or the open transfers' partial index), the rate on the newest
//! rows of `transfers_view_page`, the lag on two one-row tables and one feed position.

use chrono::{DateTime, Utc};
use domain::TransferState;
use sqlx::PgPool;

use crate::rows::{transfer_row, TransferRow};
use crate::transfers::PageCursor;

pub use application::reads::{AdminFilter, ProjectorLag, StateFilter, ADMIN_PAGE_SIZE_MAX};

/// The read models' admin reads.
#[derive(Debug, Clone)]
pub struct AdminView {
    pool: PgPool,
}

impl AdminView {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// A page of transfers matching `filter`, newest first, after `after`, at most `limit`
    /// (1 to [`ADMIN_PAGE_SIZE_MAX`]) rows.
    pub async fn transfers(
        &self,
        filter: &AdminFilter,
        after: Option<&PageCursor>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, sqlx::Error> {
        let (state_id, open) = match filter.state {
            None => (None, false),
            Some(StateFilter::One(state)) => (Some(state.id()), false),
            Some(StateFilter::Open) => (None, true),
        };
        sqlx::query(&format!(
            "SELECT * FROM transfers_view
             WHERE ($1::smallint IS NULL OR state_id = $1)
               AND (NOT $2 OR state_id NOT IN ({terminal}))
               AND ($3::bigint IS NULL OR user_id = $3)
               AND ($4::text IS NULL OR asset = $4)
               AND ($5::bigint IS NULL OR updated_at <= now() - $5 * interval '1 millisecond')
               AND ($6::text IS NULL OR req_id = $6)
               AND ($7::text IS NULL OR cid = $7)
               AND ($8::timestamptz IS NULL OR (created_at, req_id) < ($8, $9))
             ORDER BY created_at DESC, req_id DESC
             LIMIT $10",
            terminal = TransferState::terminal_ids_sql(),
        ))
        .bind(state_id)
        .bind(open)
        .bind(filter.user_id)
        .bind(filter.asset.as_deref())
        .bind(filter.older_than_ms)
        .bind(filter.req_id.as_deref())
        .bind(filter.cid.as_deref())
        .bind(after.map(|c| c.created_at))
        .bind(after.map(|c| c.req_id.clone()).unwrap_or_default())
        .bind(limit.clamp(1, ADMIN_PAGE_SIZE_MAX))
        .try_map(transfer_row)
        .fetch_all(&self.pool)
        .await
    }

    /// One transfer's row, if the projector has applied it.
    pub async fn transfer(&self, req_id: &str) -> Result<Option<TransferRow>, sqlx::Error> {
        sqlx::query("SELECT * FROM transfers_view WHERE req_id = $1")
            .bind(req_id)
            .try_map(transfer_row)
            .fetch_optional(&self.pool)
            .await
    }

    /// Transfers per state name (every state the projector has counted).
    pub async fn state_counts(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as("SELECT state, count FROM transfer_state_counts ORDER BY state_id DESC")
            .fetch_all(&self.pool)
            .await
    }

    /// Transfers created since `since` (the overview's rate: `now - 60 s`). Reads the newest
    /// rows of `transfers_view_page` only.
    pub async fn created_since(&self, since: DateTime<Utc>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT count(*) FROM transfers_view WHERE created_at >= $1")
            .bind(since)
            .fetch_one(&self.pool)
            .await
    }

    /// How far the projector lags: feed positions handed out minus events it applied, and the
    /// age of the first event past what it applied.
    pub async fn projector_lag(&self) -> Result<ProjectorLag, sqlx::Error> {
        let lag = eventlog::lag::projector_lag(&self.pool).await?;
        Ok(lag
            .map(|(positions, seconds)| ProjectorLag { positions, seconds })
            .unwrap_or_default())
    }
}
