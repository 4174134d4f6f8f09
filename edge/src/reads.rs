//! The read side's objects a handler reads through, built once by the binary's start-up over
//! the database: the transfer read models, the operators' views, the consumer feed, the recovery
//! worker's listings, the relay's status and the tamper-evident log, each a port of the core
//! (`application::reads`) that the binary wires over PostgreSQL. The handlers hold this, never a
//! pool.

use std::sync::Arc;
use std::time::Duration;

use application::reads::{
    AdminReads, Attempt, FeedEvent, FeedReads, Heartbeat, LogReads, Reads, ReceiptPositions,
    RecoveryReads, RelayReads, RelayStatus, StuckTransfer, TraceReads, TransferReads,
};
use application::StoreError;
use domain::ReqId;

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
    transfers: Arc<dyn TransferReads>,
    admin: Arc<dyn AdminReads>,
    feed: Arc<dyn FeedReads>,
    log: Arc<dyn LogReads>,
    receipts: Arc<dyn ReceiptPositions>,
    recovery: Arc<dyn RecoveryReads>,
    traces: Arc<dyn TraceReads>,
    relay: Arc<dyn RelayReads>,
}

impl ReadSide {
    /// Over the read ports the start-up wired.
    pub fn new(reads: Reads) -> Self {
        Self {
            transfers: reads.transfers,
            admin: reads.admin,
            feed: reads.feed,
            log: reads.log,
            receipts: reads.receipts,
            recovery: reads.recovery,
            traces: reads.traces,
            relay: reads.relay,
        }
    }

    /// The transfer read models (history, in-flight sums, counts by state, `/metrics` figures).
    pub fn transfers(&self) -> &dyn TransferReads {
        &*self.transfers
    }

    /// The operators' reads of any user's transfers, counts and the projector's lag.
    pub fn admin(&self) -> &dyn AdminReads {
        &*self.admin
    }

    /// The tamper-evident log's entries, proofs and checkpoints.
    pub fn log(&self) -> &dyn LogReads {
        &*self.log
    }

    /// The feed positions transfer answers carry, single lookups read together (the batched
    /// reader the binary wires, `adapters::pg::receipts`).
    pub fn receipts(&self) -> &dyn ReceiptPositions {
        &*self.receipts
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
    ) -> Result<Vec<StuckTransfer>, StoreError> {
        self.recovery.stuck(older_than, limit).await
    }

    /// The recovery worker's attempts on one transfer.
    pub async fn attempts(&self, req_id: &ReqId) -> Result<Vec<Attempt>, StoreError> {
        self.recovery.attempts(&req_id.to_string()).await
    }

    /// The transfer's first trace id (32 hex digits, from the traceparent `transfer_traces`
    /// keeps; `docs/adr/0018-traces.md`), when it was created while traces were exported.
    pub async fn first_trace_id(&self, req_id: &ReqId) -> Result<Option<String>, StoreError> {
        let traceparent = self.traces.first_trace(&req_id.to_string()).await?;
        // version-traceid-parentid-flags
        Ok(traceparent.and_then(|t| t.split('-').nth(1).map(str::to_owned)))
    }

    /// The recovery worker's last pass, if any.
    pub async fn heartbeat(&self) -> Result<Option<Heartbeat>, StoreError> {
        self.recovery.heartbeat().await
    }

    /// The feed's last position handed out.
    pub async fn feed_head(&self) -> Result<i64, StoreError> {
        self.feed.head().await
    }

    /// Up to `limit` feed events after `after`, of one user's transfers or of all.
    pub async fn feed_after(
        &self,
        after: i64,
        limit: i64,
        user_id: Option<i64>,
    ) -> Result<Vec<FeedEvent>, StoreError> {
        self.feed.after(after, limit, user_id).await
    }

    /// Each relay stream's checkpoint and lag.
    pub async fn relay_status(&self) -> Result<Vec<RelayStatus>, StoreError> {
        self.relay.status().await
    }
}
