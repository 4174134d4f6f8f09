//! The PostgreSQL implementations of the coordinator's ports (`application::ports`): the event log over
//! `adapters::event_store` (postgres-es's table, group-committed appends), the client keys'
//! claims (`transfer_cids`), the leases (`transfer_retries`) and the daily counters
//! (`daily_transfer_counts`, `daily_transfer_amounts`).

use std::sync::Arc;
use std::time::Duration;

use crate::event_store::{BatchingEventRepository, Extras, TransferStore, Written};
use async_trait::async_trait;
use chrono::NaiveDate;
use cqrs_es::persist::{EventStoreAggregateContext, PersistedEventStore};
use cqrs_es::EventStore;
use domain::{ErrorCode, ReqId, Transfer, UserId};
use sqlx::PgPool;

use application::daily::{Charge, DailyLimits};
use application::CoordinatorError;

use super::claims::claim_in;
use super::claims_reader;
use super::driver::unknown;
use super::funded;
use super::serialized::{owner_metadata, persistence, serialize};
use super::{lease, limits};
use crate::group_commit::GroupCommit;
use crate::FundingLedger;
use application::ports::{
    CidClaim, ClientKey, ClientKeys, Commit, Context, Creation, CreationOutcome, DailyReservations,
    Funded, FundedOutcome, LeaseRequest, Leases, Rekeyed, TransferLog,
};

/// The event log in PostgreSQL.
#[derive(Clone)]
pub struct PgTransferLog {
    store: Arc<TransferStore>,
    /// The store's own repository (the same appender), for `append_many`.
    repo: BatchingEventRepository,
    /// Whether `create_many` writes a creation with its claim and charge (ADR 0022); without,
    /// the coordinator takes the separate steps.
    together: bool,
    /// FUNDING, when it lives in this log's database and its movements are made in the
    /// appender's transaction with the events announcing and recording them (ADR 0024).
    funding: Option<FundingLedger>,
}

impl PgTransferLog {
    /// Over `pool`; the group-commit appender is started on the current tokio runtime and owned
    /// by this value's clones.
    pub fn new(pool: PgPool) -> Self {
        let repo = BatchingEventRepository::new(pool);
        Self {
            store: Arc::new(PersistedEventStore::new_event_store(repo.clone())),
            repo,
            together: true,
            funding: None,
        }
    }

    /// This log with `commit_funded` writing: `funding` is over this log's own database, and
    /// a commit announcing one of its movements makes it in the same transaction (ADR 0024).
    pub fn with_funding(mut self, funding: FundingLedger) -> Self {
        self.funding = Some(funding);
        self
    }

    /// This log with `create_many` and `commit_funded` answering `None`: the coordinator
    /// claims, charges, creates and calls FUNDING in separate steps, as before ADRs 0022 and
    /// 0024 (the tests of those paths use it).
    pub fn apart(mut self) -> Self {
        self.together = false;
        self.funding = None;
        self
    }
}

#[async_trait]
impl TransferLog for PgTransferLog {
    async fn load(&self, req_id: &ReqId) -> Result<Context, CoordinatorError> {
        Ok(self.store.load_aggregate(&req_id.to_string()).await?)
    }

    async fn append(&self, commit: Commit) -> Result<usize, CoordinatorError> {
        let metadata = owner_metadata(commit.owner);
        // In plain event-store mode the store reads only the id and the sequence of the context.
        let ctx = EventStoreAggregateContext {
            aggregate_id: commit.aggregate_id,
            aggregate: Transfer::default(),
            current_sequence: commit.expected_sequence,
            current_snapshot: None,
        };
        let committed = self.store.commit(commit.events, ctx, metadata).await?;
        Ok(committed
            .last()
            .map_or(commit.expected_sequence, |e| e.sequence))
    }

    /// Every commit goes to the group-commit appender as one job, so they share one
    /// transaction (one INSERT, one durable commit); each keeps its own version check, and a
    /// conflicting one is refused alone.
    async fn append_many(&self, commits: Vec<Commit>) -> Vec<Result<usize, CoordinatorError>> {
        let mut answers: Vec<Result<usize, CoordinatorError>> = Vec::with_capacity(commits.len());
        let mut serialized = Vec::with_capacity(commits.len());
        for commit in &commits {
            match serialize(commit) {
                Ok(events) => {
                    answers.push(Ok(commit.expected_sequence + commit.events.len()));
                    serialized.push(events);
                }
                Err(e) => answers.push(Err(e)),
            }
        }
        let mut appended = self
            .repo
            .append_many::<Transfer>(serialized)
            .await
            .into_iter();
        for answer in &mut answers {
            if answer.is_ok() {
                if let Some(Err(e)) = appended.next() {
                    *answer = Err(persistence(e));
                }
            }
        }
        answers
    }

