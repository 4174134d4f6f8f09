//! The read side's ports: what the HTTP crates (`edge`, `command-api`, `query-api`) read besides
//! the core's own queries (`queries.rs`), one trait per job, and the values they answer with.
//! The crates that own each table implement them over PostgreSQL (`projections`: the transfer
//! read models, the operators' views and the feed; `tlog-follower`: the tamper-evident log;
//! `adapters`: the receipts' batched reader, the first trace and the failovers; `recovery`: its
//! listings; `relay`: its status), and the binary wires them into [`Reads`], which
//! `edge::reads::ReadSide` holds: so the HTTP side holds no pool and names no driver type.
//!
//! Every error is a [`StoreError`] (the read could not be made), but for the log's proofs,
//! which may also be refused for the range asked ([`ProofError`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use domain::TransferState;
use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::error::StoreError;

// ---- The transfer read models (`projections`) ----

/// The largest page of history one query returns.
pub const HISTORY_PAGE_SIZE_MAX: i64 = 100;

/// One row of `transfers_view`.
#[derive(Debug, Clone, PartialEq)]
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

/// One user's per-asset totals from `transfer_balances`.
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceRow {
    pub user_id: i64,
    pub asset: String,
    pub funding_net: Decimal,
    pub spot_net: Decimal,
    pub in_flight: Decimal,
}

/// Every field a user filters history by. `None` means "any".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryFilter {
    /// The owner; `None` only for an admin asking about everyone.
    pub user_id: Option<i64>,
    pub state_id: Option<i16>,
    pub asset: Option<String>,
    pub from_account: Option<String>,
    pub to_account: Option<String>,
    /// Created at or after.
    pub created_from: Option<DateTime<Utc>>,
    /// Created strictly before.
    pub created_until: Option<DateTime<Utc>>,
}

/// Where a history page starts: after this (created_at, req_id) in newest-first order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor {
    pub created_at: DateTime<Utc>,
    pub req_id: String,
}

/// The `/metrics` figures besides the per-state counts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MetricFigures {
    pub oldest_open_age_seconds: i64,
    pub oldest_target_pending_age_seconds: i64,
    pub retries_total: i64,
    pub refund_failures_total: i64,
    pub stuck_alerts_total: i64,
    pub refund_alerts_total: i64,
    pub leased: i64,
}

/// The transfer read models as a user's routes read them. The reads that must see the caller's
/// own writes catch the projector up first (a little stale when it cannot).
#[async_trait]
pub trait TransferReads: Send + Sync {
    /// Sums of in-flight amounts per asset for one user, including every transfer step
    /// committed before the call.
    async fn in_flight(&self, user_id: i64) -> Result<Vec<(String, Decimal)>, StoreError>;
    /// A page of history, newest first, after `after`, at most `limit` (bounded by
    /// [`HISTORY_PAGE_SIZE_MAX`]) rows.
    async fn history(
        &self,
        filter: &HistoryFilter,
        after: Option<&PageCursor>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, StoreError>;
    /// How many transfers are in each state: (state id, state, count), by state id.
    async fn state_counts(&self) -> Result<Vec<(i16, String, i64)>, StoreError>;
    /// The figures `/metrics` reports: transfers per state name, and the rest.
    async fn metric_figures(&self) -> Result<(Vec<(String, i64)>, MetricFigures), StoreError>;
}

// ---- The operators' views (`projections`) ----

/// Largest page of the admin listing.
pub const ADMIN_PAGE_SIZE_MAX: i64 = 500;

/// Which transfers the admin listing shows. `None` means "any".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdminFilter {
    /// One state, or (`open`) every non-terminal one.
    pub state: Option<StateFilter>,
    pub user_id: Option<i64>,
    pub asset: Option<String>,
    /// Only transfers whose last change is at least this many milliseconds old.
    pub older_than_ms: Option<i64>,
    pub req_id: Option<String>,
    /// The client's key; scoped to `user_id` when that is given too.
    pub cid: Option<String>,
}

/// A state filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    One(TransferState),
    /// Any state that is not terminal.
    Open,
}

/// How far the projector is behind the event log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProjectorLag {
    /// Events appended (feed positions handed out) and not yet applied.
    pub positions: i64,
    /// Age of the oldest event not yet applied (0 when none).
    pub seconds: f64,
}

