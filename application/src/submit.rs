//! Creating a transfer: the coordinator's own checks (defence in depth), the client's idempotency
//! key (`cid`), the daily limits, `TransferCreated` with the withdraw's announcement in one
//! commit, and the first drive.

use std::time::Duration;

use chrono::NaiveDate;
use domain::{
    invariant, ErrorCode, ReqId, Transfer, TransferCommand, TransferData, TransferError,
    TransferState,
};

use crate::coordinator::{Context, Coordinator, CoordinatorError, NewTransfer};
use crate::daily::{self, Charge};
use crate::failpoint::FailPoint;
use crate::horizon;
use crate::ports::{CidClaim, ClientKey, Rekeyed};

/// What an orphan claim comes to: the req_id to create under, or the transfer another request
/// created meanwhile.
enum Usable {
    Create(ReqId),
    Exists(TransferData),
}

/// What the cid and the daily limits leave a request with, before its creation.
enum Prepared {
    /// A repeat: the transfer the cid already names.
    Answered(TransferData),
    /// Create under `req_id`; `reservation` is the day charged (none when unlimited).
    Create {
        req_id: ReqId,
        reservation: Option<NaiveDate>,
    },
}

/// What one try at creating came to.
pub(crate) enum Created {
    /// Created by this request: its context after `TransferCreated` + `SourceWithdrawStarted`.
    New(Context),
    /// A repeat or a concurrent duplicate: the transfer that exists.
    Answered(TransferData),
    /// The event log refused the creation because the cid's claim names another req_id now.
    ClaimMoved,
}

/// How many times a creation follows a moving claim before it gives up with a store error (a
/// claim moves once per half retention at most, so a second try already finds it settled).
const CLAIM_MOVED_ATTEMPTS: u32 = 3;

/// What a request's cid leads to.
pub(crate) enum CidKey {
    /// A repeat: the transfer the cid already names.
    Answered(TransferData),
    /// Create under this req_id (the cid's), or a fresh one.
    Key(Option<ReqId>),
}

impl Coordinator {
    /// Creates a transfer and drives it as far as it goes now. With a `cid`, a repeat of the same
    /// body returns the original transfer, and the same `cid` with another body is refused.
    pub async fn submit(&self, request: NewTransfer) -> Result<TransferData, CoordinatorError> {
        // A repeat of a cid answers with the original transfer before anything else is checked:
        // conditions may have changed since (limits, asset settings), but the answer must not.
        if let Some(existing) = self.existing_for_cid(&request).await? {
            return Ok(existing);
        }
        self.validate(&request)?;
        self.create_and_drive(request).await
    }

    /// Everything after the checks, for one request alone (the single route goes through a
    /// round, `round.rs`; a creation whose cid claim moved is retried here): claims the cid,
    /// charges the daily limits, creates, drives.
    pub(crate) async fn create_and_drive_alone(
        &self,
        request: NewTransfer,
    ) -> Result<TransferData, CoordinatorError> {
        let mut attempt = 0;
        let ctx = loop {
            attempt += 1;
            match self.create_claimed(&request).await? {
                Created::New(ctx) => break ctx,
                Created::Answered(existing) => return Ok(existing),
                // The cid's claim was re-keyed while this creation was on its way (it took longer
                // than half the idempotency retention): the claim names another req_id now, and
                // the request is answered by what that one holds, or creates under it.
                Created::ClaimMoved if attempt < CLAIM_MOVED_ATTEMPTS => continue,
                Created::ClaimMoved => {
                    return Err(CoordinatorError::outcome_unknown(
                        "the client key's claim kept moving while the transfer was created",
                    ))
                }
            }
        };
        let req_id = ctx
            .aggregate
            .data
            .as_ref()
            .map(|d| d.req_id)
            .ok_or_else(|| CoordinatorError::invariant("created transfer has no state"))?;
        // TransferCreated and SourceWithdrawStarted are durable together: the withdraw is
        // announced before it is called.
        self.failpoints.hit(FailPoint::AfterCreatedWithdrawStarted);
        // From here on the transfer exists, so the caller must always get its req_id back: an
        // error without it would invite a client retry that creates a second transfer. Whatever
        // stops the drive, the answer is the last state known; the worker finishes the rest.
        let mut last = ctx.aggregate.data.clone();
        match self.drive_loop(ctx, false, &mut last).await {
            Ok(driven) => Ok(driven.data),
            Err(e) => {
                if !matches!(e, CoordinatorError::Conflict) {
                    tracing::warn!(%req_id, error = %e, "drive stopped; the recovery worker resumes it");
                }
                let reloaded = self.load(&req_id).await.ok().flatten();
                reloaded
                    .or(last)
                    .ok_or_else(|| CoordinatorError::invariant("created transfer has no state"))
            }
        }
    }

