//! The ports the coordinator runs on: the event log (`TransferLog`), the bookkeeping kept beside
//! it, one port per concern (`ClientKeys`: client-key claims; `Leases`: the one lease per
//! transfer; `DailyReservations`: the daily limits' counters) and time (`Clock`). Production
//! wires the PostgreSQL implementations in `pg.rs` and the system clock (`Coordinator::new`); the
//! deterministic simulation (`sim/`, `ledger-sim`) wires in-memory ones with the same contracts
//! (`Coordinator::with_ports`). The account systems are the other port, `domain::AccountPort`.
//!
//! The traits are `async_trait` objects: cqrs-es 0.5's `EventStore` uses async functions in
//! traits and is not object-safe, so the log is its own narrower trait.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use cqrs_es::persist::EventStoreAggregateContext;
use domain::{
    ErrorCode, Movement, Operation, ReqId, Transfer, TransferEvent, TransferState, UserId,
};

use crate::daily::{Charge, DailyLimits};
use crate::error::CoordinatorError;

/// A transfer's events folded, at the sequence of its last one: what a command is decided on.
pub type Context = EventStoreAggregateContext<Transfer>;

/// One transfer's events to append after `expected_sequence`, all or nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub aggregate_id: String,
    /// The sequence the writer's context was folded to (`Context::current_sequence`): the
    /// commit's events take the sequences after it, or the commit is refused (`Conflict`).
    pub expected_sequence: usize,
    pub events: Vec<TransferEvent>,
    /// The transfer's owner, written with every event (the feed serves one user's stream).
    pub owner: Option<UserId>,
}

/// The event log of transfers (the source of truth).
///
/// Contract: `append` is all or nothing and durable when it answers `Ok`; it refuses with
/// `Conflict` when any of the sequences after `expected_sequence` is taken (optimistic
/// concurrency: the one version check), and a `TransferCreated` carrying a client key (`cid`)
/// commits only while the key's claim names its req_id. `OutcomeUnknown` means the outcome is unknown
/// (the commit may or may not be durable); the caller reloads before acting again.
#[async_trait]
pub trait TransferLog: Send + Sync {
    /// The transfer's events folded; an empty aggregate at sequence 0 when it has none.
    async fn load(&self, req_id: &ReqId) -> Result<Context, CoordinatorError>;

    /// Appends one commit; returns the sequence of its last event.
    async fn append(&self, commit: Commit) -> Result<usize, CoordinatorError>;

    /// Appends many transfers' commits (the bulk path), one answer per commit in order, each
    /// with `append`'s contract; one commit's conflict does not refuse the others. This default
    /// appends them one by one; an implementation may share one durable write among them.
    async fn append_many(&self, commits: Vec<Commit>) -> Vec<Result<usize, CoordinatorError>> {
        let mut answers = Vec::with_capacity(commits.len());
        for commit in commits {
            answers.push(self.append(commit).await);
        }
        answers
    }

