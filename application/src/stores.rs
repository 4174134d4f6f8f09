//! The core's records besides the transfers' own (`ports.rs`): one port per job, each a trait
//! that `adapters::pg` implements over PostgreSQL and `testkit` in memory (the simulation's and
//! the fast tests'). The halt flag, the stored alerts, the asset settings, the conservation
//! check's records and its reads of the event log, the open transfers the idempotency horizon
//! waits for, and the failover repair's rows. [`Stores`] holds one of each, so the core is wired
//! with one value; `adapters::pg::stores(pool)` makes PostgreSQL's.
//!
//! Every error is a [`StoreError`]: the outcome of a write that fails is unknown, and the caller
//! reads again before acting on it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use domain::{AssetConfig, ReqId, TransferEvent, TransferState, UserId};
use rust_decimal::Decimal;

use crate::error::StoreError;

/// The halt flag (MON-003), shared by every serving process.
#[async_trait]
pub trait HaltFlag: Send + Sync {
    /// Sets the flag with `reason` (kept when already set).
    async fn halt(&self, reason: &str) -> Result<(), StoreError>;
    /// Whether transfers are halted now.
    async fn is_halted(&self) -> Result<bool, StoreError>;
    /// Whether they are, and the reason given when they were.
    async fn status(&self) -> Result<(bool, Option<String>), StoreError>;
    /// Lifts the halt; `admin` is recorded as who lifted it.
    async fn clear(&self, admin: UserId) -> Result<(), StoreError>;
}

/// One stored alert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAlert {
    pub id: i64,
    pub code: String,
    pub severity: String,
    pub user_id: Option<i64>,
    pub at: chrono::DateTime<chrono::Utc>,
    pub detail: String,
}

/// The stored alerts, bounded, with a total per code that is never pruned.
#[async_trait]
pub trait AlertLog: Send + Sync {
    /// Stores one alert and counts it.
    async fn record(
        &self,
        code: &str,
        severity: &str,
        user: Option<UserId>,
        detail: &str,
    ) -> Result<(), StoreError>;
    /// The newest `limit` alerts, newest first.
    async fn recent(&self, limit: i64) -> Result<Vec<StoredAlert>, StoreError>;
    /// Alerts of `code` ever raised (0 when none).
    async fn total(&self, code: &str) -> Result<i64, StoreError>;
}

/// One asset's settings as stored, with when they last changed (a cell copies the home cell's
/// rows as they are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAsset {
    pub symbol: String,
    pub precision: i32,
    pub min_transfer_amount: Decimal,
    pub max_transfer_amount: Decimal,
    /// `ACTIVE` or `SUSPENDED`.
    pub status: String,
    pub internal_transfer_enabled: bool,
    pub updated_at: DateTime<Utc>,
}

/// The stored asset settings (the list every process lays over its registry).
#[async_trait]
pub trait AssetStore: Send + Sync {
    /// Creates or replaces one asset's settings, stamped now.
    async fn put(&self, asset: &AssetConfig) -> Result<(), StoreError>;
    /// Every stored row, by symbol.
    async fn rows(&self) -> Result<Vec<StoredAsset>, StoreError>;
    /// Writes `row` as it is (its own `updated_at`), creating or replacing it.
    async fn write(&self, row: &StoredAsset) -> Result<(), StoreError>;
}

/// A transfer as the conservation check sees it: its `TransferCreated` (the details), the
/// transaction that wrote that event, and its current state (from its last event).
#[derive(Debug, Clone)]
pub struct AuditTransfer {
    pub req_id: String,
    pub created: TransferEvent,
    pub created_tx: u64,
    pub state: TransferState,
}

/// One event of one transfer as the log holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedEvent {
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub event: TransferEvent,
    /// The raw position in the event table (not commit-ordered; for tracing only).
    pub global_position: i64,
}

/// Why a read of the log failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("event log read failed")]
    Store(#[from] StoreError),
    /// An event that does not decode as a `TransferEvent` (or a first event that is not
    /// `TransferCreated`).
    #[error("event log: transfer {req_id}: {problem}")]
    Undecodable { req_id: String, problem: String },
}

/// What the core reads of the event log besides folding one transfer (`TransferLog::load`).
#[async_trait]
pub trait EventReads: Send + Sync {
    /// One transfer's events, in order, from the log itself (events above the projector's
    /// commit watermark included).
    async fn transfer_events(&self, req_id: &ReqId) -> Result<Vec<LoggedEvent>, LogError>;

    /// The conservation check's read of the log, in one snapshot: that snapshot's watermark
    /// (every event below it is committed or aborted for good), and every transfer with an
    /// event whose transaction id is at or above `since` (0: every transfer) or whose req_id is
    /// in `ids`. Its cost follows the events after `since` plus `ids`, not the log's length.
    async fn audit_transfers(
        &self,
        since: u64,
        ids: &[String],
    ) -> Result<(u64, Vec<AuditTransfer>), LogError>;
}

/// The transfers not yet terminal, as the idempotency horizon asks of them.
#[async_trait]
pub trait OpenTransfers: Send + Sync {
    /// The smallest req_id of a transfer that is not terminal (ULIDs: the oldest).
    async fn oldest(&self) -> Result<Option<String>, StoreError>;
}

/// A failover repair's row (`failover_repairs`): the transfer it re-records and who asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairRow {
    pub user_id: i64,
    pub from_type: String,
    pub to_type: String,
    pub asset: String,
    pub amount: Decimal,
    pub operator: String,
    pub reason: String,
    pub requested_at: DateTime<Utc>,
}

/// What a new repair records before it re-records the transfer.
#[derive(Debug, Clone, PartialEq)]
pub struct RepairRequest<'a> {
    pub req_id: &'a ReqId,
    pub user_id: i64,
    pub from_type: &'a str,
    pub to_type: &'a str,
    pub asset: &'a str,
    pub amount: Decimal,
    /// spot-core's whole answer for the req_id.
    pub spot_record: &'a serde_json::Value,
    pub operator: &'a str,
    pub reason: &'a str,
}

/// The failover repairs' records, one per req_id.
#[async_trait]
pub trait RepairRecords: Send + Sync {
    /// The repair of `req_id`, if one was recorded.
    async fn find(&self, req_id: &ReqId) -> Result<Option<RepairRow>, StoreError>;
    /// Records a repair unless one exists for its req_id; whether it was recorded now.
    async fn insert(&self, request: &RepairRequest<'_>) -> Result<bool, StoreError>;
    /// Records the state the repaired transfer ended in (once).
    async fn finish(&self, req_id: &ReqId, state: TransferState) -> Result<(), StoreError>;
}
