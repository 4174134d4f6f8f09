//! Start-up: how a server is started ([`Serving`]: its background work, HTTP limits and where
//! `/metrics` is served; never part of the handlers' `AppState`), the one place that starts
//! every background task of a serving process and stops them together (zero-to-production's
//! `main`): the projector (read models and feed), the recovery worker, the periodic
//! conservation check, the asset-settings reloader, the hot-table vacuum, the idempotency
//! horizon's advances, the tamper-evident log's follower and checkpoint publisher, and the event
//! relay. No other code starts a long-running task. These tasks
//! run forever; one that ends (a panic) is reported, and [`Tasks::first_exit`] lets the server
//! stop on it. Also the stop signal every long-running command waits for ([`shutdown_signal`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use edge::http_server::HttpLimits;
use futures_util::FutureExt;
use projections::Projector;
use recovery::{ProjectorProbe, RecoveryConfig, RecoveryWorker};
use tokio::task::JoinSet;

use crate::settings::AUDIT_INTERVAL_DEFAULT;
use crate::wiring::Pieces;

/// How often a process re-reads the stored asset settings: the longest another instance keeps
/// accepting transfers of an asset an admin has just suspended.
pub(crate) const ASSET_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The log follower's thread's nice value, above the process's 0: its hashing takes the cores'
/// idle time and yields them to the request path when both want them. Appends never wait for
/// the tree (ADR 0016); `ledger-bench tlog` prints how far behind it was at each run's end.
const FOLLOWER_NICE: i32 = 10;

/// The follower's own pool: one connection reads, one writes a pass's tiles and checkpoint.
const FOLLOWER_CONNECTIONS: u32 = 2;

/// How long the follower's thread waits before connecting again when its database is down.
const FOLLOWER_CONNECT_RETRY: Duration = Duration::from_secs(1);

/// Which background work a serving process runs, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Background {
    /// The recovery worker's configuration; `None` runs no worker (an in-process test server).
    pub recovery: Option<RecoveryConfig>,
    /// Time between periodic conservation checks.
    pub audit_interval: Duration,
    /// The JetStream relay of the feed, when a NATS server is configured (`--nats`).
    pub relay: Option<relay::RelayConfig>,
    /// spot-core's idempotency horizon, advanced periodically; `None` leaves it alone (an
    /// in-process test server).
    pub horizon: Option<application::HorizonConfig>,
    /// The tamper-evident log's follower, when a signing key is configured.
    pub log: Option<tlog_follower::FollowerConfig>,
    /// Where the log's signed checkpoints are published, with a signing key and `--nats`.
    pub checkpoints: Option<relay::checkpoints::CheckpointTarget>,
    /// The database the follower connects to on its own thread ([`follow_the_log`]); `None`
    /// runs it as a task on the server's pool (an in-process server).
    pub log_database: Option<LogDatabase>,
}

/// The database URL and liveness settings of a serving process's (or cell's) pool: the
/// follower's own pool is built from them, the server's kind of pool (failover, liveness, the
/// pooled-transaction check) on the follower's own runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDatabase {
    pub url: String,
    pub liveness: schema::DbLiveness,
}

impl Default for Background {
    fn default() -> Self {
        Self {
            recovery: None,
            audit_interval: AUDIT_INTERVAL_DEFAULT,
            relay: None,
            horizon: None,
            log: None,
            checkpoints: None,
            log_database: None,
        }
    }
}

/// How a server runs: what start-up decides and no handler reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    /// The background work to run while serving.
    pub background: Background,
    /// The HTTP server's timeouts and connection caps.
    pub http: HttpLimits,
    /// Whether `/metrics` is served on the API's own address (in-process servers); the `ledger`
    /// binary serves it on `--metrics-listen` instead unless told `api`.
    pub metrics_on_api: bool,
}

impl Default for Serving {
    /// An in-process server: no recovery worker, no horizon, no relay, the default limits,
    /// `/metrics` on the API's address.
    fn default() -> Self {
        Self {
            background: Background::default(),
            http: HttpLimits::default(),
            metrics_on_api: true,
        }
    }
}

