//! The bookkeeping beside the log in memory: the client keys' claims (`SimClientKeys`), the
//! leases (`SimLeases`) and the daily limits' counters (`SimDailyReservations`, which decide
//! with the product's own rule, `application::DailyUsage`).

use std::time::Duration;

use application::{
    Charge, ClientKey, ClientKeys, CoordinatorError, DailyLimits, DailyReservations, LeaseRequest,
    Leases, Rekeyed,
};
use async_trait::async_trait;
use chrono::NaiveDate;
use domain::{ErrorCode, ReqId, UserId};

use crate::world::{short, RetryRow};

use super::{lease_free, Sim};

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
