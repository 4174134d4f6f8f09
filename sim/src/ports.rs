//! The in-memory implementations of every port the coordinator and the recovery worker run on,
//! with the contracts of the PostgreSQL ones (`application::pg`, `recovery::book`), the funding
//! ledger's (`adapters::funding`, migration 0014) and spot-core's transport, and the faults of
//! the run injected at each call: every call first yields to the scheduler; a store call may fail
//! before or after it took effect, or be slow; a message may never be sent, be delayed, arrive
//! after its caller gave up, arrive twice, or lose its answer after it was applied.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use adapters::spot::operation_of;
use application::{
    Charge, ClientKey, ClientKeys, Clock, Commit, CoordinatorError, DailyLimits, DailyReservations,
    LeaseRequest, Leases, Rekeyed, TransferLog,
};
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use cqrs_es::persist::EventStoreAggregateContext;
use cqrs_es::Aggregate;
use domain::{
    AccountPort, AccountType, AdapterOutcome, ErrorCode, Movement, Operation, Recorded, ReqId,
    Transfer, TransferEvent, TransferState, UserId,
};
use recovery::{AttemptPolicy, AttemptRecord, RetryBook, Tally};
use spot_core::client::{ClientError, SpotTransport};
use spot_core::protocol::{JournalRecord, Outcome, Request, Response};

use crate::exec::{Role, Rt};
use crate::world::{short, JournalRow, RetryRow, Stream, System, World};

/// The process delayed and duplicated messages belong to: the network, which no crash kills.
pub const NETWORK: u32 = 0;

/// The handle every port holds: the runtime and the world.
#[derive(Clone)]
pub struct Sim {
    pub rt: Arc<Rt>,
    pub world: Arc<Mutex<World>>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim").finish_non_exhaustive()
    }
}

fn store_error(what: &str) -> CoordinatorError {
    CoordinatorError::outcome_unknown(format!("sim: {what}"))
}

/// What the network does to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Never sent: the caller knows nothing happened.
    Unsent,
    /// Arrives after the caller gave up (a timeout), or never.
    Late,
    /// Applied, and its answer lost.
    AnswerLost,
    /// Delivered and answered.
    Delivered,
}

impl Sim {
    /// The world, locked, with the current time and task.
    pub fn world(&self) -> MutexGuard<'_, World> {
        let now = self.rt.now_ms();
        let current = self.rt.current().map(|(t, _, r)| (t, r));
        let mut w = self.world.lock().unwrap_or_else(|e| e.into_inner());
        w.now_ms = now;
        w.current = current;
        w
    }

    fn roll(&self, per_mille: u32) -> bool {
        per_mille > 0 && self.rt.with_rng(|r| r.chance(per_mille))
    }

    /// One store call: a scheduling point, maybe slow, maybe failing before or after `effect`.
    async fn store<T>(
        &self,
        name: &'static str,
        effect: impl FnOnce(&mut World) -> Result<T, CoordinatorError>,
    ) -> Result<T, CoordinatorError> {
        self.rt.yield_now().await;
        let f = {
            let w = self.world();
            w.faults_on.then(|| w.faults.clone())
        };
        // Every call takes a little time, so concurrent drives overlap.
        let latency = self.rt.with_rng(|r| r.below(4));
        if latency > 0 {
            self.rt.sleep(Duration::from_millis(latency)).await;
        }
        if let Some(f) = &f {
            if self.roll(f.store_delay) {
                // Mostly short; one in ten a stall of many seconds (a partition, a lock wait),
                // longer than half the claims' retention.
                let ms = self.rt.with_rng(|r| {
                    if r.chance(100) {
                        r.between(10_000, 45_000)
                    } else {
                        r.between(1, 3_000)
                    }
                });
                self.world().fault("store-slow", name);
                self.rt.sleep(Duration::from_millis(ms)).await;
            }
            if self.roll(f.store_fail_before) {
                self.world().fault("store-fail", name);
                return Err(store_error("store unreachable"));
            }
        }
        let result = effect(&mut self.world());
        if let Some(f) = &f {
            if self.roll(f.store_fail_after) {
                self.world().fault("store-answer-lost", name);
                return Err(store_error("the store's answer was lost after the effect"));
            }
        }
        result
    }

    /// What the network does to one message (none of it with faults off).
    async fn fate(&self, name: &str) -> Fate {
        self.rt.yield_now().await;
        let latency = self.rt.with_rng(|r| r.below(15));
        if latency > 0 {
            self.rt.sleep(Duration::from_millis(latency)).await;
        }
        let f = {
            let w = self.world();
            if !w.faults_on {
                return Fate::Delivered;
            }
            w.faults.clone()
        };
        if self.roll(f.net_delay) {
            let ms = self.rt.with_rng(|r| r.between(1, 2_000));
            self.world().fault("net-delay", name);
            self.rt.sleep(Duration::from_millis(ms)).await;
        }
        if self.roll(f.net_unsent) {
            self.world().fault("net-unsent", name);
            return Fate::Unsent;
        }
        if self.roll(f.net_late) {
            self.world().fault("net-late", name);
            return Fate::Late;
        }
        if self.roll(f.net_answer_lost) {
            self.world().fault("net-answer-lost", name);
            return Fate::AnswerLost;
        }
        Fate::Delivered
    }

    /// Maybe a second copy of a delivered message, arriving later.
    fn maybe_duplicate(&self, name: &str) -> Option<u64> {
        let rate = {
            let w = self.world();
            if !w.faults_on {
                return None;
            }
            w.faults.net_duplicate
        };
        if !self.roll(rate) {
            return None;
        }
        self.world().fault("net-duplicate", name);
        Some(self.rt.with_rng(|r| r.between(0, 5_000)))
    }

    /// A late copy: maybe lost for good, else arriving within a few seconds.
    fn late_delivery(&self) -> Option<u64> {
        let lost = self.rt.with_rng(|r| r.chance(300));
        (!lost).then(|| self.rt.with_rng(|r| r.between(1, 8_000)))
    }
}

