//! The coordinator: creates transfers and drives them step by step. Every step commits its event
//! before the adapter call it announces, and the aggregate is kept in memory between steps, so a
//! transfer's events are read once per drive; the event table's key still refuses a competing
//! writer (optimistic concurrency).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::event_log::BatchingEventRepository;
use chrono::{DateTime, Utc};
use cqrs_es::event_sink::EventSink;
use cqrs_es::persist::{EventStoreAggregateContext, PersistedEventStore};
use cqrs_es::{Aggregate, AggregateError, EventStore};
use domain::{
    AccountPort, AccountType, AdapterOutcome, Amount, AssetRegistry, ErrorCode, Movement,
    Operation, ReqId, StepOutcome, Transfer, TransferCommand, TransferData, TransferError,
    TransferState, UserId,
};
use projections::TransferView;

use crate::failpoint::failpoint;
use crate::limits::DailyLimits;
use resume::call_or_lookup;

mod resume;
pub use resume::{ManualResolutionError, Resumed};
use sqlx::PgPool;

/// The event store in plain event-store mode (postgres-es's snapshot modes double-apply events),
/// over the batching repository: postgres-es's table and reads, group-committed appends.
pub type TransferStore = PersistedEventStore<BatchingEventRepository, Transfer>;

/// A request for a new transfer, already parsed into domain types.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTransfer {
    pub user_id: UserId,
    pub from: AccountType,
    pub to: AccountType,
    pub asset: String,
    pub amount: Amount,
    /// The client's idempotency key, scoped to `user_id`.
    pub cid: Option<String>,
}

impl NewTransfer {
    /// The canonical body a `cid` is bound to.
    fn fingerprint(&self) -> String {
        format!("{}|{}|{}|{}", self.from, self.to, self.asset, self.amount)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CoordinatorError {
    /// The request is refused with this contract code; nothing was created.
    #[error("refused: {0}")]
    Refused(ErrorCode),
    /// Another writer changed the transfer first; this one stopped without acting.
    #[error("another writer changed the transfer first")]
    Conflict,
    #[error("transfer not found")]
    NotFound,
    /// The aggregate refused a command: a bug in the caller's sequencing.
    #[error("transition refused: {0}")]
    Transition(TransferError),
    /// The store could not be reached or answered strangely; the outcome of a write is unknown.
    #[error("store: {0}")]
    Store(String),
}

impl From<AggregateError<TransferError>> for CoordinatorError {
    fn from(e: AggregateError<TransferError>) -> Self {
        match e {
            AggregateError::UserError(e) => Self::Transition(e),
            AggregateError::AggregateConflict => Self::Conflict,
            other => Self::Store(other.to_string()),
        }
    }
}

impl From<sqlx::Error> for CoordinatorError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.to_string())
    }
}

type Context = EventStoreAggregateContext<Transfer>;

/// Drives transfers. Cheap to clone.
#[derive(Clone)]
pub struct Coordinator {
    store: Arc<TransferStore>,
    pool: PgPool,
    view: TransferView,
    funding: Arc<dyn AccountPort>,
    spot: Arc<dyn AccountPort>,
    assets: Arc<RwLock<AssetRegistry>>,
    daily: Arc<DailyLimits>,
    clock: fn() -> DateTime<Utc>,
}

impl Coordinator {
    pub fn new(
        pool: PgPool,
        funding: Arc<dyn AccountPort>,
        spot: Arc<dyn AccountPort>,
        assets: Arc<RwLock<AssetRegistry>>,
    ) -> Self {
        let repo = BatchingEventRepository::new(pool.clone());
        Self {
            store: Arc::new(PersistedEventStore::new_event_store(repo)),
            view: TransferView::new(pool.clone()),
            pool,
            funding,
            spot,
            assets,
            daily: Arc::new(DailyLimits::default()),
            clock: Utc::now,
        }
    }

    /// Holds new transfers to per-user daily limits, counted in PostgreSQL (shared by every
    /// process). Without it the coordinator sets no daily limit.
    pub fn with_daily_limits(mut self, limits: DailyLimits) -> Self {
        self.daily = Arc::new(limits);
        self
    }

    pub fn view(&self) -> &TransferView {
        &self.view
    }

    pub fn assets(&self) -> &Arc<RwLock<AssetRegistry>> {
        &self.assets
    }

    /// The current state of a transfer, folded from its events (the source of truth).
    pub async fn load(&self, req_id: &ReqId) -> Result<Option<TransferData>, CoordinatorError> {
        let ctx = self.store.load_aggregate(&req_id.to_string()).await?;
        Ok(ctx.aggregate.data)
    }

