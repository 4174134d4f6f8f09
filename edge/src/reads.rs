//! The read side's objects a handler reads through, built once by the binary's start-up over
//! the database: the transfer read models, the operators' views, the consumer feed, the recovery
//! worker's listings, the relay's status and the tamper-evident log. The handlers hold this, never the pool.

use std::time::Duration;

use domain::ReqId;
use projections::admin::AdminView;
use projections::feed::{self, FeedEvent};
use projections::TransferView;
use recovery::heartbeat::{Attempt, Heartbeat};
use recovery::StuckTransfer;
use relay::RelayStatus;
use sqlx::PgPool;
use tlog_follower::LogReads;

use crate::error::ApiError;

/// A `cell` query parameter: `None` when absent, the cell id when it is an integer from 1 to
/// 65535, BAD_REQUEST otherwise (the same words wherever a route takes one).
pub fn cell_param(raw: Option<&str>) -> Result<Option<u16>, ApiError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    raw.parse::<u16>()
        .ok()
        .filter(|c| *c >= 1)
        .map(Some)
        .ok_or_else(|| ApiError::BadRequest("`cell` must be an integer from 1 to 65535".into()))
}

/// The read models and listings. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct ReadSide {
    pool: PgPool,
    view: TransferView,
    admin: AdminView,
    log: LogReads,
    receipts: crate::receipts::Receipts,
}

impl ReadSide {
    /// Over the database the start-up connected.
    pub fn new(pool: PgPool) -> Self {
        Self {
            view: TransferView::new(pool.clone()),
            admin: AdminView::new(pool.clone()),
            log: LogReads::new(pool.clone()),
            receipts: crate::receipts::Receipts::new(pool.clone()),
            pool,
        }
    }

    /// The transfer read models (history, in-flight sums, counts by state, `/metrics` figures).
    pub fn transfers(&self) -> &TransferView {
        &self.view
    }

    /// The operators' reads of any user's transfers, counts and the projector's lag.
    pub fn admin(&self) -> &AdminView {
        &self.admin
    }

    /// The tamper-evident log's entries, proofs and checkpoints.
    pub fn log(&self) -> &LogReads {
        &self.log
    }

    /// The feed positions transfer answers carry, single lookups read together
    /// (`receipts.rs`).
    pub fn receipts(&self) -> &crate::receipts::Receipts {
        &self.receipts
    }

    /// The same read side, whose log is cell `cell`'s (under a cell map: every log route and
    /// receipt names its cell).
    pub fn with_log_cell(mut self, cell: u16) -> Self {
        self.log = self.log.of_cell(cell);
        self
    }

    /// The cell this read side serves: its id under a cell map, `None` without one (ADR 0017).
    pub fn cell(&self) -> Option<u16> {
        self.log.cell()
    }

    /// `?cell=N` on a route that a cell map routes by it (the tamper-evident log's, the
    /// conservation check's clear, history and runs): the front router sends it to cell N, so
    /// it must name this cell; without a map the one cell is cell 1. `None` (absent) is this
    /// cell. NOT_FOUND for a cell this is not (`what` says what it has not), BAD_REQUEST for a
    /// malformed one.
    pub fn check_cell(&self, raw: Option<&str>, what: &str) -> Result<(), ApiError> {
        let Some(cell) = cell_param(raw)? else {
            return Ok(());
        };
        if self.cell().unwrap_or(1) == cell {
            Ok(())
        } else {
            Err(ApiError::RefusedBecause {
                code: domain::ErrorCode::NotFound,
                message: format!("no {what} of cell {cell} here"),
            })
        }
    }

    /// Open transfers unchanged for at least `older_than`, oldest first, with their retries.
    pub async fn stuck(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> Result<Vec<StuckTransfer>, sqlx::Error> {
        recovery::stuck_transfers(&self.pool, older_than, limit).await
    }

    /// The recovery worker's attempts on one transfer.
    pub async fn attempts(&self, req_id: &ReqId) -> Result<Vec<Attempt>, sqlx::Error> {
        recovery::heartbeat::attempts(&self.pool, &req_id.to_string()).await
    }

    /// The transfer's first trace id (32 hex digits, from the traceparent `transfer_traces`
    /// keeps; `docs/adr/0018-traces.md`), when it was created while traces were exported.
    pub async fn first_trace_id(&self, req_id: &ReqId) -> Result<Option<String>, sqlx::Error> {
        let traceparent =
            adapters::event_store::first_trace(&self.pool, &req_id.to_string()).await?;
        // version-traceid-parentid-flags
        Ok(traceparent.and_then(|t| t.split('-').nth(1).map(str::to_owned)))
    }

    /// The recovery worker's last pass, if any.
    pub async fn heartbeat(&self) -> Result<Option<Heartbeat>, sqlx::Error> {
        recovery::heartbeat::last(&self.pool).await
    }

    /// The feed's last position handed out.
    pub async fn feed_head(&self) -> Result<i64, sqlx::Error> {
        feed::head(&self.pool).await
    }

    /// Up to `limit` feed events after `after`, of one user's transfers or of all.
    pub async fn feed_after(
        &self,
        after: i64,
        limit: i64,
        user_id: Option<i64>,
    ) -> Result<Vec<FeedEvent>, sqlx::Error> {
        feed::read_after(&self.pool, after, limit, user_id).await
    }

    /// Each relay stream's checkpoint and lag.
    pub async fn relay_status(&self) -> Result<Vec<RelayStatus>, sqlx::Error> {
        relay::status(&self.pool).await
    }
}