    /// Claims the cid, charges the daily limits and creates: one try.
    async fn create_claimed(&self, request: &NewTransfer) -> Result<Created, CoordinatorError> {
        let (req_id, reservation) = match self.prepare_creation(request).await? {
            Prepared::Answered(existing) => return Ok(Created::Answered(existing)),
            Prepared::Create {
                req_id,
                reservation,
            } => (req_id, reservation),
        };
        let created = self.create(req_id, request).await;
        self.settle_creation(request, req_id, reservation, created)
            .await
    }

    /// Claims the cid and charges the daily limits: the req_id to create under, or the
    /// transfer a repeat is answered with.
    async fn prepare_creation(&self, request: &NewTransfer) -> Result<Prepared, CoordinatorError> {
        let claimed = match self.cid_key(request).await? {
            CidKey::Answered(existing) => return Ok(Prepared::Answered(existing)),
            CidKey::Key(claimed) => claimed,
        };
        let reservation = self.reserve_daily(request).await?;
        // Generated as late as possible: the horizon's safety needs a req_id's time close to its
        // TransferCreated commit (`horizon.rs`).
        let req_id = claimed.unwrap_or_else(|| self.clock.req_id());
        Ok(Prepared::Create {
            req_id,
            reservation,
        })
    }

    /// What a creation's commit came to, with its charge given back when it was not this
    /// request's creation after all.
    pub(crate) async fn settle_creation(
        &self,
        request: &NewTransfer,
        req_id: ReqId,
        reservation: Option<NaiveDate>,
        created: Result<Context, CoordinatorError>,
    ) -> Result<Created, CoordinatorError> {
        match created {
            Ok(ctx) => {
                // Postcondition of a creation: the transfer is this request's, under the req_id
                // it was claimed and charged for, and its withdraw is announced (the create's
                // commit carries `SourceWithdrawStarted`) before anything calls it, or, for a
                // FUNDING source in the log's own database, made and recorded in the same
                // write (ADR 0024: withdrawn and the deposit announced, or failed).
                let created = ctx.aggregate.data.as_ref();
                invariant!(
                    created.is_some_and(|d| d.req_id == req_id
                        && d.user_id == request.user_id
                        && d.asset == request.asset
                        && d.amount == request.amount
                        && d.from == request.from
                        && d.to == request.to
                        && matches!(
                            d.state,
                            TransferState::SourcePending
                                | TransferState::TargetPending
                                | TransferState::Failed
                        )),
                    "created {req_id} for {} {} {}: {:?}",
                    request.user_id,
                    request.amount,
                    request.asset,
                    created.map(|d| (d.req_id, d.user_id, d.amount, d.state))
                );
                log_created(req_id, request);
                Ok(Created::New(ctx))
            }
            // A concurrent duplicate created it first: answer with that transfer, and give back
            // this request's charge (the duplicate's own request was charged). With a cid and no
            // transfer under the req_id, the refusal was the event log's claim guard: the claim
            // was re-keyed meanwhile (migration 0020).
            Err(
                CoordinatorError::Conflict
                | CoordinatorError::Transition(TransferError::AlreadyExists),
            ) => {
                self.release_reservation(request, reservation).await;
                match self.load(&req_id).await? {
                    Some(existing) => Ok(Created::Answered(existing)),
                    None if request.cid.is_some() => Ok(Created::ClaimMoved),
                    None => Err(CoordinatorError::NotFound),
                }
            }
            // A store error (or a broken invariant) leaves it unknown whether the transfer was
            // created: give the charge back only when it is known not to exist (over-charging is
            // the safe side).
            Err(e @ (CoordinatorError::OutcomeUnknown(_) | CoordinatorError::Invariant(_))) => {
                if matches!(self.load(&req_id).await, Ok(None)) {
                    self.release_reservation(request, reservation).await;
                }
                Err(e)
            }
            Err(e) => {
                self.release_reservation(request, reservation).await;
                Err(e)
            }
        }
    }