/// The operators' reads of the read models.
#[async_trait]
pub trait AdminReads: Send + Sync {
    /// A page of transfers matching `filter`, newest first, after `after`, at most `limit`
    /// (1 to [`ADMIN_PAGE_SIZE_MAX`]) rows.
    async fn transfers(
        &self,
        filter: &AdminFilter,
        after: Option<&PageCursor>,
        limit: i64,
    ) -> Result<Vec<TransferRow>, StoreError>;
    /// Transfers per state name (every state the projector has counted).
    async fn state_counts(&self) -> Result<Vec<(String, i64)>, StoreError>;
    /// Transfers created since `since`.
    async fn created_since(&self, since: DateTime<Utc>) -> Result<i64, StoreError>;
    /// How far the projector lags behind the event log.
    async fn projector_lag(&self) -> Result<ProjectorLag, StoreError>;
}

// ---- The consumer feed (`projections`) ----

/// The aggregate type of transfers in the event table and the feed.
pub const TRANSFER_AGGREGATE: &str = "Transfer";

/// The largest page of the feed one read returns.
pub const FEED_PAGE_SIZE_MAX: i64 = 1000;

/// One event as consumers see it.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedEvent {
    /// Dense, gap-free, starting at 1.
    pub position: i64,
    /// The de-duplication key: `<aggregate type>:<aggregate id>:<sequence>`.
    pub event_id: String,
    /// The raw position in the event table (not commit-ordered; for tracing only).
    pub global_position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: Value,
    pub user_id: Option<i64>,
    pub occurred_at: DateTime<Utc>,
    pub recorded_at: DateTime<Utc>,
    /// For a partition move's copy (ADR 0023 §5): where it came from; `None` for an event this
    /// cell appended itself.
    pub origin: Option<EventOrigin>,
}

/// Where a partition move's copy of an event came from: the source cell, its feed position
/// there, and the move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOrigin {
    pub cell: i64,
    pub position: i64,
    pub move_id: String,
}

/// One event in the wire shape consumers get: the HTTP feed (`GET /api/v1/events`, its SSE twin)
/// and the JetStream relay send exactly this JSON, so a consumer can switch between them. A
/// partition move's copy also carries `origin` (`{cell, position, move}`).
pub fn event_json(e: &FeedEvent) -> Value {
    let mut v = json!({
        "position": e.position,
        "event_id": e.event_id,
        "aggregate_type": e.aggregate_type,
        "aggregate_id": e.aggregate_id,
        "sequence": e.sequence,
        "event_type": e.event_type,
        "event_version": e.event_version,
        "payload": e.payload,
        "user_id": e.user_id,
        "occurred_at": e.occurred_at.to_rfc3339_opts(SecondsFormat::Micros, true),
    });
    if let Some(o) = &e.origin {
        v["origin"] = json!({"cell": o.cell, "position": o.position, "move": o.move_id});
    }
    v
}

/// The consumer feed's reads.
#[async_trait]
pub trait FeedReads: Send + Sync {
    /// The last position handed out (0 when the feed is empty).
    async fn head(&self) -> Result<i64, StoreError>;
    /// Events after `after`, in order, at most `limit` (bounded by [`FEED_PAGE_SIZE_MAX`]);
    /// only one user's when `user_id` is given.
    async fn after(
        &self,
        after: i64,
        limit: i64,
        user_id: Option<i64>,
    ) -> Result<Vec<FeedEvent>, StoreError>;
}

// ---- The tamper-evident log (`tlog-follower`) ----

/// A SHA-256 hash of the tree (`tlog::Hash`).
pub type Hash = [u8; 32];

/// The tree's size and signing identity, as the readers see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeHead {
    pub size: u64,
    pub origin: Option<String>,
    pub vkey: Option<String>,
}

/// How far the tree is behind the feed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogLag {
    /// Entries in the tree.
    pub tree_size: i64,
    /// Feed positions handed out and not yet in the tree.
    pub positions: i64,
    /// Age of the oldest feed entry not yet in the tree (0 when none).
    pub seconds: f64,
}

