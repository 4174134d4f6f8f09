//! The coordinator: the transfer engine every command of the application runs on. It keeps the
//! aggregate in memory while driving, commits every step's event before the adapter call it
//! announces, and lets the event table's key refuse a competing writer (optimistic
//! concurrency). Creating is in `submit.rs`, driving and resuming in `drive.rs`, manual
//! resolution in `resolve.rs`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use cqrs_es::event_sink::EventSink;
use cqrs_es::Aggregate;
use domain::{
    invariant, AccountPort, AccountType, Amount, AssetRegistry, AssetSymbol, ReqId,
    TransferCommand, TransferData, UserId,
};

use crate::daily::{Charge, DailyLimits};
pub use crate::error::{CoordinatorError, StoreCause};
use crate::failpoint::FailPoints;
pub(crate) use crate::ports::Context;
use crate::ports::{ClientKeys, Clock, Commit, DailyReservations, Leases, TransferLog};
use crate::round_queue::Rounds;

/// A request for a new transfer, already parsed into domain types.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTransfer {
    pub user_id: UserId,
    pub from: AccountType,
    pub to: AccountType,
    pub asset: AssetSymbol,
    pub amount: Amount,
    /// The client's idempotency key, scoped to `user_id`.
    pub cid: Option<String>,
}

impl NewTransfer {
    /// The canonical body a `cid` is bound to.
    pub(crate) fn fingerprint(&self) -> String {
        format!("{}|{}|{}|{}", self.from, self.to, self.asset, self.amount)
    }

    /// What the transfer charges against its user's daily limits.
    pub(crate) fn charge(&self) -> Charge {
        Charge {
            user: self.user_id,
            asset: self.asset.clone(),
            amount: self.amount,
        }
    }
}

/// The ports a coordinator runs on (`ports.rs`): PostgreSQL and the system clock in
/// production, in-memory ones in the simulation.
#[derive(Clone)]
pub struct Ports {
    pub log: Arc<dyn TransferLog>,
    pub claims: Arc<dyn ClientKeys>,
    pub leases: Arc<dyn Leases>,
    pub limits: Arc<dyn DailyReservations>,
    pub clock: Arc<dyn Clock>,
}

/// A single request in the round former's queue (`round.rs`), with the trace context of the
/// request that sent it when tracing is on, so a shared round's span can link to every request
/// it served.
pub(crate) type Queued = (NewTransfer, Option<telemetry::SpanContext>);

/// Drives transfers. Cheap to clone.
#[derive(Clone)]
pub struct Coordinator {
    pub(crate) log: Arc<dyn TransferLog>,
    pub(crate) claims: Arc<dyn ClientKeys>,
    pub(crate) leases: Arc<dyn Leases>,
    pub(crate) reservations: Arc<dyn DailyReservations>,
    pub(crate) clock: Arc<dyn Clock>,
    funding: Arc<dyn AccountPort>,
    spot: Arc<dyn AccountPort>,
    pub(crate) assets: Arc<RwLock<AssetRegistry>>,
    pub(crate) daily: Arc<DailyLimits>,
    pub(crate) failpoints: FailPoints,
    /// The idempotency horizon's retention: how old a client key's orphan claim may get before
    /// it is re-keyed (`submit.rs`, `horizon.rs`).
    pub(crate) retention: Duration,
    /// The single route's round former (`round.rs`), shared by this value's clones; a
    /// coordinator configured anew (`with_*`) gets its own, so a round never mixes two
    /// configurations.
    pub(crate) rounds: Arc<Rounds<Queued, Result<TransferData, CoordinatorError>>>,
}

impl Coordinator {
    /// The coordinator over `ports` (the simulation's in-memory ones, or any other) and the two
    /// account systems.
    pub fn with_ports(
        ports: Ports,
        funding: Arc<dyn AccountPort>,
        spot: Arc<dyn AccountPort>,
        assets: Arc<RwLock<AssetRegistry>>,
    ) -> Self {
        Self {
            log: ports.log,
            claims: ports.claims,
            leases: ports.leases,
            reservations: ports.limits,
            clock: ports.clock,
            funding,
            spot,
            assets,
            daily: Arc::new(DailyLimits::default()),
            failpoints: FailPoints::default(),
            retention: crate::horizon::RETENTION_DEFAULT,
            rounds: Arc::default(),
        }
    }

