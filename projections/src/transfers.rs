//! The transfer read models, as the API reads them: `transfers_view` (one row per transfer with
//! its current state, for history), `transfer_balances` (in-flight amounts)
//! and `transfer_state_counts`. The projector writes them; this type only reads, catching the
//! projector up first where a caller needs to read its own writes.

use std::time::Duration;

use domain::TransferState;
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::projector::Projector;
use crate::rows::{balance_row, transfer_row, BalanceRow, TransferRow};

pub use application::reads::{HistoryFilter, MetricFigures, PageCursor, HISTORY_PAGE_SIZE_MAX};

/// How long a read that must see the caller's own writes waits for the projector.
pub const READ_YOUR_WRITES_WAIT_MAX: Duration = Duration::from_secs(5);

/// Reads the transfer read models.
#[derive(Debug, Clone)]
pub struct TransferView {
    pool: PgPool,
    projector: Projector,
}

impl TransferView {
    pub fn new(pool: PgPool) -> Self {
        Self {
            projector: Projector::new(pool.clone()),
            pool,
        }
    }

    pub fn projector(&self) -> &Projector {
        &self.projector
    }

    /// Brings the read models up to every event committed before this call, waiting at most
    /// `wait_max`. If that fails or times out the read goes ahead on what is there (a little
    /// stale), and the reason is logged: a read model is never the source of truth.
    pub async fn catch_up(&self, wait_max: Duration) {
        match self.projector.catch_up(wait_max).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "projections still behind the log after waiting; reading them as they are"
            ),
            Err(e) => {
                tracing::error!(error = %e, "projector could not catch up; reading the read models as they are")
            }
        }
    }

    /// Sums of in-flight amounts (money withdrawn from the source, not yet deposited or
    /// refunded: the in-flight states of contract §4, SOURCE_DONE, TARGET_PENDING and COMPENSATING) per asset for one
    /// user, including every transfer step committed before the call.
    pub async fn in_flight(&self, user_id: i64) -> Result<Vec<(String, Decimal)>, sqlx::Error> {
        self.catch_up(READ_YOUR_WRITES_WAIT_MAX).await;
        sqlx::query_as(
            "SELECT asset, in_flight FROM transfer_balances
             WHERE user_id = $1 AND in_flight <> 0 ORDER BY asset",
        )
        .bind(user_id)
        .fetch_all(&self.pool)
        .await
    }

    /// One user's (or, with `None`, everyone's) transfer-driven balance totals per asset.
    pub async fn balances(&self, user_id: Option<i64>) -> Result<Vec<BalanceRow>, sqlx::Error> {
        self.catch_up(READ_YOUR_WRITES_WAIT_MAX).await;
        sqlx::query(
            "SELECT user_id, asset, funding_net, spot_net, in_flight FROM transfer_balances
             WHERE $1::bigint IS NULL OR user_id = $1 ORDER BY user_id, asset",
        )
        .bind(user_id)
        .try_map(balance_row)
        .fetch_all(&self.pool)
        .await
    }

    /// A page of history, newest first, after `after`, at most `limit` (bounded by
    /// [`HISTORY_PAGE_SIZE_MAX`]) rows.
    pub async fn history(
        &self,
        filter: &HistoryFilter,
        after: Option<&PageCursor>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, sqlx::Error> {
        self.catch_up(READ_YOUR_WRITES_WAIT_MAX).await;
        let limit = limit.clamp(0, HISTORY_PAGE_SIZE_MAX);
        sqlx::query(
            "SELECT * FROM transfers_view
             WHERE ($1::bigint IS NULL OR user_id = $1)
               AND ($2::smallint IS NULL OR state_id = $2)
               AND ($3::text IS NULL OR asset = $3)
               AND ($4::text IS NULL OR from_account = $4)
               AND ($5::text IS NULL OR to_account = $5)
               AND ($6::timestamptz IS NULL OR created_at >= $6)
               AND ($7::timestamptz IS NULL OR created_at < $7)
               AND ($8::timestamptz IS NULL OR (created_at, req_id) < ($8, $9))
             ORDER BY created_at DESC, req_id DESC
             LIMIT $10",
        )
        .bind(filter.user_id)
        .bind(filter.state_id)
        .bind(filter.asset.as_deref())
        .bind(filter.from_account.as_deref())
        .bind(filter.to_account.as_deref())
        .bind(filter.created_from)
        .bind(filter.created_until)
        .bind(after.map(|c| c.created_at))
        .bind(after.map(|c| c.req_id.clone()).unwrap_or_default())
        .bind(limit)
        .try_map(transfer_row)
        .fetch_all(&self.pool)
        .await
    }

    /// How many transfers are in each state: (state id, state, count), by state id.
    pub async fn state_counts(&self) -> Result<Vec<(i16, String, i64)>, sqlx::Error> {
        self.catch_up(READ_YOUR_WRITES_WAIT_MAX).await;
        sqlx::query_as(
            "SELECT state_id, state, count FROM transfer_state_counts ORDER BY state_id DESC",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// The figures `/metrics` reports, read at scrape time from PostgreSQL so every instance
    /// reports the same cluster-wide values: transfers per state name, and one round trip for the
    /// rest (the recovery worker's totals included). Every part reads by index what is live, or
    /// one row: per-state counts and `recovery_totals` are kept by the writers, the open
    /// transfers' ages come from the partial index `transfers_view_open`, the leases from
    /// `transfer_retries_lease` (schema/migrations/0011_recovery_totals.sql).
    pub async fn metric_figures(&self) -> Result<(Vec<(String, i64)>, MetricFigures), sqlx::Error> {
        // The projector keeps one row per state; counting `transfers_view` would read every
        // transfer ever made at each scrape.
        let by_state: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, count FROM transfer_state_counts")
                .fetch_all(&self.pool)
                .await?;
        let figures = sqlx::query(&format!(
            "SELECT
                COALESCE((SELECT EXTRACT(EPOCH FROM now() - MIN(updated_at))::bigint
                          FROM transfers_view WHERE state_id NOT IN ({terminal})), 0)
                    AS oldest_open_age_seconds,
                COALESCE((SELECT EXTRACT(EPOCH FROM now() - MIN(updated_at))::bigint
                          FROM transfers_view WHERE state_id = {target_pending}), 0)
                    AS oldest_target_pending_age_seconds,
                t.attempts AS retries_total,
                t.refund_failures AS refund_failures_total,
                t.stuck_alerts AS stuck_alerts_total,
                t.refund_alerts AS refund_alerts_total,
                (SELECT COUNT(*) FROM transfer_retries WHERE lease_until > now()) AS leased
             FROM recovery_totals t",
            terminal = TransferState::terminal_ids_sql(),
            target_pending = TransferState::TargetPending.id(),
        ))
        .try_map(metric_figures)
        .fetch_one(&self.pool)
        .await?;
        Ok((by_state, figures))
    }
}

/// The `/metrics` figures' row as [`MetricFigures`].
fn metric_figures(row: sqlx::postgres::PgRow) -> Result<MetricFigures, sqlx::Error> {
    use sqlx::Row;
    Ok(MetricFigures {
        oldest_open_age_seconds: row.try_get("oldest_open_age_seconds")?,
        oldest_target_pending_age_seconds: row.try_get("oldest_target_pending_age_seconds")?,
        retries_total: row.try_get("retries_total")?,
        refund_failures_total: row.try_get("refund_failures_total")?,
        stuck_alerts_total: row.try_get("stuck_alerts_total")?,
        refund_alerts_total: row.try_get("refund_alerts_total")?,
        leased: row.try_get("leased")?,
    })
}