    /// The req_id the client's cid fixed (none without a cid), or the transfer a repeat is
    /// answered with.
    pub(crate) async fn cid_key(&self, request: &NewTransfer) -> Result<CidKey, CoordinatorError> {
        let Some(cid) = &request.cid else {
            return Ok(CidKey::Key(None));
        };
        let fresh = self.clock.req_id();
        let inserted = self
            .claims
            .claim(request.user_id, cid, &fresh, &request.fingerprint())
            .await?;
        self.claimed(request, cid, fresh, inserted).await
    }

    /// `cid_key` for the requests at `indices` (no user and cid twice among them), their claims
    /// taken in one `ClientKeys::claim_many`: one answer each, in order. A store error answers
    /// every request with a cid.
    pub(crate) async fn cid_keys(
        &self,
        requests: &[NewTransfer],
        indices: &[usize],
    ) -> Vec<Result<CidKey, CoordinatorError>> {
        let fresh: Vec<Option<ReqId>> = indices
            .iter()
            .map(|&i| requests[i].cid.as_ref().map(|_| self.clock.req_id()))
            .collect();
        let claims: Vec<CidClaim> = indices
            .iter()
            .zip(&fresh)
            .filter_map(|(&i, fresh)| {
                let r = &requests[i];
                Some(CidClaim {
                    user: r.user_id,
                    cid: r.cid.clone()?,
                    req_id: (*fresh)?,
                    fingerprint: r.fingerprint(),
                })
            })
            .collect();
        let claimed = match claims.is_empty() {
            true => Ok(Vec::new()),
            false => self.claims.claim_many(&claims).await,
        };
        let mut claimed = match claimed {
            Ok(claimed) => claimed.into_iter(),
            Err(e) => {
                return indices
                    .iter()
                    .map(|&i| match requests[i].cid {
                        Some(_) => Err(e.clone()),
                        None => Ok(CidKey::Key(None)),
                    })
                    .collect()
            }
        };
        let outcomes: Vec<_> = fresh
            .into_iter()
            .map(|f| f.map(|f| (f, claimed.next().unwrap_or(false))))
            .collect();
        // The keys found claimed already are looked at together (independent reads).
        futures_util::future::join_all(indices.iter().zip(outcomes).map(
            |(&i, outcome)| async move {
                let request = &requests[i];
                match (&request.cid, outcome) {
                    (Some(cid), Some((fresh, inserted))) => {
                        self.claimed(request, cid, fresh, inserted).await
                    }
                    _ => Ok(CidKey::Key(None)),
                }
            },
        ))
        .await
    }

    /// What a claim of `cid` under `fresh` came to: `fresh` when `inserted`; else the claim
    /// found (another body under the key refused), the transfer it names, or, when the first
    /// request died before creating it, its req_id to create under.
    async fn claimed(
        &self,
        request: &NewTransfer,
        cid: &str,
        fresh: ReqId,
        inserted: bool,
    ) -> Result<CidKey, CoordinatorError> {
        if inserted {
            return Ok(CidKey::Key(Some(fresh)));
        }
        let ClientKey {
            req_id: id,
            fingerprint,
        } = self
            .claims
            .find(request.user_id, cid)
            .await?
            .ok_or_else(|| CoordinatorError::invariant("the client key's claim vanished"))?;
        if fingerprint != request.fingerprint() {
            return Err(CoordinatorError::Refused(ErrorCode::IdempotencyKeyReused));
        }
        // The first request may have died between claiming the key and creating the
        // transfer; creating it now is safe because the key fixed its req_id (or re-keyed it,
        // when it is too old for the idempotency horizon).
        if let Some(existing) = self.load(&id).await? {
            return Ok(CidKey::Answered(existing));
        }
        match self.usable_claim(request, cid, id).await? {
            Usable::Create(id) => Ok(CidKey::Key(Some(id))),
            Usable::Exists(existing) => Ok(CidKey::Answered(existing)),
        }
    }