// ---------------------------------------------------------------------------------------------
// The event log.

/// The event log in memory.
#[derive(Debug, Clone)]
pub struct SimLog {
    pub sim: Sim,
}

fn fold(events: &[TransferEvent]) -> Transfer {
    let mut t = Transfer::default();
    for e in events {
        t.apply(e.clone());
    }
    t
}

#[async_trait]
impl TransferLog for SimLog {
    async fn load(
        &self,
        req_id: &ReqId,
    ) -> Result<EventStoreAggregateContext<Transfer>, CoordinatorError> {
        let aggregate_id = req_id.to_string();
        let aggregate_id = aggregate_id.as_str();
        self.sim
            .store("log.load", |w| {
                let events = w
                    .log
                    .get(aggregate_id)
                    .map(|s| s.events.clone())
                    .unwrap_or_default();
                Ok(EventStoreAggregateContext {
                    aggregate_id: aggregate_id.to_owned(),
                    aggregate: fold(&events),
                    current_sequence: events.len(),
                    current_snapshot: None,
                })
            })
            .await
    }

    // long: the in-memory log's append with its fault points in the order PostgreSQL meets them.
    async fn append(&self, commit: Commit) -> Result<usize, CoordinatorError> {
        self.sim
            .store("log.append", |w| {
                let id = commit.aggregate_id.as_str();
                let len = w.log.get(id).map_or(0, |s| s.events.len());
                let no_cas = application::plant::active(application::plant::Bug::NoCas);
                if len != commit.expected_sequence && !no_cas {
                    w.note(|| {
                        format!(
                            "log {} refused: sequence {} taken (at {len})",
                            short(id),
                            commit.expected_sequence + 1
                        )
                    });
                    return Err(CoordinatorError::Conflict);
                }
                // The claim guard (migration 0020): a creation under a client key commits only
                // while the key's claim names its req_id.
                if commit.expected_sequence == 0 {
                    if let Some(TransferEvent::TransferCreated {
                        user_id,
                        cid: Some(cid),
                        ..
                    }) = commit.events.first()
                    {
                        let holds = w
                            .claims
                            .get(&(user_id.get(), cid.clone()))
                            .is_some_and(|(req_id, _)| req_id == id);
                        if !holds {
                            w.note(|| format!("log {} refused: claim of {cid} moved", short(id)));
                            return Err(CoordinatorError::Conflict);
                        }
                    }
                }
                w.check_append(id, &commit.events);
                let now = w.now_ms;
                if !w.log.contains_key(id) {
                    let Some(TransferEvent::TransferCreated {
                        user_id,
                        from,
                        to,
                        asset,
                        amount,
                        cid,
                        ..
                    }) = commit.events.first()
                    else {
                        return Err(store_error("a stream must start with TransferCreated"));
                    };
                    let stream = Stream {
                        events: Vec::new(),
                        state: None,
                        reached: BTreeSet::new(),
                        recorded_at_ms: now,
                        user: user_id.get(),
                        asset: asset.to_string(),
                        amount: amount.value(),
                        from: *from,
                        to: *to,
                        cid: cid.clone(),
                    };
                    w.log.insert(id.to_owned(), stream);
                }
                let names: Vec<String> = commit.events.iter().map(event_name).collect();
                let stream = w
                    .log
                    .get_mut(id)
                    .ok_or_else(|| store_error("stream vanished"))?;
                for e in &commit.events {
                    let next = e.resulting_state();
                    stream.state = Some(next);
                    stream.reached.insert(next.id());
                }
                stream.events.extend(commit.events.iter().cloned());
                stream.recorded_at_ms = now;
                let last = stream.events.len();
                let state = stream.state;
                w.note(|| {
                    format!(
                        "log {} +{} -> {}",
                        short(id),
                        names.join("+"),
                        state.map_or("?", TransferState::as_str)
                    )
                });
                Ok(last)
            })
            .await
    }
}