/// One entry of the log as a route shows it: whose it is and its exact leaf bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub position: i64,
    pub user_id: Option<i64>,
    /// The leaf (RFC 8785 JSON), exactly as hashed.
    pub leaf: Vec<u8>,
}

/// One event of a transfer as a receipt names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptEntry {
    pub position: i64,
    pub sequence: i64,
    pub event_type: String,
    pub user_id: Option<i64>,
}

/// An inclusion proof: the leaf's hash and its audit path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inclusion {
    pub leaf_hash: Hash,
    pub hashes: Vec<Hash>,
}

/// Why a proof cannot be given.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    /// The size asked for is beyond the tree (it has not grown that far yet).
    #[error("the tree has {size} entries")]
    BeyondTree { size: u64 },
    /// The position is not inside the size, or `from` is above `to`.
    #[error("out of range")]
    OutOfRange,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The tamper-evident log's reads: entries, receipts, proofs and checkpoints of one cell's log.
#[async_trait]
pub trait LogReads: Send + Sync {
    /// The cell whose log this is, under a cell map (`None`: a ledger without one).
    fn cell(&self) -> Option<u16>;
    /// The same reads, of cell `cell`'s log.
    fn of_cell(&self, cell: u16) -> Arc<dyn LogReads>;
    /// The tree's size, root and signing identity now.
    async fn head(&self) -> Result<TreeHead, StoreError>;
    /// How far the tree is behind the feed, once a follower has ever signed it (`None` for a
    /// log never kept).
    async fn lag(&self) -> Result<Option<LogLag>, StoreError>;
    /// The newest signed checkpoint's note text, if any.
    async fn latest_checkpoint(&self) -> Result<Option<String>, StoreError>;
    /// The entry at feed position `position`, if the log has one there.
    async fn entry_at(&self, position: i64) -> Result<Option<LogEntry>, StoreError>;
    /// The feed positions of one transfer's events, in sequence order.
    async fn of_transfer(&self, req_id: &str) -> Result<Vec<ReceiptEntry>, StoreError>;
    /// The audit path of the entry at `position` in the tree of `size` entries.
    async fn inclusion(&self, position: u64, size: u64) -> Result<Inclusion, ProofError>;
    /// The proof that the tree of `to` entries extends the tree of `from`.
    async fn consistency(&self, from: u64, to: u64) -> Result<Vec<Hash>, ProofError>;
}

/// The feed positions transfer answers carry (their receipts in the tamper-evident log).
#[async_trait]
pub trait ReceiptPositions: Send + Sync {
    /// The feed positions of each transfer's events, in sequence order, by req_id (a req_id
    /// without events is absent).
    async fn positions_of(
        &self,
        req_ids: &[String],
    ) -> Result<HashMap<String, Vec<i64>>, StoreError>;
}

// ---- The recovery worker's listings (`recovery`) and the first trace (`adapters`) ----

/// Most attempts one read returns (the oldest are left out past it).
pub const ATTEMPTS_READ_MAX: i64 = 1_000;

/// One open transfer as the worker and the admin routes see it.
#[derive(Debug, Clone, PartialEq)]
pub struct StuckTransfer {
    pub req_id: String,
    /// From the transfer's `TransferCreated` event; `None` when it cannot be read.
    pub user_id: Option<i64>,
    pub from_account: Option<String>,
    pub to_account: Option<String>,
    pub asset: Option<String>,
    pub amount: Option<Decimal>,
    pub state: String,
    /// RETRYING, or REFUND_REFUSED: COMPENSATING with a refund the source refused for good,
    /// which no retry can finish (see docs/reference.md, "Recovery and manual resolution").
    pub status: String,
    pub updated_at: DateTime<Utc>,
    pub age_ms: i64,
    pub attempts: i32,
    pub refund_failures: i32,
    /// The kind of the last error (TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET, MISMATCH,
    /// UNKNOWN); the detail is kept out of this struct so it never reaches a client.
    pub last_error_category: Option<String>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
}

/// The last pass of any worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    pub worker: String,
    pub last_pass_at: DateTime<Utc>,
    /// `last_pass_at` as Unix seconds.
    pub last_pass_epoch_seconds: f64,
    /// Milliseconds since then (database time).
    pub age_ms: i64,
    pub passes: i64,
}