    /// Holds new transfers to per-user daily limits, counted in PostgreSQL (shared by every
    /// process). Without it the coordinator sets no daily limit.
    pub fn with_daily_limits(mut self, limits: DailyLimits) -> Self {
        self.daily = Arc::new(limits);
        self.rounds = Arc::default();
        self
    }

    /// Arms a fail point (crash tests only).
    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Self {
        self.failpoints = failpoints;
        self.rounds = Arc::default();
        self
    }

    /// The idempotency horizon's retention (the default is `horizon::RETENTION_DEFAULT`).
    pub fn with_idempotency_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self.rounds = Arc::default();
        self
    }

    pub fn assets(&self) -> &Arc<RwLock<AssetRegistry>> {
        &self.assets
    }

    /// The transfers' leases the coordinator's manual resolution takes (the recovery worker
    /// shares them).
    pub fn leases(&self) -> &Arc<dyn Leases> {
        &self.leases
    }

    /// The coordinator's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The current state of a transfer, folded from its events (the source of truth).
    pub async fn load(&self, req_id: &ReqId) -> Result<Option<TransferData>, CoordinatorError> {
        let ctx = self.log.load(req_id).await?;
        Ok(ctx.aggregate.data)
    }

    /// The transfer's context (events folded) for a command, or `NotFound`.
    pub(crate) async fn load_context(&self, req_id: &ReqId) -> Result<Context, CoordinatorError> {
        let ctx = self.log.load(req_id).await?;
        if ctx.aggregate.data.is_none() {
            return Err(CoordinatorError::NotFound);
        }
        Ok(ctx)
    }

    /// Handles one command on the in-memory aggregate and commits its events; returns the
    /// context advanced past them. A competing writer makes the commit fail with `Conflict`.
    pub(crate) async fn execute(
        &self,
        ctx: Context,
        command: TransferCommand,
    ) -> Result<Context, CoordinatorError> {
        self.commit_steps(ctx, command, false).await
    }

    /// Like `execute`, but when the command leads into a state that waits on no outside call
    /// (INIT, SOURCE_DONE), that state's own step (`TransferCommand::call_free_step`: the
    /// announcement of the next call) is handled too and both commands' events go into the
    /// same commit, under the same optimistic-concurrency guard. Either both events are durable
    /// or neither is, so the next call is still announced durably before it is made, and a
    /// happy transfer waits on three event commits instead of five.
    pub(crate) async fn execute_through(
        &self,
        ctx: Context,
        command: TransferCommand,
    ) -> Result<Context, CoordinatorError> {
        self.commit_steps(ctx, command, true).await
    }

    async fn commit_steps(
        &self,
        ctx: Context,
        command: TransferCommand,
        through: bool,
    ) -> Result<Context, CoordinatorError> {
        let (ctx, commit) = self.stage_steps(ctx, command, through).await?;
        let expected = commit.expected_sequence + commit.events.len();
        let current_sequence = self.log.append(commit).await?;
        appended_where_decided(&ctx, expected, current_sequence);
        // No read-model write here: the projector (projections::Projector) applies every
        // committed event exactly once, in a commit-safe order, from the log itself.
        Ok(Context {
            current_sequence,
            ..ctx
        })
    }

    /// Commits many transfers' steps in one append (`TransferLog::append_many`: one durable
    /// write for all, each commit all-or-nothing with its own version check): one answer per
    /// step in order, each what `execute` (or, with its `through`, `execute_through`) would
    /// have answered. A step refused before the append stays refused alone.
    pub(crate) async fn commit_many(
        &self,
        steps: Vec<(Context, TransferCommand, bool)>,
    ) -> Vec<Result<Context, CoordinatorError>> {
        self.commit_staged(steps, false).await
    }

    /// `commit_many`, but a step announcing a FUNDING call carries the call when the log can
    /// make it with its commit (ADR 0024, `funded.rs`).
    pub(crate) async fn commit_many_funded(
        &self,
        steps: Vec<(Context, TransferCommand, bool)>,
    ) -> Vec<Result<Context, CoordinatorError>> {
        self.commit_staged(steps, true).await
    }

    async fn commit_staged(
        &self,
        steps: Vec<(Context, TransferCommand, bool)>,
        funded: bool,
    ) -> Vec<Result<Context, CoordinatorError>> {
        let mut staged = Vec::with_capacity(steps.len());
        let mut refused = Vec::with_capacity(steps.len());
        for (ctx, command, through) in steps {
            match self.stage_steps(ctx, command, through).await {
                Ok(step) => {
                    staged.push(step);
                    refused.push(None);
                }
                Err(e) => refused.push(Some(e)),
            }
        }
        let mut committed = match funded {
            true => self.append_staged_funded(staged).await,
            false => self.append_staged(staged).await,
        }
        .into_iter();
        refused
            .into_iter()
            .map(|refused| match refused {
                Some(e) => Err(e),
                None => committed
                    .next()
                    .unwrap_or_else(|| Err(CoordinatorError::invariant("the log lost an answer"))),
            })
            .collect()
    }

    /// Appends staged steps (`stage_steps`' answers) in one `append_many`: one answer per step.
    pub(crate) async fn append_staged(
        &self,
        staged: Vec<(Context, Commit)>,
    ) -> Vec<Result<Context, CoordinatorError>> {
        if staged.is_empty() {
            return Vec::new();
        }
        let (contexts, commits): (Vec<Context>, Vec<Commit>) = staged.into_iter().unzip();
        let sent = commits.len();
        let expected: Vec<usize> = commits
            .iter()
            .map(|c| c.expected_sequence + c.events.len())
            .collect();
        let appended = self.log.append_many(commits).await;
        // `append_many`'s contract: one answer per commit, in order. A missing one would pair
        // every later step with another transfer's sequence.
        invariant!(
            appended.len() == sent,
            "the log answered {} of {sent} commits",
            appended.len()
        );
        contexts
            .into_iter()
            .zip(expected)
            .zip(appended)
            .map(|((ctx, expected), appended)| {
                let current_sequence = appended?;
                appended_where_decided(&ctx, expected, current_sequence);
                Ok(Context {
                    current_sequence,
                    ..ctx
                })
            })
            .collect()
    }

    /// Handles `command` (and, with `through`, the call-free step it leads to) on the in-memory
    /// aggregate: the context advanced past its events (its sequence still the one they were
    /// decided on) and the commit that makes them durable.
    pub(crate) async fn stage_steps(
        &self,
        mut ctx: Context,
        command: TransferCommand,
        through: bool,
    ) -> Result<(Context, Commit), CoordinatorError> {
        let sink = EventSink::default();
        ctx.aggregate
            .handle(command, &(), &sink)
            .await
            .map_err(CoordinatorError::Transition)?;
        if through {
            // `handle` folded the first command's events into the aggregate (the sink applies
            // them), so the follow-up is decided on the state they lead to.
            let next = ctx
                .aggregate
                .state()
                .and_then(|state| TransferCommand::call_free_step(state, self.clock.now()));
            if let Some(next) = next {
                ctx.aggregate
                    .handle(next, &(), &sink)
                    .await
                    .map_err(CoordinatorError::Transition)?;
            }
        }
        let events = sink.collect().await;
        // Postconditions of a step: it says something, and the in-memory aggregate is where its
        // last event leads (the sink folded every event), so the next step is decided on the
        // state the log will hold.
        invariant!(
            !events.is_empty()
                && ctx.aggregate.state() == events.last().map(|e| e.resulting_state()),
            "{} staged {} events leading to {:?}, the aggregate is at {:?}",
            ctx.aggregate_id,
            events.len(),
            events.last().map(|e| e.resulting_state()),
            ctx.aggregate.state()
        );
        let aggregate = ctx.aggregate.clone();
        let aggregate_id = ctx.aggregate_id.clone();
        let commit = Commit {
            aggregate_id: aggregate_id.clone(),
            expected_sequence: ctx.current_sequence,
            events,
            // The owner travels with every event, so the feed can serve one user's stream.
            owner: aggregate.data.as_ref().map(|d| d.user_id),
        };
        let staged = Context {
            aggregate_id,
            aggregate,
            current_sequence: ctx.current_sequence,
            current_snapshot: None,
        };
        Ok((staged, commit))
    }

    pub(crate) fn port(&self, account: AccountType) -> &dyn AccountPort {
        match account {
            AccountType::Funding => self.funding.as_ref(),
            AccountType::Spot => self.spot.as_ref(),
            AccountType::Future | AccountType::Margin => {
                unreachable!("unsupported account types are refused at creation")
            }
        }
    }
}

/// Postcondition of an append: the log put the commit right after the sequence it was decided
/// on (`expected`: that sequence plus its events). Any other answer means the version check did
/// not hold, and a second writer's events are interleaved with this one's.
fn appended_where_decided(ctx: &Context, expected: usize, current_sequence: usize) {
    invariant!(
        current_sequence == expected,
        "{}: appended up to sequence {current_sequence}, decided for {expected}",
        ctx.aggregate_id
    );
}