fn event_name(e: &TransferEvent) -> String {
    use cqrs_es::DomainEvent;
    e.event_type()
}

// ---------------------------------------------------------------------------------------------
// The bookkeeping: client keys, leases, daily limits.

/// The client keys' claims in memory.
#[derive(Debug, Clone)]
pub struct SimClientKeys {
    pub sim: Sim,
}

/// The transfers' leases in memory (rows of the retry book).
#[derive(Debug, Clone)]
pub struct SimLeases {
    pub sim: Sim,
}

/// The daily limits' counters in memory.
#[derive(Debug, Clone)]
pub struct SimDailyReservations {
    pub sim: Sim,
}

fn lease_free(row: &RetryRow, now: u64) -> bool {
    row.lease_until_ms.is_none_or(|until| until < now)
}

fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl ClientKeys for SimClientKeys {
    async fn find(&self, user: UserId, cid: &str) -> Result<Option<ClientKey>, CoordinatorError> {
        self.sim
            .store("cid.find", |w| {
                w.claims
                    .get(&(user.get(), cid.to_owned()))
                    .map(|(req_id, fingerprint)| {
                        Ok(ClientKey {
                            req_id: ReqId::parse(req_id).map_err(|_| {
                                CoordinatorError::invariant("stored req_id is malformed")
                            })?,
                            fingerprint: fingerprint.clone(),
                        })
                    })
                    .transpose()
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
        self.sim
            .store("cid.claim", |w| {
                let key = (user.get(), cid.to_owned());
                if w.claims.contains_key(&key) {
                    return Ok(false);
                }
                w.claims
                    .insert(key, (req_id.to_string(), fingerprint.to_owned()));
                w.note(|| format!("cid {cid} claimed for {}", short(&req_id.to_string())));
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
        self.sim
            .store("cid.rekey", |w| {
                let old = old.to_string();
                if w.log.contains_key(&old) {
                    return Ok(Rekeyed::Created);
                }
                let key = (user.get(), cid.to_owned());
                match w.claims.get_mut(&key) {
                    Some((req_id, _)) if *req_id == old => {
                        *req_id = new.to_string();
                        w.note(|| {
                            format!(
                                "cid {cid} re-keyed {} -> {}",
                                short(&old),
                                short(&new.to_string())
                            )
                        });
                        Ok(Rekeyed::Swapped)
                    }
                    _ => Ok(Rekeyed::Moved),
                }
            })
            .await
    }
}

#[async_trait]
impl Leases for SimLeases {
    async fn take(&self, request: &LeaseRequest<'_>) -> Result<Option<i32>, CoordinatorError> {
        let LeaseRequest {
            req_id,
            state,
            owner,
            lease,
            wait_for_retry_time,
        } = *request;
        let req_id = req_id.to_string();
        let req_id = req_id.as_str();
        self.sim
            .store("lease.take", |w| {
                let now = w.now_ms;
                let until = now.saturating_add(lease_ms(lease));
                let taken = match w.retries.get_mut(req_id) {
                    None => {
                        w.retries.insert(
                            req_id.to_owned(),
                            RetryRow {
                                state: state.as_str().to_owned(),
                                next_retry_at_ms: now,
                                lease_owner: Some(owner.to_owned()),
                                lease_until_ms: Some(until),
                                ..RetryRow::default()
                            },
                        );
                        Some(0)
                    }
                    Some(row)
                        if lease_free(row, now)
                            && (!wait_for_retry_time || row.next_retry_at_ms <= now) =>
                    {
                        row.lease_owner = Some(owner.to_owned());
                        row.lease_until_ms = Some(until);
                        Some(row.attempts)
                    }
                    Some(_) => None,
                };
                if taken.is_some() {
                    w.note(|| format!("lease {} taken by {owner}", short(req_id)));
                }
                Ok(taken)
            })
            .await
    }

    async fn renew(
        &self,
        req_id: &ReqId,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, CoordinatorError> {
        let req_id = req_id.to_string();
        self.sim
            .store("lease.renew", |w| {
                let now = w.now_ms;
                Ok(match w.retries.get_mut(&req_id) {
                    Some(row) if row.lease_owner.as_deref() == Some(owner) => {
                        row.lease_until_ms = Some(now.saturating_add(lease_ms(lease)));
                        true
                    }
                    _ => false,
                })
            })
            .await
    }

    async fn release(&self, req_id: &ReqId, owner: &str) -> Result<(), CoordinatorError> {
        let req_id = req_id.to_string();
        self.sim
            .store("lease.release", |w| {
                if let Some(row) = w.retries.get_mut(&req_id) {
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

#[async_trait]
impl DailyReservations for SimDailyReservations {
    async fn reserve(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<Result<(), ErrorCode>, CoordinatorError> {
        self.sim
            .store("limits.reserve", |w| {
                Ok(w.daily.entry(day).or_default().charge(limits, charge))
            })
            .await
    }

    async fn release(
        &self,
        limits: &DailyLimits,
        charge: &Charge,
        day: NaiveDate,
    ) -> Result<(), CoordinatorError> {
        self.sim
            .store("limits.release", |w| {
                w.daily.entry(day).or_default().release(limits, charge);
                Ok(())
            })
            .await
    }
}

// ---------------------------------------------------------------------------------------------
// The recovery worker's retry book.

/// The retry book in memory.
#[derive(Debug, Clone)]
pub struct SimRetryBook {
    pub sim: Sim,
}

#[async_trait]
impl RetryBook for SimRetryBook {
    async fn due(
        &self,
        stale_ms: i64,
        limit: i64,
    ) -> Result<Vec<(ReqId, TransferState)>, CoordinatorError> {
        self.sim
            .store("retry.due", |w| {
                let now = w.now_ms;
                let stale = u64::try_from(stale_ms).unwrap_or(0);
                let mut due: Vec<(u64, String, TransferState)> = w
                    .log
                    .iter()
                    .filter(|(_, s)| s.recorded_at_ms.saturating_add(stale) <= now)
                    .filter_map(|(id, s)| {
                        let state = s.state.filter(|st| !st.is_terminal())?;
                        match w.retries.get(id) {
                            None => Some((s.recorded_at_ms, id.clone(), state)),
                            Some(r) if r.next_retry_at_ms <= now && lease_free(r, now) => {
                                Some((r.next_retry_at_ms, id.clone(), state))
                            }
                            Some(_) => None,
                        }
                    })
                    .collect();
                due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
                due.truncate(usize::try_from(limit).unwrap_or(0));
                due.into_iter()
                    .map(|(_, id, st)| {
                        let id = ReqId::parse(&id).map_err(|_| {
                            CoordinatorError::invariant("stored req_id is malformed")
                        })?;
                        Ok((id, st))
                    })
                    .collect()
            })
            .await
    }

    async fn begin_attempt(
        &self,
        req_id: &ReqId,
        worker: &str,
        state_before: TransferState,
    ) -> Result<i64, CoordinatorError> {
        let req_id = req_id.to_string();
        self.sim
            .store("retry.begin", |w| {
                w.attempts += 1;
                let n = w.attempts;
                w.note(|| {
                    format!(
                        "attempt {n} on {} by {worker} from {state_before}",
                        short(&req_id)
                    )
                });
                Ok(n)
            })
            .await
    }

    async fn record_attempt(
        &self,
        a: &AttemptRecord<'_>,
        policy: &dyn AttemptPolicy,
    ) -> Result<Tally, CoordinatorError> {
        self.sim
            .store("retry.record", |w| {
                let now = w.now_ms;
                let key = a.req_id.to_string();
                let row = w
                    .retries
                    .get_mut(&key)
                    .ok_or_else(|| store_error("no retry row"))?;
                if let Some(s) = a.state_after {
                    row.state = s.as_str().to_owned();
                }
                row.attempts += i32::from(a.counts);
                row.refund_failures += i32::from(a.refund_failed);
                if a.category.is_some() {
                    row.last_error_category = a.category;
                }
                row.lease_owner = None;
                row.lease_until_ms = None;
                let tally = Tally {
                    attempts: row.attempts,
                    refund_failures: row.refund_failures,
                    refund_not_alerted: !row.refund_alerted,
                };
                if let Some(delay) = policy.retry_delay_ms(&tally) {
                    row.next_retry_at_ms = now.saturating_add(delay);
                }
                if policy.alert_refund(&tally) {
                    row.refund_alerted = true;
                }
                let outcome = a.outcome;
                w.note(|| format!("attempt on {} ended {outcome}", short(&key)));
                Ok(tally)
            })
            .await
    }

    async fn mark_stuck_target_pending(
        &self,
        older_than_ms: i64,
    ) -> Result<Vec<(String, i64)>, CoordinatorError> {
        self.sim
            .store("retry.stuck", |w| {
                let now = w.now_ms;
                let older = u64::try_from(older_than_ms).unwrap_or(0);
                let stuck: Vec<(String, u64)> = w
                    .log
                    .iter()
                    .filter(|(_, s)| s.state == Some(TransferState::TargetPending))
                    .filter(|(_, s)| s.recorded_at_ms.saturating_add(older) <= now)
                    .map(|(id, s)| (id.clone(), s.recorded_at_ms))
                    .collect();
                let mut raised = Vec::new();
                for (id, at) in stuck {
                    let row = w.retries.entry(id.clone()).or_insert_with(|| RetryRow {
                        state: "TARGET_PENDING".to_owned(),
                        next_retry_at_ms: now,
                        ..RetryRow::default()
                    });
                    if !row.stuck_alerted {
                        row.stuck_alerted = true;
                        raised.push((id, i64::try_from(now - at).unwrap_or(i64::MAX)));
                    }
                }
                Ok(raised)
            })
            .await
    }

    async fn heartbeat(&self, _worker: &str) -> Result<(), CoordinatorError> {
        self.sim.store("retry.heartbeat", |_| Ok(())).await
    }
}

// ---------------------------------------------------------------------------------------------
// The clock.

/// Simulated time; req_ids from its time and the run's random source.
#[derive(Debug, Clone)]
pub struct SimClock {
    pub rt: Arc<Rt>,
}

#[async_trait]
impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        let ms = i64::try_from(self.rt.now_ms()).unwrap_or(i64::MAX);
        DateTime::from_timestamp_millis(ms).unwrap_or_default()
    }

    fn now_ms(&self) -> u64 {
        self.rt.now_ms()
    }

    async fn sleep(&self, duration: Duration) {
        self.rt.sleep(duration).await;
    }

    fn req_id(&self) -> ReqId {
        let random = self.rt.with_rng(|r| r.ulid_random());
        ReqId::from_parts(self.rt.now_ms(), random)
    }
}

// ---------------------------------------------------------------------------------------------
// The funding ledger.

/// The funding ledger in memory, with the decisions of `funding_fresh_movements` (migration
/// 0014) and the journal answers of `adapters::funding`: idempotent by (req_id, operation), a
/// refusal recorded for good, `cancel` claiming an undecided key with `CANCELLED`.
#[derive(Debug, Clone)]
pub struct SimFunding {
    pub sim: Sim,
}

/// Decides and applies one movement arriving at the funding ledger.
// long: the funding ledger's decision table (migration 0014's rules), whole to read against the SQL.
pub fn funding_apply(w: &mut World, op: Operation, m: &Movement) -> AdapterOutcome {
    let id = m.req_id.to_string();
    let asset = m.asset.to_string();
    let user = m.user_id.get();
    let amount = m.amount.value();
    w.check_arrival(System::Funding, &id, op);
    if let Some(row) = w.journal.get(&(id.clone(), op)).cloned() {
        if row.user != user || row.asset != asset || row.amount != amount {
            return AdapterOutcome::Mismatch(format!("req_id {id} recorded for another movement"));
        }
        if row.applied {
            if op == Operation::Refund
                && application::plant::active(application::plant::Bug::RefundNotIdempotent)
            {
                // Planted: a repeated refund is applied again.
                if let Some(a) = w.funding.get_mut(&(user, asset.clone())) {
                    a.balance += amount;
                }
                w.count_applied(System::Funding, &id, op);
            }
            return AdapterOutcome::Success;
        }
        let code = row.code.unwrap_or_else(|| "REFUSED".to_owned());
        return AdapterOutcome::ExplicitFail {
            message: format!("refused: {code}"),
            code,
        };
    }
    let account = w.funding.get(&(user, asset.clone())).cloned();
    let decided: Option<&str> = match op {
        Operation::Withdraw => match &account {
            None => Some("SOURCE_ACCOUNT_NOT_FOUND"),
            Some(a) if a.status == "FROZEN" => Some("ACCOUNT_FROZEN"),
            Some(a) if a.status == "DISABLED" => Some("ACCOUNT_DISABLED"),
            Some(a) if a.balance < amount => Some("INSUFFICIENT_BALANCE"),
            Some(_) => None,
        },
        Operation::Deposit => match &account {
            None => Some("TARGET_ACCOUNT_NOT_FOUND"),
            Some(a) if a.status == "DISABLED" => Some("ACCOUNT_DISABLED"),
            Some(_) => None,
        },
        Operation::Refund => {
            let matching = w
                .journal
                .get(&(id.clone(), Operation::Withdraw))
                .is_some_and(|r| {
                    r.applied && r.user == user && r.asset == asset && r.amount == amount
                });
            (account.is_none() || !matching).then_some("NO_MATCHING_WITHDRAW")
        }
    };
    w.journal.insert(
        (id.clone(), op),
        JournalRow {
            user,
            asset: asset.clone(),
            amount,
            applied: decided.is_none(),
            code: decided.map(str::to_owned),
        },
    );
    match decided {
        None => {
            if let Some(a) = w.funding.get_mut(&(user, asset)) {
                if op == Operation::Withdraw {
                    a.balance -= amount;
                } else {
                    a.balance += amount;
                }
            }
            w.count_applied(System::Funding, &id, op);
            w.note(|| format!("funding applied {} of {}", op.as_str(), short(&id)));
            AdapterOutcome::Success
        }
        Some(code) => {
            if op == Operation::Refund {
                // Refused only without an applied withdraw of the same details: the protocol
                // asked for money back that it never took.
                w.violation(format!("funding refused the refund of {id}: {code}"));
            }
            w.note(|| format!("funding refused {} of {}: {code}", op.as_str(), short(&id)));
            AdapterOutcome::ExplicitFail {
                code: code.to_owned(),
                message: format!("refused: {code}"),
            }
        }
    }
}

/// What the funding journal holds for (req_id, op), read as `adapters::funding` reads it.
fn funding_record(w: &World, op: Operation, m: &Movement) -> Recorded {
    let Some(row) = w.journal.get(&(m.req_id.to_string(), op)) else {
        return Recorded::NotSeen;
    };
    if row.user != m.user_id.get()
        || row.asset != m.asset.as_str()
        || row.amount != m.amount.value()
    {
        return Recorded::Mismatch(format!("req_id {} recorded for another movement", m.req_id));
    }
    if row.applied {
        return Recorded::Applied;
    }
    let code = row.code.clone().unwrap_or_else(|| "REFUSED".to_owned());
    Recorded::Refused {
        message: format!("refused: {code}"),
        code,
    }
}

impl SimFunding {
    async fn movement(&self, op: Operation, m: &Movement) -> AdapterOutcome {
        let id = m.req_id.to_string();
        let name = format!("funding.{}", op.as_str());
        self.sim.world().track_call(System::Funding, &id, op);
        let fate = self.sim.fate(&name).await;
        match fate {
            Fate::Unsent => return AdapterOutcome::NetworkError("sim: connection refused".into()),
            Fate::Late => {
                if let Some(ms) = self.sim.late_delivery() {
                    self.deliver_later(op, m, ms);
                }
                return AdapterOutcome::Timeout;
            }
            Fate::AnswerLost | Fate::Delivered => {}
        }
        let outcome = funding_apply(&mut self.sim.world(), op, m);
        if let Some(ms) = self.sim.maybe_duplicate(&name) {
            self.deliver_later(op, m, ms);
        }
        if fate == Fate::AnswerLost {
            return AdapterOutcome::Unknown("sim: the answer was lost".into());
        }
        self.sim
            .world()
            .note(|| format!("funding {} {} -> {outcome:?}", op.as_str(), short(&id)));
        outcome
    }

    fn deliver_later(&self, op: Operation, m: &Movement, ms: u64) {
        let sim = self.sim.clone();
        let m = m.clone();
        self.sim.rt.spawn(NETWORK, Role::Network, async move {
            sim.rt.sleep(Duration::from_millis(ms)).await;
            let mut w = sim.world();
            w.note(|| {
                format!(
                    "late copy of funding {} {} arrives",
                    op.as_str(),
                    short(&m.req_id.to_string())
                )
            });
            funding_apply(&mut w, op, &m);
        });
    }

    async fn read(&self, op: Operation, m: &Movement, cancel: bool) -> Recorded {
        let id = m.req_id.to_string();
        self.sim.world().track_lookup(System::Funding, &id, op);
        let name = if cancel {
            "funding.cancel"
        } else {
            "funding.lookup"
        };
        match self.sim.fate(name).await {
            Fate::Unsent => return Recorded::Unavailable("sim: no answer".into()),
            Fate::Late => {
                // A cancel that timed out may still commit later.
                if let Some(ms) = self.sim.late_delivery().filter(|_| cancel) {
                    let (sim, m) = (self.sim.clone(), m.clone());
                    self.sim.rt.spawn(NETWORK, Role::Network, async move {
                        sim.rt.sleep(Duration::from_millis(ms)).await;
                        let mut w = sim.world();
                        w.note(|| {
                            format!(
                                "late copy of funding cancel {} arrives",
                                short(&m.req_id.to_string())
                            )
                        });
                        funding_cancel(&mut w, op, &m);
                    });
                }
                return Recorded::Unavailable("sim: no answer".into());
            }
            Fate::AnswerLost => {
                if cancel {
                    funding_cancel(&mut self.sim.world(), op, m);
                }
                return Recorded::Unavailable("sim: the answer was lost".into());
            }
            Fate::Delivered => {}
        }
        let mut w = self.sim.world();
        if cancel {
            funding_cancel(&mut w, op, m);
        }
        let recorded = funding_record(&w, op, m);
        w.note(|| format!("{name} {} {} -> {recorded:?}", op.as_str(), short(&id)));
        recorded
    }
}

fn funding_cancel(w: &mut World, op: Operation, m: &Movement) {
    w.journal
        .entry((m.req_id.to_string(), op))
        .or_insert_with(|| JournalRow {
            user: m.user_id.get(),
            asset: m.asset.to_string(),
            amount: m.amount.value(),
            applied: false,
            code: Some("CANCELLED".to_owned()),
        });
}

#[async_trait]
impl AccountPort for SimFunding {
    fn account_type(&self) -> AccountType {
        AccountType::Funding
    }

    async fn withdraw(&self, m: &Movement) -> AdapterOutcome {
        self.movement(Operation::Withdraw, m).await
    }

    async fn deposit(&self, m: &Movement) -> AdapterOutcome {
        self.movement(Operation::Deposit, m).await
    }

    async fn refund(&self, m: &Movement) -> AdapterOutcome {
        self.movement(Operation::Refund, m).await
    }

    async fn lookup(&self, m: &Movement, operation: Operation) -> Recorded {
        self.read(operation, m, false).await
    }

    async fn cancel(&self, m: &Movement, operation: Operation) -> Recorded {
        self.read(operation, m, true).await
    }
}

// ---------------------------------------------------------------------------------------------
// spot-core: the real engine behind a simulated transport.

/// spot-core's transport over the simulated network to the in-process engine (the real
/// `Engine::apply_at`); the real `SpotAdapter` maps its answers.
#[derive(Debug, Clone)]
pub struct SimSpot {
    pub sim: Sim,
}

/// Applies one request to the engine as it arrives, with the arrival checks for movements.
pub fn spot_apply(w: &mut World, req: &Request) -> Response {
    if let Some((op, m)) = req.as_movement() {
        w.check_arrival(System::Spot, &m.req_id, operation_of(op));
    }
    let now = w.now_ms;
    let effect = w.engine.apply_at(req, now);
    if let Some(
        JournalRecord::Withdraw(record)
        | JournalRecord::Deposit(record)
        | JournalRecord::Refund(record),
    ) = &effect.record
    {
        if record.outcome == Outcome::Applied {
            if let Some((op, _)) = req.as_movement() {
                w.count_applied(System::Spot, &record.req_id, operation_of(op));
            }
        }
        let (id, outcome) = (record.req_id.clone(), record.outcome);
        if matches!(req, Request::Refund(_)) && outcome == Outcome::Refused {
            w.violation(format!(
                "spot refused the refund of {id}: {:?}",
                record.code
            ));
        }
        w.note(|| {
            format!(
                "spot recorded {req_name} of {}: {outcome:?}",
                short(&id),
                req_name = request_name(req)
            )
        });
    }
    effect.response
}

fn request_name(req: &Request) -> &'static str {
    match req {
        Request::Withdraw(_) => "withdraw",
        Request::Deposit(_) => "deposit",
        Request::Refund(_) => "refund",
        Request::Lookup { .. } => "lookup",
        Request::Cancel { .. } => "cancel",
        Request::SetStatus { .. } => "set_status",
        _ => "other",
    }
}

#[async_trait]
impl SpotTransport for SimSpot {
    async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let name = format!("spot.{}", request_name(req));
        {
            let mut w = self.sim.world();
            match req {
                Request::Lookup { req_id } => {
                    for op in Operation::ALL {
                        w.track_lookup(System::Spot, req_id, op);
                    }
                }
                Request::Cancel {
                    req_id, movement, ..
                } => w.track_lookup(System::Spot, req_id, operation_of(*movement)),
                _ => {
                    if let Some((op, m)) = req.as_movement() {
                        w.track_call(System::Spot, &m.req_id, operation_of(op));
                    }
                }
            }
        }
        let fate = self.sim.fate(&name).await;
        match fate {
            Fate::Unsent => return Err(ClientError::Connect("sim: connection refused".into())),
            Fate::Late => {
                if let Some(ms) = self.sim.late_delivery() {
                    self.deliver_later(req, ms);
                }
                return Err(ClientError::Timeout);
            }
            Fate::AnswerLost | Fate::Delivered => {}
        }
        let response = spot_apply(&mut self.sim.world(), req);
        if let Some(ms) = self.sim.maybe_duplicate(&name) {
            self.deliver_later(req, ms);
        }
        if fate == Fate::AnswerLost {
            return Err(ClientError::Io(
                "sim: connection reset after the request".into(),
            ));
        }
        Ok(response)
    }
}

impl SimSpot {
    fn deliver_later(&self, req: &Request, ms: u64) {
        let sim = self.sim.clone();
        let req = req.clone();
        self.sim.rt.spawn(NETWORK, Role::Network, async move {
            sim.rt.sleep(Duration::from_millis(ms)).await;
            let mut w = sim.world();
            w.note(|| format!("late copy of spot {} arrives", request_name(&req)));
            spot_apply(&mut w, &req);
        });
    }
}
