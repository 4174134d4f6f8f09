//! The ports the coordinator runs on: the event log (`TransferLog`), the bookkeeping kept beside
//! it (`Bookkeeping`: client-key claims, leases, daily limits) and time (`Clock`). Production
//! wires the PostgreSQL implementations in `pg.rs` and the system clock (`Coordinator::new`); the
//! deterministic simulation (`sim/`, `ledger-sim`) wires in-memory ones with the same contracts
//! (`Coordinator::with_ports`). The account systems are the other port, `domain::AccountPort`.
//!
//! The traits are `async_trait` objects: cqrs-es 0.5's `EventStore` uses async functions in
//! traits and is not object-safe, so the log is its own narrower trait.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use cqrs_es::persist::EventStoreAggregateContext;
use domain::{Amount, AssetSymbol, ErrorCode, ReqId, Transfer, TransferEvent, UserId};

use crate::error::CoordinatorError;
use crate::limits::DailyLimits;

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
/// commits only while the key's claim names its req_id. `Store` means the outcome is unknown
/// (the commit may or may not be durable); the caller reloads before acting again.
#[async_trait]
pub trait TransferLog: Send + Sync {
    /// The transfer's events folded; an empty aggregate at sequence 0 when it has none.
    async fn load(&self, aggregate_id: &str) -> Result<Context, CoordinatorError>;

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
}

/// A client key's claim: the req_id it fixed and the body it is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey {
    pub req_id: String,
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

/// The bookkeeping beside the log, shared by every process: client-key claims (`submit.rs`),
/// the one lease per transfer (`lease.rs`, `resolve.rs`, the recovery worker) and the daily
/// limits (`limits.rs`). Every error is `CoordinatorError::Store` (outcome unknown).
#[async_trait]
pub trait Bookkeeping: Send + Sync {
    /// The claim of `cid` for `user`, if any.
    async fn find_client_key(
        &self,
        user: UserId,
        cid: &str,
    ) -> Result<Option<ClientKey>, CoordinatorError>;

    /// Claims `cid` for `user` with `req_id` unless it is claimed already; whether it was.
    async fn claim_client_key(
        &self,
        user: UserId,
        cid: &str,
        req_id: &ReqId,
        fingerprint: &str,
    ) -> Result<bool, CoordinatorError>;

    /// In one transaction: points the claim at `new` only if it names `old` and no transfer was
    /// created under `old`.
    async fn rekey_client_key(
        &self,
        user: UserId,
        cid: &str,
        old: &ReqId,
        new: &ReqId,
    ) -> Result<Rekeyed, CoordinatorError>;

    /// Takes the lease on `req_id` for `lease_ms` if nobody holds a live one (and, with
    /// `respect_retry_time`, once its retry time has come): the attempts so far when taken.
    async fn take_lease(
        &self,
        req_id: &str,
        state: &str,
        owner: &str,
        lease_ms: i64,
        respect_retry_time: bool,
    ) -> Result<Option<i32>, CoordinatorError>;

    /// Extends `owner`'s lease by `lease_ms` from now; false when `owner` no longer holds it.
    async fn renew_lease(
        &self,
        req_id: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<bool, CoordinatorError>;

    /// Gives `owner`'s lease back (nothing when someone else holds it).
    async fn release_lease(&self, req_id: &str, owner: &str) -> Result<(), CoordinatorError>;

    /// Reserves one transfer of `amount` for `user` on `day`, or the refusal (nothing reserved).
    async fn reserve_daily(
        &self,
        limits: &DailyLimits,
        user: UserId,
        asset: &AssetSymbol,
        amount: Amount,
        day: NaiveDate,
    ) -> Result<Result<(), ErrorCode>, CoordinatorError>;

    /// Reserves each of `charges` on `day`, in order, with the answers `reserve_daily` called
    /// for each, one after another, would give (a store error: nothing reserved). The default
    /// does exactly that; PostgreSQL's does the batch in one transaction.
    async fn reserve_daily_many(
        &self,
        limits: &DailyLimits,
        charges: &[crate::limits::Charge],
        day: NaiveDate,
    ) -> Result<Vec<Result<(), ErrorCode>>, CoordinatorError> {
        let mut answers = Vec::with_capacity(charges.len());
        for (user, asset, amount) in charges {
            answers.push(
                self.reserve_daily(limits, *user, asset, *amount, day)
                    .await?,
            );
        }
        Ok(answers)
    }

    /// Gives back a reservation `reserve_daily` made with the same arguments.
    async fn release_daily(
        &self,
        limits: &DailyLimits,
        user: UserId,
        asset: &AssetSymbol,
        amount: Amount,
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
