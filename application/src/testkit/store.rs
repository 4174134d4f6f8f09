//! The coordinator's stores in memory, with the contracts of the PostgreSQL ones (`pg.rs`):
//! the event log (`MemLog`: all-or-nothing appends with the version check and the client-key
//! claim guard), the client keys' claims, the one lease per transfer and the daily counters. All
//! of them keep their rows in one `Durable`, the tables a crash does not lose. Each call meets
//! what its `StoreHook` decides (by default the faults a test armed at a `StoreCall`: fail or
//! crash before or after the effect) and shows the hook its effects.

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::NaiveDate;
use domain::{ErrorCode, ReqId, TransferEvent, TransferState, UserId};

use crate::daily::{Charge, DailyLimits};
use crate::error::CoordinatorError;
use crate::ports::{
    ClientKey, ClientKeys, Clock, Commit, Context, Creation, CreationOutcome, DailyReservations,
    LeaseRequest, Leases, Rekeyed, TransferLog,
};
use crate::testkit::exec::YieldOnce;
use crate::testkit::faults::{crash, StoreCall, StoreFault};
use crate::testkit::hook::{Seen, StoreHook};
use crate::testkit::rows::{Durable, RetryRow, Rows, Stream};

/// The handle every in-memory store holds: the durable rows, the hook that decides each call's
/// fault and sees its effects, and the clock. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    durable: Rows,
    hook: Arc<dyn StoreHook>,
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rows", &self.durable)
            .field("hook", &self.hook)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store over `rows`, its calls decided by `hook`, its time read from `clock`.
    pub fn new(rows: Rows, hook: Arc<dyn StoreHook>, clock: Arc<dyn Clock>) -> Self {
        Self {
            durable: rows,
            hook,
            clock,
        }
    }

    /// The durable rows, locked.
    pub fn rows(&self) -> MutexGuard<'_, Durable> {
        self.durable.lock()
    }

    /// The durable rows' shared handle.
    pub fn shared_rows(&self) -> Rows {
        self.durable.clone()
    }

    /// Shows the hook an effect on `rows` (from inside a call's effect).
    pub fn seen(&self, rows: &Durable, seen: Seen<'_>) {
        self.hook.seen(rows, seen);
    }

    /// One store call at `site`: `effect` on the rows at the clock's time, with the fault the
    /// hook decides (if any) before or after it.
    pub async fn call<T>(
        &self,
        site: StoreCall,
        effect: impl FnOnce(&mut Durable, u64) -> Result<T, CoordinatorError>,
    ) -> Result<T, CoordinatorError> {
        let fault = self.hook.before(site).await;
        match fault {
            Some(StoreFault::FailBefore) => return Err(unreachable_store(site)),
            Some(StoreFault::CrashBefore) => return crash().await,
            Some(StoreFault::Pause) => YieldOnce::new().await,
            _ => {}
        }
        let result = effect(&mut self.rows(), self.clock.now_ms());
        match self.hook.after(site, fault) {
            Some(StoreFault::FailAfter) => Err(CoordinatorError::outcome_unknown(format!(
                "testkit: {site:?}'s answer was lost after its effect"
            ))),
            Some(StoreFault::CrashAfter) => crash().await,
            _ => result,
        }
    }
}

