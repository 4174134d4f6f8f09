//! The transfer read model (`transfers_view`): one row per transfer with its current state, for
//! history, in-flight totals and finding open transfers.

use chrono::{DateTime, Utc};
use cqrs_es::EventEnvelope;
use domain::{Transfer, TransferEvent, TransferState};
use rust_decimal::Decimal;
use sqlx::PgPool;

/// One row of `transfers_view`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TransferRow {
    pub req_id: String,
    pub user_id: i64,
    pub from_account: String,
    pub to_account: String,
    pub asset: String,
    pub amount: Decimal,
    pub cid: Option<String>,
    pub state: String,
    pub state_id: i16,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_sequence: i64,
}

/// Folds committed events into `transfers_view`.
#[derive(Clone)]
pub struct TransferView {
    pool: PgPool,
}

impl TransferView {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Applies committed events of one transfer, in order. Idempotent: an event at or below the
    /// row's `last_sequence` changes nothing, so replaying or re-dispatching is harmless.
    pub async fn apply(&self, events: &[EventEnvelope<Transfer>]) -> Result<(), sqlx::Error> {
        for envelope in events {
            let seq = i64::try_from(envelope.sequence).unwrap_or(i64::MAX);
            match &envelope.payload {
                TransferEvent::TransferCreated {
                    req_id,
                    user_id,
                    from,
                    to,
                    asset,
                    amount,
                    cid,
                    at,
                } => {
                    sqlx::query(
                        "INSERT INTO transfers_view (req_id, user_id, from_account, to_account, asset,
                            amount, cid, state, state_id, created_at, updated_at, last_sequence)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11)
                         ON CONFLICT (req_id) DO NOTHING",
                    )
                    .bind(req_id.to_string())
                    .bind(user_id.as_i64())
                    .bind(from.as_str())
                    .bind(to.as_str())
                    .bind(asset.as_str())
                    .bind(amount.value())
                    .bind(cid.as_deref())
                    .bind(TransferState::Init.as_str())
                    .bind(TransferState::Init.id())
                    .bind(at)
                    .bind(seq)
                    .execute(&self.pool)
                    .await?;
                }
                other => {
                    let state = other.resulting_state();
                    let (code, message) = match other {
                        TransferEvent::TransferFailed { code, message, .. }
                        | TransferEvent::CompensationStarted { code, message, .. } => {
                            (Some(code.as_str()), Some(message.as_str()))
                        }
                        _ => (None, None),
                    };
                    sqlx::query(
                        "UPDATE transfers_view SET state = $2, state_id = $3, updated_at = $4,
                            last_sequence = $5,
                            failure_code = COALESCE($6, failure_code),
                            failure_message = COALESCE($7, failure_message)
                         WHERE req_id = $1 AND last_sequence < $5",
                    )
                    .bind(&envelope.aggregate_id)
                    .bind(state.as_str())
                    .bind(state.id())
                    .bind(other.at())
                    .bind(seq)
                    .bind(code)
                    .bind(message)
                    .execute(&self.pool)
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// Sums of in-flight amounts (seed 000: SOURCE_DONE, TARGET_PENDING, COMPENSATING) per asset
    /// for one user.
    pub async fn in_flight(&self, user_id: i64) -> Result<Vec<(String, Decimal)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT asset, SUM(amount) FROM transfers_view
             WHERE user_id = $1 AND state_id IN (20, 30, -20)
             GROUP BY asset ORDER BY asset",
        )
        .bind(user_id)
        .fetch_all(&self.pool)
        .await
    }

    /// Transfers not in a terminal state whose last change is older than `older_than`, oldest
    /// first, at most `limit`.
    pub async fn open_transfers(
        &self,
        older_than: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, sqlx::Error> {
        sqlx::query_as(
            "SELECT * FROM transfers_view
             WHERE state_id NOT IN (40, -10, -30) AND updated_at < $1
             ORDER BY updated_at LIMIT $2",
        )
        .bind(older_than)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
    }

    pub async fn get(&self, req_id: &str) -> Result<Option<TransferRow>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM transfers_view WHERE req_id = $1")
            .bind(req_id)
            .fetch_optional(&self.pool)
            .await
    }
}