    /// Creates a transfer and drives it as far as it goes now. With a `cid`, a repeat of the same
    /// body returns the original transfer, and the same `cid` with another body is refused.
    pub async fn submit(&self, request: NewTransfer) -> Result<TransferData, CoordinatorError> {
        // A repeat of a cid answers with the original transfer before anything else is checked:
        // conditions may have changed since (limits, asset settings), but the answer must not.
        if let Some(existing) = self.existing_for_cid(&request).await? {
            return Ok(existing);
        }
        self.validate(&request)?;
        let req_id = match &request.cid {
            None => ReqId::generate(),
            Some(cid) => match self.claim_cid(&request, cid).await? {
                Claim::New(id) => id,
                Claim::Existing(id) => {
                    // The first request may have died between claiming the key and creating the
                    // transfer; creating it now is safe because the key fixed its req_id.
                    if let Some(existing) = self.load(&id).await? {
                        return Ok(existing);
                    }
                    id
                }
            },
        };
        // Only a transfer about to be created is charged: a repeat answered above is not. A
        // refused request keeps its cid claim, so retrying it later still creates exactly one
        // transfer under the same req_id.
        let reservation = if self.daily.is_unlimited() {
            None
        } else {
            let asset =
                domain::AssetSymbol::parse(&request.asset).map_err(CoordinatorError::Refused)?;
            let day = crate::limits::day_of((self.clock)());
            crate::limits::reserve(
                &self.pool,
                &self.daily,
                request.user_id,
                &asset,
                request.amount,
                day,
            )
            .await?
            .map_err(CoordinatorError::Refused)?;
            Some((asset, day))
        };
        let ctx = match self.create(req_id, &request).await {
            Ok(ctx) => ctx,
            // A concurrent duplicate created it first: answer with that transfer, and give back
            // this request's charge (the duplicate's own request was charged).
            Err(
                CoordinatorError::Conflict
                | CoordinatorError::Transition(TransferError::AlreadyExists),
            ) => {
                self.release_reservation(&request, &reservation).await;
                return self.load(&req_id).await?.ok_or(CoordinatorError::NotFound);
            }
            // A store error leaves it unknown whether the transfer was created: give the charge
            // back only when it is known not to exist (over-charging is the safe side).
            Err(e @ CoordinatorError::Store(_)) => {
                if matches!(self.load(&req_id).await, Ok(None)) {
                    self.release_reservation(&request, &reservation).await;
                }
                return Err(e);
            }
            Err(e) => {
                self.release_reservation(&request, &reservation).await;
                return Err(e);
            }
        };
        // From here on the transfer exists, so the caller must always get its req_id back: an
        // error without it would invite a client retry that creates a second transfer. Whatever
        // stops the drive, the answer is the last state known; the worker finishes the rest.
        let mut last = ctx.aggregate.data.clone();
        match self.drive_tracking(ctx, &mut last).await {
            Ok(data) => Ok(data),
            Err(e) => {
                if !matches!(e, CoordinatorError::Conflict) {
                    tracing::warn!(%req_id, error = %e, "drive stopped; the recovery worker resumes it");
                }
                let reloaded = self.load(&req_id).await.ok().flatten();
                reloaded
                    .or(last)
                    .ok_or_else(|| CoordinatorError::Store("created transfer has no state".into()))
            }
        }
    }

    /// Gives back a daily-limit charge for a transfer that was not created by this request.
    async fn release_reservation(
        &self,
        request: &NewTransfer,
        reservation: &Option<(domain::AssetSymbol, chrono::NaiveDate)>,
    ) {
        let Some((asset, day)) = reservation else {
            return;
        };
        let released = crate::limits::release(
            &self.pool,
            &self.daily,
            request.user_id,
            asset,
            request.amount,
            *day,
        )
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
        let found: Option<(String, String)> = sqlx::query_as(
            "SELECT req_id, fingerprint FROM transfer_cids WHERE user_id = $1 AND cid = $2",
        )
        .bind(request.user_id.as_i64())
        .bind(cid)
        .fetch_optional(&self.pool)
        .await?;
        let Some((req_id, fingerprint)) = found else {
            return Ok(None);
        };
        if fingerprint != request.fingerprint() {
            return Err(CoordinatorError::Refused(ErrorCode::IdempotencyKeyReused));
        }
        let req_id = ReqId::parse(&req_id)
            .map_err(|_| CoordinatorError::Store("stored req_id is malformed".into()))?;
        // A claim without a transfer (the first request died in between) is created by the
        // normal path, under the claimed req_id.
        self.load(&req_id).await
    }

    /// Resumes a transfer from whatever state its events say, and drives it as far as it goes:
    /// to a terminal state, or to a step whose outcome is unknown (left as it is).
    pub async fn drive(&self, req_id: &ReqId) -> Result<TransferData, CoordinatorError> {
        let ctx = self.store.load_aggregate(&req_id.to_string()).await?;
        if ctx.aggregate.data.is_none() {
            return Err(CoordinatorError::NotFound);
        }
        self.drive_context(ctx).await
    }