    async fn create_many(
        &self,
        creations: Vec<Creation>,
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Option<Vec<Result<CreationOutcome, CoordinatorError>>> {
        match self.together {
            true => Some(self.create_together(creations, limits, day).await),
            false => None,
        }
    }

    async fn commit_funded(
        &self,
        items: &[Funded],
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Option<Vec<Result<FundedOutcome, CoordinatorError>>> {
        let funding = self.funding.as_ref()?;
        Some(funded::commit(&self.repo, funding, items, limits, day).await)
    }

    fn funds_together(&self) -> bool {
        self.funding.is_some()
    }
}

impl PgTransferLog {
    /// `create_many` of the log: every creation goes to the group-commit appender with its
    /// claim and its charge (`event_store::Extras`), written in its one transaction.
    async fn create_together(
        &self,
        creations: Vec<Creation>,
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Vec<Result<CreationOutcome, CoordinatorError>> {
        let mut answers: Vec<Result<usize, CoordinatorError>> = Vec::with_capacity(creations.len());
        let mut serialized = Vec::with_capacity(creations.len());
        let mut claims = Vec::with_capacity(creations.len());
        let mut charges = Vec::with_capacity(creations.len());
        for creation in creations {
            match serialize(&creation.commit) {
                Ok(events) => {
                    let commit = &creation.commit;
                    answers.push(Ok(commit.expected_sequence + commit.events.len()));
                    serialized.push(events);
                    claims.push(creation.claim);
                    charges.push(creation.charge);
                }
                Err(e) => answers.push(Err(e)),
            }
        }
        let extras = Extras {
            claims,
            charges,
            limits: Arc::new(limits.clone()),
            day,
            calls: Vec::new(),
        };
        let mut written = self
            .repo
            .create_many::<Transfer>(serialized, extras)
            .await
            .into_iter();
        answers
            .into_iter()
            .map(|answer| {
                let sequence = answer?;
                match written.next() {
                    Some(Ok(Written::Appended)) => Ok(CreationOutcome::Appended(sequence)),
                    Some(Ok(Written::KeyTaken)) => Ok(CreationOutcome::KeyTaken),
                    Some(Ok(Written::Refused(code))) => Ok(CreationOutcome::Refused(code)),
                    // No call was sent with these creations.
                    Some(Ok(Written::Funded(_))) => Err(CoordinatorError::invariant(
                        "a creation without a call answered as funded",
                    )),
                    Some(Err(e)) => Err(persistence(e)),
                    None => Err(CoordinatorError::invariant("the appender lost an answer")),
                }
            })
            .collect()
    }
}

/// The client keys' claims in PostgreSQL (`transfer_cids`).
#[derive(Clone)]
pub struct PgClientKeys {
    pool: PgPool,
    /// The finds' reader (`claims_reader.rs`), started at the first find on the runtime
    /// serving it, stopped when the last clone is dropped.
    reader: Arc<std::sync::OnceLock<GroupCommit<claims_reader::Ask>>>,
}

impl PgClientKeys {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            reader: Arc::default(),
        }
    }
}

#[async_trait]
impl ClientKeys for PgClientKeys {
    async fn find(&self, user: UserId, cid: &str) -> Result<Option<ClientKey>, CoordinatorError> {
        let reader = self.reader.get_or_init(|| claims_reader::start(&self.pool));
        let found = claims_reader::find(reader, user.as_i64(), cid)
            .await
            .map_err(CoordinatorError::outcome_unknown)?;
        let Some((req_id, fingerprint)) = found else {
            return Ok(None);
        };
        let req_id = ReqId::parse(&req_id)
            .map_err(|_| CoordinatorError::invariant("stored req_id is malformed"))?;
        Ok(Some(ClientKey {
            req_id,
            fingerprint,
        }))
    }