    /// Creates each of `creations` together with its claim and its charge, all or nothing per
    /// creation, in one durable write (ADR 0022): a creation whose key is claimed by then is
    /// `KeyTaken`, one a daily limit refuses is `Refused`, and neither leaves anything behind.
    /// The charges are decided in order with `daily::DailyUsage::charge_all`'s answers, on
    /// counters nobody else changes until the write is durable. One answer per creation, in
    /// order; an error has `append`'s meaning (none of that creation, or all of it, may be
    /// durable).
    ///
    /// `None`: this log keeps no claims or counters of its own, and the coordinator claims,
    /// charges and appends in separate steps (`ClientKeys`, `DailyReservations`). That is the
    /// default.
    async fn create_many(
        &self,
        creations: Vec<Creation>,
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Option<Vec<Result<CreationOutcome, CoordinatorError>>> {
        let _ = (creations, limits, day);
        None
    }

    /// Writes each item's commit together with the FUNDING movement it announces and the events
    /// recording FUNDING's decision, all or nothing per item, in one durable write (ADR 0024):
    /// the claim and charge of a creation as `create_many` writes them, then the movement
    /// (FUNDING's own checks and journal key), then the events (the announcement, then
    /// `record`'s events for the decision). `Announced` when only the announcement was written
    /// (the movement was not fresh, or FUNDING refused to decide it here): the caller then
    /// makes the call the generic way. One answer per item, in order; an error has `append`'s
    /// meaning (the item's movement and its events are durable both or neither).
    ///
    /// `None`: FUNDING is not in this log's database, and the caller takes the separate steps
    /// (announce, call, record). That is the default.
    async fn commit_funded(
        &self,
        items: &[Funded],
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Option<Vec<Result<FundedOutcome, CoordinatorError>>> {
        let _ = (items, limits, day);
        None
    }

    /// Whether `commit_funded` writes (the coordinator asks before staging its items).
    fn funds_together(&self) -> bool {
        false
    }
}

/// FUNDING's decision of a movement made in the same transaction as its record (ADR 0024).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FundingDecision {
    Applied,
    Refused { code: String, message: String },
}

/// The events recording a FUNDING decision, after an item's announcement: pure (the aggregate's
/// own table on a copy), so a store may ask it inside its transaction, more than once.
pub type RecordOf =
    Arc<dyn Fn(&FundingDecision) -> Result<Vec<TransferEvent>, CoordinatorError> + Send + Sync>;

/// One item of `TransferLog::commit_funded`: a commit announcing a FUNDING call (with, for a
/// creation, its claim and its charge), the call, and what records its decision.
#[derive(Clone)]
pub struct Funded {
    pub creation: Creation,
    pub operation: Operation,
    pub movement: Movement,
    pub record: RecordOf,
}

impl std::fmt::Debug for Funded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Funded")
            .field("creation", &self.creation)
            .field("operation", &self.operation)
            .field("movement", &self.movement)
            .finish_non_exhaustive()
    }
}

/// What one item of `TransferLog::commit_funded` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FundedOutcome {
    /// The announcement, the movement and the events recording `decision`, all durable: the
    /// sequence of the last event.
    Made {
        sequence: usize,
        decision: FundingDecision,
    },
    /// Only the announcement is durable (its sequence): the call is still to make.
    Announced(usize),
    /// A creation whose key was claimed first: nothing was written for it.
    KeyTaken,
    /// A creation a daily limit refused: nothing was written for it.
    Refused(ErrorCode),
}

/// A transfer's creation with what becomes durable together with it (ADR 0022): its commit
/// (`TransferCreated` and `SourceWithdrawStarted`, at sequence 0), the claim of its client key
/// when it has one, and its charge against the daily limits when they are on.
#[derive(Debug, Clone, PartialEq)]
pub struct Creation {
    pub commit: Commit,
    /// A key found unclaimed, to claim under the creation's req_id.
    pub claim: Option<CidClaim>,
    pub charge: Option<Charge>,
}

/// What one creation of `TransferLog::create_many` came to: all of it durable, or none of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreationOutcome {
    /// Created, claimed and charged: the sequence of the creation's last event.
    Appended(usize),
    /// Its client key was claimed by someone else first: nothing was written for it.
    KeyTaken,
    /// A daily limit refused its charge: nothing was written for it.
    Refused(ErrorCode),
}

/// A client key's claim: the req_id it fixed and the body it is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey {
    pub req_id: ReqId,
    pub fingerprint: String,
}

/// What re-keying an orphan claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rekeyed {
    /// The claim named the old req_id and no transfer existed under it: it names the new one.
    Swapped,
    /// A transfer exists under the old req_id: the claim is left as it was.
    Created,
    /// The claim no longer names the old req_id (another request re-keyed it): unchanged.
    Moved,
}

/// The client keys' claims (`cid` → req_id and body), shared by every process (`submit.rs`).
/// Every error means the outcome is unknown.
#[async_trait]
pub trait ClientKeys: Send + Sync {
    /// The claim of `cid` for `user`, if any.
    async fn find(&self, user: UserId, cid: &str) -> Result<Option<ClientKey>, CoordinatorError>;

    /// Claims `cid` for `user` with `req_id` unless it is claimed already; whether it was.
    async fn claim(
        &self,
        user: UserId,
        cid: &str,
        req_id: &ReqId,
        fingerprint: &str,
    ) -> Result<bool, CoordinatorError>;