/// One recovery attempt, as an operator may see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub worker: String,
    pub state_before: String,
    pub state_after: Option<String>,
    /// TERMINAL, UNKNOWN, CONFLICT or ERROR; `None` while it runs (or when its worker died).
    pub outcome: Option<String>,
    /// TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET, MISMATCH or UNKNOWN; `None` without an error.
    pub error_category: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// What the admin routes and `/metrics` show of the recovery worker.
#[async_trait]
pub trait RecoveryReads: Send + Sync {
    /// Open transfers unchanged for at least `older_than`, oldest first, with their retries.
    async fn stuck(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> Result<Vec<StuckTransfer>, StoreError>;
    /// Every attempt on `req_id`, oldest first, the newest [`ATTEMPTS_READ_MAX`] at most.
    async fn attempts(&self, req_id: &str) -> Result<Vec<Attempt>, StoreError>;
    /// The last pass, or `None` when no worker ever finished one.
    async fn heartbeat(&self) -> Result<Option<Heartbeat>, StoreError>;
}

/// The traces a transfer was created under (`transfer_traces`, `docs/adr/0018-traces.md`).
#[async_trait]
pub trait TraceReads: Send + Sync {
    /// The W3C traceparent the transfer was created under, if it was created while traces
    /// were exported.
    async fn first_trace(&self, req_id: &str) -> Result<Option<String>, StoreError>;
}

// ---- The relay (`relay`) ----

/// Where one stream's relay stands, as every instance sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayStatus {
    pub stream: String,
    /// The last feed position JetStream acknowledged (the events relayed so far).
    pub position: i64,
    pub stream_sequence: i64,
    /// The last feed position handed out.
    pub head: i64,
    /// `head - position`, never negative.
    pub lag_positions: i64,
    /// Age of the oldest event not relayed yet (0 when none).
    pub lag_seconds: f64,
    /// The leader's last checkpoint or heartbeat.
    pub updated_at: DateTime<Utc>,
    pub leader: Option<String>,
    pub leader_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    pub lag_alerts: i64,
}

/// The relay's status as the routes show it.
#[async_trait]
pub trait RelayReads: Send + Sync {
    /// Every stream's relay status (none when no relay ever ran).
    async fn status(&self) -> Result<Vec<RelayStatus>, StoreError>;
}

// ---- A cell's failovers and its database's role (`adapters`) ----

/// One leader change a process observed, to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverRecord {
    pub at: SystemTime,
    /// `postgres` or `spot-core`.
    pub kind: &'static str,
    pub from: Option<String>,
    pub to: String,
    pub epoch: Option<u64>,
    pub cause: String,
}

/// One recorded failover, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFailover {
    pub at: DateTime<Utc>,
    pub kind: String,
    pub from_member: Option<String>,
    pub to_member: String,
    pub epoch: Option<i64>,
    pub cause: String,
    pub observed_by: String,
}

/// A cell's `failovers` and what its database says of its own role (the HA view's reads).
#[async_trait]
pub trait FailoverRecords: Send + Sync {
    /// Whether the database the pool reaches takes writes (a primary).
    async fn writable(&self) -> Result<bool, StoreError>;
    /// The synchronous standbys the primary names.
    async fn sync_standbys(&self) -> Result<i64, StoreError>;
    /// The newest recorded failover, if any.
    async fn last(&self) -> Result<Option<StoredFailover>, StoreError>;
    /// Records `rows`, observed by `observed_by`, in one transaction.
    async fn record(&self, rows: &[FailoverRecord], observed_by: &str) -> Result<(), StoreError>;
}

// ---- All of them ----

/// The read side's ports, one of each: what `edge::reads::ReadSide` holds.
#[derive(Clone)]
pub struct Reads {
    pub transfers: Arc<dyn TransferReads>,
    pub admin: Arc<dyn AdminReads>,
    pub feed: Arc<dyn FeedReads>,
    pub log: Arc<dyn LogReads>,
    pub receipts: Arc<dyn ReceiptPositions>,
    pub recovery: Arc<dyn RecoveryReads>,
    pub traces: Arc<dyn TraceReads>,
    pub relay: Arc<dyn RelayReads>,
}