    /// The coordinator's own checks (defence in depth): a caller that skips the API is refused
    /// the same way. Account state and balance are the adapters' to check.
    fn validate(&self, request: &NewTransfer) -> Result<(), CoordinatorError> {
        let refuse = CoordinatorError::Refused;
        if request.from == request.to {
            return Err(refuse(ErrorCode::SameAccount));
        }
        if !request.from.is_supported() || !request.to.is_supported() {
            return Err(refuse(ErrorCode::UnsupportedAccountType));
        }
        let assets = self.assets.read().expect("asset registry lock poisoned");
        let asset = assets.get(&request.asset).map_err(refuse)?;
        asset.check_transferable().map_err(refuse)?;
        asset.check_amount(request.amount).map_err(refuse)?;
        if let Some(cid) = &request.cid {
            let ok = !cid.is_empty()
                && cid.len() <= 64
                && cid
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(refuse(ErrorCode::InvalidIdempotencyKey));
            }
        }
        Ok(())
    }

    async fn claim_cid(&self, request: &NewTransfer, cid: &str) -> Result<Claim, CoordinatorError> {
        let fresh = ReqId::generate();
        let inserted = sqlx::query(
            "INSERT INTO transfer_cids (user_id, cid, req_id, fingerprint) VALUES ($1, $2, $3, $4)
             ON CONFLICT (user_id, cid) DO NOTHING",
        )
        .bind(request.user_id.as_i64())
        .bind(cid)
        .bind(fresh.to_string())
        .bind(request.fingerprint())
        .execute(&self.pool)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(Claim::New(fresh));
        }
        let (req_id, fingerprint): (String, String) = sqlx::query_as(
            "SELECT req_id, fingerprint FROM transfer_cids WHERE user_id = $1 AND cid = $2",
        )
        .bind(request.user_id.as_i64())
        .bind(cid)
        .fetch_one(&self.pool)
        .await?;
        if fingerprint != request.fingerprint() {
            return Err(CoordinatorError::Refused(ErrorCode::IdempotencyKeyReused));
        }
        let req_id = ReqId::parse(&req_id)
            .map_err(|_| CoordinatorError::Store("stored req_id is malformed".into()))?;
        Ok(Claim::Existing(req_id))
    }

    async fn create(&self, req_id: ReqId, r: &NewTransfer) -> Result<Context, CoordinatorError> {
        // A new transfer has no events to read: start from the empty aggregate at sequence 0.
        // If the req_id does exist (a cid claimed by a request that died), the commit of
        // sequence 1 conflicts and the caller loads what is there.
        let ctx = Context {
            aggregate_id: req_id.to_string(),
            aggregate: Transfer::default(),
            current_sequence: 0,
            current_snapshot: None,
        };
        let asset = domain::AssetSymbol::parse(&r.asset).map_err(CoordinatorError::Refused)?;
        let command = TransferCommand::Create {
            req_id,
            user_id: r.user_id,
            from: r.from,
            to: r.to,
            asset,
            amount: r.amount,
            cid: r.cid.clone(),
            at: (self.clock)(),
        };
        let ctx = self.execute(ctx, command).await?;
        tracing::info!(%req_id, user_id = %r.user_id, from = %r.from, to = %r.to, asset = %r.asset, amount = %r.amount, "transfer created");
        Ok(ctx)
    }

    /// Handles one command on the in-memory aggregate and commits its events; returns the
    /// context advanced past them. A competing writer makes the commit fail with `Conflict`.
    async fn execute(
        &self,
        mut ctx: Context,
        command: TransferCommand,
    ) -> Result<Context, CoordinatorError> {
        let sink = EventSink::default();
        ctx.aggregate
            .handle(command, &(), &sink)
            .await
            .map_err(CoordinatorError::Transition)?;
        let events = sink.collect().await;
        let aggregate = ctx.aggregate.clone();
        let aggregate_id = ctx.aggregate_id.clone();
        let committed = self.store.commit(events, ctx, HashMap::new()).await?;
        let current_sequence = committed.last().map_or(0, |e| e.sequence);
        // No read-model write here: the projector (projections::Projector) applies every
        // committed event exactly once, in a commit-safe order, from the log itself.
        Ok(Context {
            aggregate_id,
            aggregate,
            current_sequence,
            current_snapshot: None,
        })
    }

    async fn drive_context(&self, ctx: Context) -> Result<TransferData, CoordinatorError> {
        let mut last = None;
        self.drive_tracking(ctx, &mut last).await
    }

    /// Drives as far as it goes, keeping in `last` the newest state known to be committed.
    async fn drive_tracking(
        &self,
        mut ctx: Context,
        last: &mut Option<TransferData>,
    ) -> Result<TransferData, CoordinatorError> {
        loop {
            let data = ctx
                .aggregate
                .data
                .clone()
                .expect("a driven transfer has been created");
            *last = Some(data.clone());
            if data.state.is_terminal() {
                return Ok(data);
            }
            match self.step(ctx, &data, false).await? {
                Stepped::Next(next) => ctx = next,
                // An unknown outcome: the state stays (the in-memory aggregate is current), and
                // the transfer waits for a retry.
                Stepped::Unknown(_) => return Ok(data),
            }
        }
    }

    /// One step by state (seed 000 section 6.3). `Unknown` means the adapter's outcome was
    /// unknown and nothing was recorded. With `lookup_first` (the recovery worker resuming a
    /// transfer someone else left), the account system is asked what it recorded for the call
    /// before the call is retried (see `resume.rs`). The fail points are the CRA-001..006 crash
    /// points.
    async fn step(
        &self,
        ctx: Context,
        data: &TransferData,
        lookup_first: bool,
    ) -> Result<Stepped, CoordinatorError> {
        let now = self.clock;
        let movement = Movement {
            req_id: data.req_id,
            user_id: data.user_id,
            asset: data.asset.clone(),
            amount: data.amount,
        };
        let source = self.port(data.from);
        let target = self.port(data.to);
        let command = match data.state {
            TransferState::Init => {
                failpoint("after_init");
                TransferCommand::StartSourceWithdraw { at: now() }
            }
            TransferState::SourcePending => {
                failpoint("source_pending_before_call");
                let outcome =
                    call_or_lookup(source, Operation::Withdraw, &movement, lookup_first).await;
                failpoint("source_after_call");
                let reason = format!("source withdraw: {outcome:?}");
                match self.definite(data, "source withdraw", outcome) {
                    Some(outcome) => TransferCommand::RecordSourceOutcome { outcome, at: now() },
                    None => return Ok(Stepped::Unknown(reason)),
                }
            }
            TransferState::SourceDone => {
                failpoint("after_source_done");
                TransferCommand::StartTargetDeposit { at: now() }
            }
            TransferState::TargetPending => {
                failpoint("target_pending_before_call");
                let outcome =
                    call_or_lookup(target, Operation::Deposit, &movement, lookup_first).await;
                failpoint("target_after_call");
                let reason = format!("target deposit: {outcome:?}");
                match self.definite(data, "target deposit", outcome) {
                    Some(outcome) => TransferCommand::RecordTargetOutcome { outcome, at: now() },
                    None => return Ok(Stepped::Unknown(reason)),
                }
            }
            TransferState::Compensating => {
                failpoint("compensating_before_refund");
                let outcome =
                    call_or_lookup(source, Operation::Refund, &movement, lookup_first).await;
                failpoint("compensating_after_refund");
                match outcome {
                    AdapterOutcome::Success => TransferCommand::RecordRefund { at: now() },
                    other => {
                        // A refund is never given up: it stays COMPENSATING until it succeeds.
                        tracing::error!(req_id = %data.req_id, outcome = ?other, "refund not applied; transfer stays COMPENSATING");
                        return Ok(Stepped::Unknown(format!("source refund: {other:?}")));
                    }
                }
            }
            TransferState::Committed | TransferState::Failed | TransferState::RolledBack => {
                unreachable!("terminal states are not stepped")
            }
        };
        Ok(Stepped::Next(self.execute(ctx, command).await?))
    }

    /// Turns an adapter outcome into a recordable one, or `None` when it is unknown.
    fn definite(
        &self,
        data: &TransferData,
        what: &str,
        outcome: AdapterOutcome,
    ) -> Option<StepOutcome> {
        match outcome {
            AdapterOutcome::Success => Some(StepOutcome::Succeeded),
            AdapterOutcome::ExplicitFail { code, message } => {
                tracing::info!(req_id = %data.req_id, %code, "{what} refused");
                Some(StepOutcome::Refused { code, message })
            }
            unknown => {
                tracing::warn!(req_id = %data.req_id, state = %data.state, outcome = ?unknown, "{what} outcome unknown; state kept for retry");
                None
            }
        }
    }

    fn port(&self, account: AccountType) -> &dyn AccountPort {
        match account {
            AccountType::Funding => self.funding.as_ref(),
            AccountType::Spot => self.spot.as_ref(),
            AccountType::Future | AccountType::Margin => {
                unreachable!("unsupported account types are refused at creation")
            }
        }
    }
}

enum Claim {
    New(ReqId),
    Existing(ReqId),
}

/// What one step came to.
enum Stepped {
    /// The step's event is committed; the context is advanced past it.
    Next(Context),
    /// The adapter's outcome was unknown; nothing was recorded. Says what happened, for the
    /// worker's retry record.
    Unknown(String),
}