    /// Charges the daily limits; returns the day charged (none when unlimited).
    ///
    /// Only a transfer about to be created is charged: a repeat answered before is not. A
    /// refused request keeps its cid claim, so retrying it later still creates exactly one
    /// transfer under the same req_id.
    pub(crate) async fn reserve_daily(
        &self,
        request: &NewTransfer,
    ) -> Result<Option<NaiveDate>, CoordinatorError> {
        if self.daily.is_unlimited() {
            return Ok(None);
        }
        let day = daily::day_of(self.clock.now());
        self.reservations
            .reserve(&self.daily, &request.charge(), day)
            .await?
            .map_err(CoordinatorError::Refused)?;
        Ok(Some(day))
    }

    /// `reserve_daily` for the requests at `indices`, in that order, in one reservation: one
    /// answer each (a store error answers every one of them; nothing was reserved then).
    pub(crate) async fn reserve_daily_many(
        &self,
        requests: &[NewTransfer],
        indices: &[usize],
    ) -> Vec<Result<Option<NaiveDate>, CoordinatorError>> {
        if self.daily.is_unlimited() || indices.is_empty() {
            return indices.iter().map(|_| Ok(None)).collect();
        }
        let day = daily::day_of(self.clock.now());
        let charges: Vec<Charge> = indices.iter().map(|&i| requests[i].charge()).collect();
        match self
            .reservations
            .reserve_many(&self.daily, &charges, day)
            .await
        {
            Ok(answers) => {
                invariant!(
                    answers.len() == charges.len(),
                    "{} charges reserved, {} answered",
                    charges.len(),
                    answers.len()
                );
                answers
                    .into_iter()
                    .map(|a| a.map(|()| Some(day)).map_err(CoordinatorError::Refused))
                    .collect()
            }
            Err(e) => indices.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Gives back a daily-limit charge for a transfer that was not created by this request.
    async fn release_reservation(&self, request: &NewTransfer, reservation: Option<NaiveDate>) {
        let Some(day) = reservation else {
            return;
        };
        let released = self
            .reservations
            .release(&self.daily, &request.charge(), day)
            .await;
        if let Err(e) = released {
            tracing::warn!(user_id = %request.user_id, error = %e, "daily limit charge not released");
        }
    }

    /// The transfer a cid already names for this user, if the body is the same; a different
    /// body under the same cid is refused. `None` when the cid is new (or there is none).
    pub async fn existing_for_cid(
        &self,
        request: &NewTransfer,
    ) -> Result<Option<TransferData>, CoordinatorError> {
        let Some(cid) = &request.cid else {
            return Ok(None);
        };
        let found = self.claims.find(request.user_id, cid).await?;
        let Some(ClientKey {
            req_id,
            fingerprint,
        }) = found
        else {
            return Ok(None);
        };
        if fingerprint != request.fingerprint() {
            return Err(CoordinatorError::Refused(ErrorCode::IdempotencyKeyReused));
        }
        // A claim without a transfer (the first request died in between) is created by the
        // normal path, under the claimed req_id.
        self.load(&req_id).await
    }

    /// The coordinator's own checks (defence in depth): a caller that skips the API is refused
    /// the same way. Account state and balance are the adapters' to check.
    pub(crate) fn validate(&self, request: &NewTransfer) -> Result<(), CoordinatorError> {
        let refuse = CoordinatorError::Refused;
        if request.from == request.to {
            return Err(refuse(ErrorCode::SameAccount));
        }
        if !request.from.is_supported() || !request.to.is_supported() {
            return Err(refuse(ErrorCode::UnsupportedAccountType));
        }
        {
            // A poisoned lock only means a writer panicked mid-update of a plain map.
            let assets = self.assets.read().unwrap_or_else(|e| e.into_inner());
            let asset = assets.get(request.asset.as_str()).map_err(refuse)?;
            asset.check_transferable().map_err(refuse)?;
            asset.check_amount(request.amount).map_err(refuse)?;
        }
        if let Some(cid) = &request.cid {
            if !valid_cid(cid) {
                return Err(refuse(ErrorCode::InvalidIdempotencyKey));
            }
        }
        Ok(())
    }

    /// Whether an orphan claim's req_id (no transfer under it) may still be used. spot-core
    /// refuses a req_id older than the idempotency horizon (`REQ_ID_EXPIRED`), and the horizon
    /// may pass any req_id with no transfer once it is a retention old: a claim is used while it
    /// is younger than half the retention, and re-keyed after that. No movement was ever sent
    /// under a req_id without `TransferCreated`, so a new req_id changes nothing anywhere.
    ///
    /// A request that found the claim young may still be creating under it: a re-key waits until
    /// the claim is half a retention plus a grace old (that request has committed by then, or
    /// never will), then swaps the req_id only if the claim still names it and no transfer was
    /// created under it, in one transaction.
    async fn usable_claim(
        &self,
        request: &NewTransfer,
        cid: &str,
        mut req_id: ReqId,
    ) -> Result<Usable, CoordinatorError> {
        let half = self.retention / 2;
        let grace = (self.retention / 4).min(horizon::CLAIM_GRACE_MAX);
        loop {
            let made = horizon::ulid_time_ms(&req_id.to_string())
                .ok_or_else(|| CoordinatorError::invariant("claimed req_id is not a ULID"))?;
            let age = Duration::from_millis(self.clock.now_ms().saturating_sub(made));
            if age < half {
                return Ok(Usable::Create(req_id));
            }
            if age < half + grace {
                self.clock.sleep(half + grace - age).await;
            }
            let fresh = self.clock.req_id();
            let rekeyed = self
                .claims
                .rekey(request.user_id, cid, &req_id, &fresh)
                .await?;
            if rekeyed == Rekeyed::Created {
                let existing = self.load(&req_id).await?;
                return existing
                    .map(Usable::Exists)
                    .ok_or(CoordinatorError::NotFound);
            }
            if rekeyed == Rekeyed::Swapped {
                tracing::info!(
                    user_id = %request.user_id, cid, old = %req_id, new = %fresh,
                    "orphan client-key claim too old for the idempotency horizon: re-keyed"
                );
                return Ok(Usable::Create(fresh));
            }
            // Another request re-keyed it first: go on with what the claim names now.
            let now_claimed = self
                .claims
                .find(request.user_id, cid)
                .await?
                .ok_or_else(|| CoordinatorError::invariant("the client key's claim vanished"))?;
            req_id = now_claimed.req_id;
            if let Some(existing) = self.load(&req_id).await? {
                return Ok(Usable::Exists(existing));
            }
        }
    }

    /// Commits `TransferCreated` and, in the same commit, `SourceWithdrawStarted` (nothing
    /// happens between them, so INIT is never durable alone): the transfer starts in
    /// SOURCE_PENDING, its withdraw announced.
    /// Creates a transfer under a given req_id for a failover repair (`repair.rs`): no gate,
    /// cid or daily limit (it re-records what already happened); `Conflict` when it exists.
    pub(crate) async fn create_for_repair(
        &self,
        req_id: ReqId,
        r: &NewTransfer,
    ) -> Result<(), CoordinatorError> {
        match self.create(req_id, r).await {
            Ok(_) => {
                log_created(req_id, r);
                Ok(())
            }
            Err(CoordinatorError::Transition(TransferError::AlreadyExists)) => {
                Err(CoordinatorError::Conflict)
            }
            Err(e) => Err(e),
        }
    }

    async fn create(&self, req_id: ReqId, r: &NewTransfer) -> Result<Context, CoordinatorError> {
        let (ctx, command) = self.creation(req_id, r);
        self.execute_through(ctx, command).await
    }

    /// The empty aggregate a new transfer starts from and its `Create` command.
    pub(crate) fn creation(&self, req_id: ReqId, r: &NewTransfer) -> (Context, TransferCommand) {
        // A new transfer has no events to read: start from the empty aggregate at sequence 0.
        // If the req_id does exist (a cid claimed by a request that died), the commit of
        // sequences 1 and 2 conflicts and the caller loads what is there.
        let ctx = Context {
            aggregate_id: req_id.to_string(),
            aggregate: Transfer::default(),
            current_sequence: 0,
            current_snapshot: None,
        };
        let command = TransferCommand::Create {
            req_id,
            user_id: r.user_id,
            from: r.from,
            to: r.to,
            asset: r.asset.clone(),
            amount: r.amount,
            cid: r.cid.clone(),
            at: self.clock.now(),
        };
        (ctx, command)
    }
}

fn log_created(req_id: ReqId, r: &NewTransfer) {
    tracing::info!(%req_id, user_id = %r.user_id, from = %r.from, to = %r.to, asset = %r.asset, amount = %r.amount, "transfer created");
}

/// A client idempotency key: 1 to 64 characters of `[A-Za-z0-9_-]`.
fn valid_cid(cid: &str) -> bool {
    !cid.is_empty()
        && cid.len() <= 64
        && cid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