    async fn claim(
        &self,
        user: UserId,
        cid: &str,
        req_id: &ReqId,
        fingerprint: &str,
    ) -> Result<bool, CoordinatorError> {
        let inserted = sqlx::query(
            "INSERT INTO transfer_cids (user_id, cid, req_id, fingerprint) VALUES ($1, $2, $3, $4)
             ON CONFLICT (user_id, cid) DO NOTHING",
        )
        .bind(user.as_i64())
        .bind(cid)
        .bind(req_id.to_string())
        .bind(fingerprint)
        .execute(&self.pool)
        .await
        .map_err(unknown)?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn claim_many(&self, claims: &[CidClaim]) -> Result<Vec<bool>, CoordinatorError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        // One statement, one commit.
        let mut conn = self.pool.acquire().await.map_err(unknown)?;
        claim_in(&mut conn, claims).await.map_err(unknown)
    }

    async fn rekey(
        &self,
        user: UserId,
        cid: &str,
        old: &ReqId,
        new: &ReqId,
    ) -> Result<Rekeyed, CoordinatorError> {
        let mut tx = self.pool.begin().await.map_err(unknown)?;
        let swapped = sqlx::query(
            "UPDATE transfer_cids SET req_id = $4
             WHERE user_id = $1 AND cid = $2 AND req_id = $3",
        )
        .bind(user.as_i64())
        .bind(cid)
        .bind(old.to_string())
        .bind(new.to_string())
        .execute(&mut *tx)
        .await
        .map_err(unknown)?
        .rows_affected();
        let created = eventlog::transfers::transfer_has_events(&mut tx, &old.to_string())
            .await
            .map_err(unknown)?;
        if created {
            drop(tx);
            return Ok(Rekeyed::Created);
        }
        if swapped == 1 {
            tx.commit().await.map_err(unknown)?;
            return Ok(Rekeyed::Swapped);
        }
        drop(tx);
        Ok(Rekeyed::Moved)
    }
}

/// The transfers' leases in PostgreSQL (`transfer_retries`).
#[derive(Clone)]
pub struct PgLeases {
    pool: PgPool,
}

impl PgLeases {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl Leases for PgLeases {
    async fn take(&self, request: &LeaseRequest<'_>) -> Result<Option<i32>, CoordinatorError> {
        Ok(lease::take(&self.pool, request).await.map_err(unknown)?)
    }

    async fn renew(
        &self,
        req_id: &ReqId,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, CoordinatorError> {
        let renewed = sqlx::query(
            "UPDATE transfer_retries
             SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
             WHERE req_id = $1 AND lease_owner = $2",
        )
        .bind(req_id.to_string())
        .bind(owner)
        .bind(lease::millis(lease))
        .execute(&self.pool)
        .await
        .map_err(unknown)?;
        Ok(renewed.rows_affected() == 1)
    }

    async fn release(&self, req_id: &ReqId, owner: &str) -> Result<(), CoordinatorError> {
        sqlx::query(
            "UPDATE transfer_retries SET lease_owner = NULL, lease_until = NULL, updated_at = now()
             WHERE req_id = $1 AND lease_owner = $2",
        )
        .bind(req_id.to_string())
        .bind(owner)
        .execute(&self.pool)
        .await
        .map_err(unknown)?;
        Ok(())
    }
}

/// The daily limits' counters in PostgreSQL (`daily_transfer_counts`, `daily_transfer_amounts`;
/// the SQL is `limits.rs`).
#[derive(Clone)]
pub struct PgDailyReservations {
    pool: PgPool,
}

impl PgDailyReservations {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl DailyReservations for PgDailyReservations {
    async fn reserve(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<Result<(), ErrorCode>, CoordinatorError> {
        Ok(limits::reserve(&self.pool, limits, charge, day)
            .await
            .map_err(unknown)?)
    }

    async fn reserve_many(
        &self,
        limits: &DailyLimits,
        charges: &[Charge],
        day: NaiveDate,
    ) -> Result<Vec<Result<(), ErrorCode>>, CoordinatorError> {
        Ok(limits::reserve_many(&self.pool, limits, charges, day)
            .await
            .map_err(unknown)?)
    }

    async fn release(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<(), CoordinatorError> {
        Ok(limits::release(&self.pool, limits, charge, day)
            .await
            .map_err(unknown)?)
    }
}