    /// `claim` for many keys at once (no `(user, cid)` twice): whether each was claimed now, in
    /// order. One by one here; PostgreSQL's claims them in one statement. An error leaves some
    /// claimed and others not, which is safe: a claim without a transfer is created under on
    /// the request's retry.
    async fn claim_many(&self, claims: &[CidClaim]) -> Result<Vec<bool>, CoordinatorError> {
        let mut claimed = Vec::with_capacity(claims.len());
        for c in claims {
            claimed.push(
                self.claim(c.user, &c.cid, &c.req_id, &c.fingerprint)
                    .await?,
            );
        }
        Ok(claimed)
    }

    /// In one transaction: points the claim at `new` only if it names `old` and no transfer was
    /// created under `old`.
    async fn rekey(
        &self,
        user: UserId,
        cid: &str,
        old: &ReqId,
        new: &ReqId,
    ) -> Result<Rekeyed, CoordinatorError>;
}

/// One claim of `ClientKeys::claim_many`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidClaim {
    pub user: UserId,
    pub cid: String,
    pub req_id: ReqId,
    pub fingerprint: String,
}

/// A request for the one lease on a transfer (`Leases::take`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest<'a> {
    /// The transfer to lease.
    pub req_id: ReqId,
    /// Its state as the taker read it (recorded with a new lease row).
    pub state: TransferState,
    /// Who takes it: a recovery worker's id, or a manual resolution's `manual:<operator>:..`.
    pub owner: &'a str,
    /// How long the lease lasts unless renewed.
    pub lease: Duration,
    /// Whether the transfer's retry time must have come (a recovery worker waits for it; an
    /// operator does not).
    pub wait_for_retry_time: bool,
}

/// The one lease per transfer, shared by the recovery workers and manual resolution
/// (`resolve.rs`), so no two of them drive one transfer at once. Every error means the outcome
/// is unknown.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Takes the lease if nobody holds a live one (and, with `wait_for_retry_time`, once the
    /// transfer's retry time has come): the transfer's attempts so far when taken, `None` when
    /// someone else holds it (or it is not due).
    async fn take(&self, request: &LeaseRequest<'_>) -> Result<Option<i32>, CoordinatorError>;

    /// Extends `owner`'s lease by `lease` from now; false when `owner` no longer holds it.
    async fn renew(
        &self,
        req_id: &ReqId,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, CoordinatorError>;

    /// Gives `owner`'s lease back (nothing when someone else holds it).
    async fn release(&self, req_id: &ReqId, owner: &str) -> Result<(), CoordinatorError>;
}

/// The per-user daily counters behind the daily limits, shared by every process. Every error
/// means the outcome is unknown (nothing is known to be reserved).
#[async_trait]
pub trait DailyReservations: Send + Sync {
    /// Reserves one transfer of `charge` on `day`, or the refusal (nothing reserved).
    async fn reserve(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<Result<(), ErrorCode>, CoordinatorError>;

    /// Reserves each of `charges` on `day`, in order, with the answers `reserve` called for
    /// each, one after another, would give (a store error: nothing reserved). The default does
    /// exactly that; PostgreSQL's does the batch in one transaction.
    async fn reserve_many(
        &self,
        limits: &DailyLimits,
        charges: &[Charge],
        day: NaiveDate,
    ) -> Result<Vec<Result<(), ErrorCode>>, CoordinatorError> {
        let mut answers = Vec::with_capacity(charges.len());
        for charge in charges {
            answers.push(self.reserve(limits, charge, day).await?);
        }
        Ok(answers)
    }

    /// Gives back a reservation `reserve` made with the same arguments.
    async fn release(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<(), CoordinatorError>;
}

/// Time as the coordinator and the recovery worker see it, and the req_ids it stamps.
#[async_trait]
pub trait Clock: Send + Sync {
    /// Now, UTC.
    fn now(&self) -> DateTime<Utc>;

    /// Now as Unix milliseconds.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.now().timestamp_millis()).unwrap_or(0)
    }

    /// Waits `duration`.
    async fn sleep(&self, duration: Duration);

    /// A new req_id (a ULID: this clock's time and a random part).
    fn req_id(&self) -> ReqId;
}

/// The machine's clock, tokio's timers and `ReqId::generate`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn now_ms(&self) -> u64 {
        crate::horizon::now_ms()
    }

    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn req_id(&self) -> ReqId {
        ReqId::generate()
    }
}