fn unreachable_store(site: StoreCall) -> CoordinatorError {
    CoordinatorError::outcome_unknown(format!("testkit: the store is unreachable at {site:?}"))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The event log in memory.
#[derive(Debug, Clone)]
pub struct MemLog(pub Store);

#[async_trait]
impl TransferLog for MemLog {
    async fn load(&self, req_id: &ReqId) -> Result<Context, CoordinatorError> {
        self.0
            .call(StoreCall::Load, |rows, _| {
                let stream = rows.streams.get(req_id);
                Ok(Context {
                    aggregate_id: req_id.to_string(),
                    aggregate: stream.map(Stream::fold).unwrap_or_default(),
                    current_sequence: stream.map_or(0, |s| s.events.len()),
                    current_snapshot: None,
                })
            })
            .await
    }

    async fn append(&self, commit: Commit) -> Result<usize, CoordinatorError> {
        let leads_to = commit
            .events
            .last()
            .map_or(TransferState::Init, TransferEvent::resulting_state);
        let store = &self.0;
        store
            .call(StoreCall::Append(leads_to), |rows, now| {
                append(store, rows, now, commit)
            })
            .await
    }

    async fn create_many(
        &self,
        creations: Vec<Creation>,
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Option<Vec<Result<CreationOutcome, CoordinatorError>>> {
        let store = &self.0;
        let count = creations.len();
        let created = store
            .call(
                StoreCall::Append(TransferState::SourcePending),
                |rows, now| {
                    Ok(Self::create_together(
                        store, rows, now, creations, limits, day,
                    ))
                },
            )
            .await;
        // A failed call (before or after its effect) answers every creation with its error.
        Some(created.unwrap_or_else(|e| (0..count).map(|_| Err(e.clone())).collect()))
    }
}

impl MemLog {
    /// `TransferLog::append`'s contract on rows the caller holds (the simulation's log that
    /// writes a FUNDING movement with its events, ADR 0024).
    pub fn append_in(
        store: &Store,
        rows: &mut Durable,
        now_ms: u64,
        commit: Commit,
    ) -> Result<usize, CoordinatorError> {
        append(store, rows, now_ms, commit)
    }

    /// `TransferLog::create_many`'s contract on the rows (ADR 0022): per creation, all or
    /// nothing, its key's claim, its charge (decided by the product's one rule, in order) and
    /// its events; a claimed key or a refused charge leaves nothing behind.
    pub fn create_together(
        store: &Store,
        rows: &mut Durable,
        now_ms: u64,
        creations: Vec<Creation>,
        limits: &DailyLimits,
        day: NaiveDate,
    ) -> Vec<Result<CreationOutcome, CoordinatorError>> {
        let mut answers = Vec::with_capacity(creations.len());
        for Creation {
            commit,
            claim,
            charge,
        } in creations
        {
            if let Some(c) = &claim {
                if rows.claims.contains_key(&(c.user, c.cid.clone())) {
                    answers.push(Ok(CreationOutcome::KeyTaken));
                    continue;
                }
            }
            if let Some(charge) = &charge {
                if planted!(ChargeApart) {
                    // Planted: the creation is written without its charge.
                } else if let Err(code) = rows.daily.entry(day).or_default().charge(limits, charge)
                {
                    answers.push(Ok(CreationOutcome::Refused(code)));
                    continue;
                }
            }
            if let Some(c) = &claim {
                let key = ClientKey {
                    req_id: c.req_id,
                    fingerprint: c.fingerprint.clone(),
                };
                rows.claims.insert((c.user, c.cid.clone()), key);
                let (cid, req_id) = (c.cid.as_str(), c.req_id);
                store.seen(rows, Seen::Claimed { cid, req_id });
            }
            if planted!(EventsApart) {
                // Planted: answered as created, its events never written.
                let created = commit.expected_sequence + commit.events.len();
                answers.push(Ok(CreationOutcome::Appended(created)));
                continue;
            }
            let appended = append(store, rows, now_ms, commit);
            if appended.is_err() {
                // All or nothing: the claim and the charge go with the refused creation.
                if let Some(c) = &claim {
                    rows.claims.remove(&(c.user, c.cid.clone()));
                }
                if let Some(charge) = &charge {
                    rows.daily.entry(day).or_default().release(limits, charge);
                }
            }
            answers.push(appended.map(CreationOutcome::Appended));
        }
        answers
    }
}

/// The event log in memory without claims and counters of its own (`create_many` is `None`):
/// the coordinator claims, charges and creates in separate steps, as with a log that cannot
/// write them together.
#[derive(Debug, Clone)]
pub struct MemLogApart(pub Store);

#[async_trait]
impl TransferLog for MemLogApart {
    async fn load(&self, req_id: &ReqId) -> Result<Context, CoordinatorError> {
        MemLog(self.0.clone()).load(req_id).await
    }

    async fn append(&self, commit: Commit) -> Result<usize, CoordinatorError> {
        MemLog(self.0.clone()).append(commit).await
    }
}

/// `TransferLog::append`'s contract on the rows: the version check, the claim guard, all or
/// nothing.
fn append(
    store: &Store,
    rows: &mut Durable,
    now_ms: u64,
    commit: Commit,
) -> Result<usize, CoordinatorError> {
    let req_id = ReqId::parse(&commit.aggregate_id)
        .map_err(|_| CoordinatorError::invariant("testkit: the aggregate id is not a req_id"))?;
    let len = rows.streams.get(&req_id).map_or(0, |s| s.events.len());
    if len != commit.expected_sequence && !planted!(NoCas) {
        let seen = Seen::SequenceTaken {
            req_id,
            expected: commit.expected_sequence,
            at: len,
        };
        store.seen(rows, seen);
        return Err(CoordinatorError::Conflict);
    }
    if len == 0 {
        let Some(TransferEvent::TransferCreated { user_id, cid, .. }) = commit.events.first()
        else {
            return Err(CoordinatorError::invariant(
                "testkit: a stream must start with TransferCreated",
            ));
        };
        // The claim guard (migration 0020): a creation under a client key commits only while
        // the key's claim names its req_id.
        if let Some(cid) = cid {
            let holds = rows
                .claims
                .get(&(*user_id, cid.clone()))
                .is_some_and(|claim| claim.req_id == req_id);
            if !holds {
                store.seen(rows, Seen::ClaimMoved { req_id, cid });
                return Err(CoordinatorError::Conflict);
            }
        }
    }
    let events = &commit.events;
    store.seen(rows, Seen::Appending { req_id, events });
    let tx = rows.take_tx();
    let stream = rows.streams.entry(req_id).or_insert_with(|| Stream {
        events: Vec::new(),
        txs: Vec::new(),
        owner: commit.owner,
        recorded_at_ms: now_ms,
    });
    stream.events.extend(commit.events.iter().cloned());
    stream.txs.resize(stream.events.len(), tx);
    stream.recorded_at_ms = now_ms;
    let len = stream.events.len();
    store.seen(rows, Seen::Appended { req_id, events });
    Ok(len)
}

/// The client keys' claims in memory.
#[derive(Debug, Clone)]
pub struct MemClientKeys(pub Store);

#[async_trait]
impl ClientKeys for MemClientKeys {
    async fn find(&self, user: UserId, cid: &str) -> Result<Option<ClientKey>, CoordinatorError> {
        self.0
            .call(StoreCall::FindClaim, |rows, _| {
                Ok(rows.claims.get(&(user, cid.to_owned())).cloned())
            })
            .await
    }

    async fn claim(
        &self,
        user: UserId,
        cid: &str,
        req_id: &ReqId,
        fingerprint: &str,
    ) -> Result<bool, CoordinatorError> {
        let store = &self.0;
        store
            .call(StoreCall::Claim, |rows, _| {
                let key = (user, cid.to_owned());
                if rows.claims.contains_key(&key) {
                    return Ok(false);
                }
                let claim = ClientKey {
                    req_id: *req_id,
                    fingerprint: fingerprint.to_owned(),
                };
                rows.claims.insert(key, claim);
                let req_id = *req_id;
                store.seen(rows, Seen::Claimed { cid, req_id });
                Ok(true)
            })
            .await
    }

    async fn rekey(
        &self,
        user: UserId,
        cid: &str,
        old: &ReqId,
        new: &ReqId,
    ) -> Result<Rekeyed, CoordinatorError> {
        let store = &self.0;
        store
            .call(StoreCall::Rekey, |rows, _| {
                if rows.streams.contains_key(old) {
                    return Ok(Rekeyed::Created);
                }
                match rows.claims.get_mut(&(user, cid.to_owned())) {
                    Some(claim) if claim.req_id == *old => {
                        claim.req_id = *new;
                        let (old, new) = (*old, *new);
                        store.seen(rows, Seen::Rekeyed { cid, old, new });
                        Ok(Rekeyed::Swapped)
                    }
                    _ => Ok(Rekeyed::Moved),
                }
            })
            .await
    }
}

/// The transfers' leases in memory (the lease columns of `RetryRow`).
#[derive(Debug, Clone)]
pub struct MemLeases(pub Store);

#[async_trait]
impl Leases for MemLeases {
    async fn take(&self, request: &LeaseRequest<'_>) -> Result<Option<i32>, CoordinatorError> {
        let store = &self.0;
        store
            .call(StoreCall::TakeLease, |rows, now| {
                let until = now.saturating_add(ms(request.lease));
                let row = rows
                    .retries
                    .entry(request.req_id)
                    .or_insert_with(|| RetryRow {
                        state: Some(request.state),
                        next_retry_at_ms: now,
                        ..RetryRow::default()
                    });
                let due = !request.wait_for_retry_time || row.next_retry_at_ms <= now;
                if !row.lease_free(now) || !due {
                    return Ok(None);
                }
                row.lease_owner = Some(request.owner.to_owned());
                row.lease_until_ms = Some(until);
                let attempts = row.attempts;
                let (req_id, owner) = (request.req_id, request.owner);
                store.seen(rows, Seen::LeaseTaken { req_id, owner });
                Ok(Some(attempts))
            })
            .await
    }

    async fn renew(
        &self,
        req_id: &ReqId,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, CoordinatorError> {
        self.0
            .call(StoreCall::RenewLease, |rows, now| {
                Ok(match rows.retries.get_mut(req_id) {
                    Some(row) if row.lease_owner.as_deref() == Some(owner) => {
                        row.lease_until_ms = Some(now.saturating_add(ms(lease)));
                        true
                    }
                    _ => false,
                })
            })
            .await
    }

    async fn release(&self, req_id: &ReqId, owner: &str) -> Result<(), CoordinatorError> {
        self.0
            .call(StoreCall::ReleaseLease, |rows, _| {
                if let Some(row) = rows.retries.get_mut(req_id) {
                    if row.lease_owner.as_deref() == Some(owner) {
                        row.lease_owner = None;
                        row.lease_until_ms = None;
                    }
                }
                Ok(())
            })
            .await
    }
}

/// The daily limits' counters in memory.
#[derive(Debug, Clone)]
pub struct MemDailyReservations(pub Store);

#[async_trait]
impl DailyReservations for MemDailyReservations {
    async fn reserve(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<Result<(), ErrorCode>, CoordinatorError> {
        self.0
            .call(StoreCall::Reserve, |rows, _| {
                Ok(reserve(rows, limits, charge, day))
            })
            .await
    }

    async fn release(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<(), CoordinatorError> {
        self.0
            .call(StoreCall::ReleaseReservation, |rows, _| {
                rows.daily.entry(day).or_default().release(limits, charge);
                Ok(())
            })
            .await
    }
}

/// The daily limits on the in-memory counters, through the product's one rule (`daily::decide`
/// behind `DailyUsage::charge`): refused with nothing counted, otherwise counted.
fn reserve(
    rows: &mut Durable,
    limits: &DailyLimits,
    charge: &Charge,
    day: NaiveDate,
) -> Result<(), ErrorCode> {
    rows.daily.entry(day).or_default().charge(limits, charge)
}
