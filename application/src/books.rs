//! The two account systems as the core asks more of them than movements (`domain::AccountPort`):
//! a user's balances and statuses, one req_id's records, an external deposit, the conservation
//! check's reads, spot-core's status and horizon. Each is a port, [`FundingBook`] and
//! [`SpotBook`], implemented by `adapters` (`FundingLedger` over PostgreSQL, `SpotAdapter` over
//! spot-core's protocol) and by in-memory books in the simulation and the fast tests. The values
//! they answer with are the core's own, defined here, so an edge that renders them needs no
//! adapter.

use std::collections::BTreeMap;

use async_trait::async_trait;
use domain::{AccountPort, AccountType, Amount, AssetSymbol, Operation, ReqId, UserId};
use rust_decimal::Decimal;
use spot_core::client::ClientError;
use spot_core::protocol::{CoreStatus, LookupOp};

use crate::error::StoreError;

/// Status of an account, in either system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountStatus {
    Active,
    Frozen,
    Disabled,
}

impl AccountStatus {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "ACTIVE" => Some(Self::Active),
            "FROZEN" => Some(Self::Frozen),
            "DISABLED" => Some(Self::Disabled),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "ACTIVE",
            Self::Frozen => "FROZEN",
            Self::Disabled => "DISABLED",
        }
    }
}

/// Why a FUNDING call that is not a movement failed.
#[derive(Debug, thiserror::Error)]
pub enum FundingError {
    /// The same external id was already used for a different deposit.
    #[error("external id already used for a different deposit")]
    ExternalIdReused,
    #[error("account not found")]
    AccountNotFound,
    #[error("balance would exceed the ledger's ceiling")]
    Overflow,
    #[error("funding store")]
    Store(#[from] StoreError),
}

/// What an external deposit came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepositReceipt {
    /// False when the external id had been seen before and nothing changed.
    pub applied_now: bool,
    pub balance: Decimal,
}

/// One funding balance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FundingBalance {
    pub asset: String,
    pub balance: Decimal,
    pub status: String,
}

/// The journal's record of one (req_id, operation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub operation: Operation,
    pub user_id: i64,
    pub asset: String,
    pub amount: Decimal,
    pub applied: bool,
    pub code: Option<String>,
    /// When the journal decided it (the store's time).
    pub at: chrono::DateTime<chrono::Utc>,
}

/// One SPOT balance as spot-core reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpotBalance {
    pub asset: String,
    pub available: Decimal,
    pub status: String,
}

/// Why a spot-core call that is not a movement (status, balances, horizon, the conservation
/// check's reads) failed.
#[derive(Debug, thiserror::Error)]
pub enum SpotError {
    /// No answer: the client's error, kept whole, says whether the request may have reached
    /// spot-core (`SpotError::outcome_unknown`).
    #[error("spot-core unreachable or failed: {0}")]
    Transport(#[from] ClientError),
    #[error("spot-core answered unexpectedly: {0}")]
    Unexpected(String),
}

impl SpotError {
    /// False only when the request provably never reached spot-core (no connection could be
    /// made): then nothing changed there. An unexpected answer means it was received.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            SpotError::Transport(e) => e.outcome_unknown(),
            SpotError::Unexpected(_) => true,
        }
    }
}

/// One movement an account system applied, as the conservation check's reads and the failover
/// repair's lookup both report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMovement {
    pub req_id: String,
    pub system: AccountType,
    pub operation: Operation,
    pub user_id: i64,
    pub asset: String,
    pub amount: Decimal,
}

/// One row of the funding side read after a position. `consumed` is true when the row's
/// transaction is below the read's snapshot watermark (it can be stored as read for good); a row
/// above it is visible in this snapshot, counts in this run, and is read again by the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FundingItem {
    /// External deposits of one asset (summed by the store).
    Deposits {
        asset: String,
        sum: Decimal,
        rows: u64,
        consumed: bool,
    },
    Applied {
        movement: AppliedMovement,
        consumed: bool,
    },
}

/// FUNDING's side of one read, from one consistent snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FundingRead {
    /// Sum of balances per asset (live, whole: one row per account).
    pub balances: BTreeMap<String, Decimal>,
    /// The snapshot's watermark: every transaction below it has ended.
    pub watermark: u64,
    /// Journal rows read (applied movements after the position).
    pub journal_rows: u64,
    /// External deposit rows read after the position.
    pub deposit_rows: u64,
    /// FUNDING moved in with partitions minus moved out, per asset (ADR 0023 §5: the totals
    /// each switch recorded; live, read in the same snapshot as `balances`, whose partitions
    /// they account for).
    pub moved: BTreeMap<String, Decimal>,
}