impl Serving {
    /// MON-001's threshold, which `/metrics` reports so the shipped rule compares with the value
    /// the recovery worker's log line uses: the worker's, or the default without one.
    pub fn target_pending_alert_after(&self) -> Duration {
        self.background
            .recovery
            .clone()
            .unwrap_or_default()
            .target_pending_alert_after
    }
}

/// The read models' projector, as the recovery worker watches it.
#[derive(Debug, Clone)]
pub struct ProjectorHealth(pub Projector);

impl ProjectorHealth {
    pub fn new(pool: sqlx::PgPool) -> Self {
        Self(Projector::new(pool))
    }
}

#[async_trait]
impl ProjectorProbe for ProjectorHealth {
    async fn caught_up(
        &self,
        wait_max: Duration,
    ) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.0.catch_up(wait_max).await?)
    }
}

/// The running background tasks. Dropping this stops them all.
#[derive(Debug)]
pub struct Tasks {
    set: JoinSet<&'static str>,
}

/// How long serving waits for the stored asset settings while the database is away.
const STORED_ASSETS_WAIT_MAX: Duration = Duration::from_secs(30);

/// The stored asset settings (an admin's suspensions among them) are read before any request is
/// served. A database restarting at that moment is waited out, as every other caller of the pool
/// does, instead of ending a process that has already announced it is serving (a chaos run with
/// PostgreSQL restarts once caught a restarted `ledger serve` exiting here).
async fn read_stored_assets(assets: &application::AssetSettings) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + STORED_ASSETS_WAIT_MAX;
    loop {
        match assets.reload().await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "stored asset settings unreadable; retrying before serving");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context("read the stored asset settings")),
        }
    }
}

impl Tasks {
    /// Lays the stored asset settings over the file's defaults (before the first request), then
    /// starts every background task `background` names, over the pieces start-up wired.
    pub async fn start(pieces: &Pieces, background: &Background) -> anyhow::Result<Self> {
        let ledger = &pieces.ledger;
        read_stored_assets(ledger.assets()).await?;
        let mut tasks = Self {
            set: JoinSet::new(),
        };
        let pool = &pieces.pool;
        // One projector per process; an advisory lock lets only one write at a time across
        // processes.
        tasks.spawn("projector", Projector::new(pool.clone()).run());
        if let Some(config) = &background.recovery {
            let worker = RecoveryWorker::with_config(
                pieces.coordinator.clone(),
                pool.clone(),
                config.clone(),
            )
            .watching(Arc::new(ProjectorHealth::new(pool.clone())));
            tasks.spawn("recovery worker", worker.run());
        }
        tasks.spawn(
            "conservation check",
            ledger.clone().audit_periodically(background.audit_interval),
        );
        tasks.spawn("asset reloader", reload_assets(ledger.assets().clone()));
        // Under HA: the leader changes this process observes, into the cell's `failovers`.
        if pieces.cluster.pg_ha() || pieces.cluster.spot_replicated() {
            tasks.spawn(
                "failover recorder",
                Arc::clone(&pieces.cluster).record_failovers(),
            );
        }
        tasks.spawn(
            "hot-table vacuum",
            adapters::pg::maintenance::run(pool.clone(), adapters::pg::maintenance::INTERVAL),
        );
        if let Some(config) = background.horizon {
            let horizon = application::Horizon::new(
                ledger.stores().open.clone(),
                Arc::new(pieces.spot.clone()),
                config,
            );
            tasks.spawn("idempotency horizon", horizon.run());
        }
        if let Some(config) = &background.log {
            match &background.log_database {
                Some(database) => tasks.spawn(
                    "tamper-evident log",
                    follow_the_log(database.clone(), config.clone()),
                ),
                None => {
                    let follower = tlog_follower::Follower::new(pool.clone(), config.clone());
                    tasks.spawn("tamper-evident log", follower.run());
                }
            }
        }
        if let Some(target) = &background.checkpoints {
            tracing::info!(stream = %target.stream, subject = %target.subject,
                "the log's checkpoints are published");
            let publish = relay::checkpoints::publish(pool.clone(), target.clone());
            tasks.spawn("checkpoint publisher", publish);
        }
        if let Some(config) = &background.relay {
            tracing::info!(stream = %config.stream, nats = %config.nats_url, "relay starts in-process");
            let stats = Arc::new(relay::RelayStats::default());
            let run = relay::run(pool.clone(), config.clone(), stats, std::future::pending());
            tasks.spawn("event relay", run);
        }
        Ok(tasks)
    }

    fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.set.spawn(async move {
            match AssertUnwindSafe(task).catch_unwind().await {
                Ok(()) => tracing::error!(task = name, "background task stopped"),
                Err(_) => tracing::error!(task = name, "background task panicked"),
            }
            name
        });
    }

    /// Completes when the first task ends (they are meant to run forever), naming it.
    pub async fn first_exit(&mut self) -> &'static str {
        match self.set.join_next().await {
            Some(Ok(name)) => name,
            Some(Err(_)) => "a background task",
            None => std::future::pending().await,
        }
    }

    /// Stops every task and waits until they are gone.
    pub async fn stop(mut self) {
        self.set.shutdown().await;
    }
}

/// Runs the log's follower on a thread of its own at [`FOLLOWER_NICE`], on a current-thread
/// runtime with a pool of its own (a pool's sockets belong to the runtime that opened them, so
/// none is shared with the server's). On the server's runtime the follower's hashing held a
/// worker for whole passes beside the request path (`docs/perf-log.md`, tamper-evident log,
/// fifth stop). The future ends when the follower does (a signing identity that does not match,
/// or a panic), as a task's would; dropped (the tasks stopped), it stops the thread.
async fn follow_the_log(database: LogDatabase, config: tlog_follower::FollowerConfig) {
    let (ended, ending) = tokio::sync::oneshot::channel::<()>();
    let (_stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let started = std::thread::Builder::new()
        .name("tlog-follower".into())
        .spawn(move || {
            let _ended = ended;
            // On Linux a thread id given to setpriority names that one thread.
            if let Err(e) =
                rustix::process::setpriority_process(Some(rustix::thread::gettid()), FOLLOWER_NICE)
            {
                tracing::warn!(error = %e, "the log follower keeps the normal priority");
            }
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "the log follower's runtime did not start");
                    return;
                }
            };
            runtime.block_on(async move {
                let pool = loop {
                    let connect = schema::connect_with(
                        &database.url,
                        FOLLOWER_CONNECTIONS,
                        database.liveness,
                    );
                    tokio::select! {
                        connected = connect => match connected {
                            Ok(pool) => break pool,
                            Err(e) => tracing::warn!(error = %e,
                                "the log follower cannot connect yet; retrying"),
                        },
                        _ = &mut stopped => return,
                    }
                    tokio::select! {
                        () = tokio::time::sleep(FOLLOWER_CONNECT_RETRY) => {}
                        _ = &mut stopped => return,
                    }
                };
                tokio::select! {
                    () = tlog_follower::Follower::new(pool, config).run() => {}
                    _ = stopped => {}
                }
            });
        });
    match started {
        Ok(_) => {
            let _ = ending.await;
        }
        Err(e) => tracing::error!(error = %e, "the log follower's thread did not start"),
    }
}

/// Completes at ctrl-c or SIGTERM: when `ledger up`, `serve` and `relay` begin to stop.
pub(crate) async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only ctrl-c stops the ledger");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Re-reads the stored asset settings every [`ASSET_RELOAD_INTERVAL`]. A failed read keeps the
/// last known settings and is retried at the next tick.
async fn reload_assets(assets: application::AssetSettings) {
    let mut tick = tokio::time::interval(ASSET_RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = assets.reload().await {
            tracing::warn!(error = %e, "asset settings reload failed; keeping the last ones");
        }
    }
}