/// SPOT's side of one read: totals per asset and the last journal seq that produced exactly
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpotRead {
    pub totals: BTreeMap<String, Decimal>,
    pub last_seq: u64,
    /// Journal records read after the position (all kinds but the conservation check's own
    /// `retain` marks).
    pub records: u64,
    /// SPOT balances moved in with partitions minus moved out, per asset, from the `move_in`
    /// and `move_out` records read after the position (ADR 0023 §5): consumed like the rest.
    pub moved: BTreeMap<String, Decimal>,
}

/// Why spot-core's side could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SpotReadError {
    #[error(transparent)]
    Spot(#[from] SpotError),
    /// spot-core no longer holds the records after the position asked for (compacted and not
    /// archived): the check cannot be exact from there.
    #[error(
        "spot-core's journal is compacted: records after seq {after_seq} are gone ({message}); \
         a full check needs spot-core's archive dir (--archive-dir)"
    )]
    JournalCompacted { after_seq: u64, message: String },
}

/// spot-core's record of a req_id (the failover repair's lookup).
#[derive(Debug, Clone)]
pub struct SpotRecord {
    /// The movements applied (refusals left out).
    pub applied: Vec<AppliedMovement>,
    /// Every entry of the lookup, refusals included, as spot-core answered.
    pub raw: serde_json::Value,
}

/// The FUNDING account system beyond its movements.
#[async_trait]
pub trait FundingBook: AccountPort {
    /// One user's FUNDING accounts: balance and status per asset.
    async fn balances(&self, user: UserId) -> Result<Vec<FundingBalance>, FundingError>;

    /// One account's balance; `None` when it does not exist.
    async fn balance(
        &self,
        user: UserId,
        asset: &AssetSymbol,
    ) -> Result<Option<Decimal>, FundingError>;

    /// Whether the account exists (a FUNDING target must).
    async fn account_exists(&self, user: UserId, asset: &AssetSymbol)
        -> Result<bool, FundingError>;

    /// The journal's rows of one req_id.
    async fn journal_for(&self, req_id: &ReqId) -> Result<Vec<JournalEntry>, FundingError>;

    /// Credits an external deposit once per external id.
    async fn external_deposit(
        &self,
        external_id: &str,
        user: UserId,
        asset: &AssetSymbol,
        amount: Amount,
    ) -> Result<DepositReceipt, FundingError>;

    /// Sets an account's status.
    async fn set_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), FundingError>;

    /// The conservation check's read after `since` (a snapshot watermark), every row handed to
    /// `sink` as it streams in, from one consistent snapshot.
    async fn audit_read(
        &self,
        since: u64,
        sink: &mut (dyn FnMut(FundingItem) + Send),
    ) -> Result<FundingRead, FundingError>;
}

/// The SPOT account system (spot-core) beyond its movements.
#[async_trait]
pub trait SpotBook: AccountPort {
    /// One user's SPOT accounts, as spot-core answers.
    async fn balances(&self, user: UserId) -> Result<Vec<SpotBalance>, SpotError>;

    /// What spot-core recorded under one req_id, as it answers.
    async fn lookup_records(&self, req_id: &ReqId) -> Result<Vec<LookupOp>, SpotError>;

    /// What spot-core applied under `req_id` (an expired req_id is an error, never "nothing").
    async fn record_of(&self, req_id: &str) -> Result<SpotRecord, SpotError>;

    /// spot-core's status (its idempotency horizon among it).
    async fn core_status(&self) -> Result<CoreStatus, SpotError>;

    /// Sets an account's status.
    async fn set_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), SpotError>;

    /// Moves spot-core's idempotency horizon to `before_ms` (never back).
    async fn advance_horizon(&self, before_ms: u64) -> Result<CoreStatus, SpotError>;

    /// The conservation check's read after journal seq `after_seq`, every applied movement
    /// handed to `sink`.
    async fn audit_read(
        &self,
        after_seq: u64,
        sink: &mut (dyn FnMut(AppliedMovement) + Send),
    ) -> Result<SpotRead, SpotReadError>;

    /// Tells spot-core it may compact its journal up to `after_seq` (a durable checkpoint holds
    /// it).
    async fn retain(&self, after_seq: u64) -> Result<Option<CoreStatus>, SpotError>;
}
