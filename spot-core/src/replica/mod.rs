//! spot-core replicated (docs/adr/0020-high-availability.md §3): three replicas per cell, one
//! leader chosen by a lease in etcd (`lease.rs`), every batch acknowledged only once two
//! replicas hold it fsynced.
//!
//! - `lease.rs`: the leader key in etcd, its lease and epoch (etcd decides; we only ask);
//! - `history.rs`: the promised epoch and the epoch history on disk, and how two logs compare;
//! - `wire.rs`: the replication protocol's messages;
//! - `leader.rs`: taking over and shipping batches (the group commit's `Replicate`);
//! - `follower.rs`: the replication listener, and rebuilding from the leader's files;
//! - `rules.rs`: the three decisions that keep the rule, shared with the simulation.
//!
//! The engine thread's side is in `wal/follow.rs` (following) and `wal/commit.rs` (leading).

pub mod follower;
pub mod history;
pub mod leader;
pub mod lease;
pub mod rules;
pub mod wire;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::journal::SharedCatalog;
use crate::wal::{FollowJob, Progress};
use leader::{Shipper, TakeOver};
use lease::{Etcd, LeaderInfo};

/// The replica options of `spot-core` (all absent: a single engine, as before).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ReplicaArgs {
    /// This replica's name within its cell (e.g. `r1`); turns replication on, with `--etcd`,
    /// `--repl-listen` and `--peers`.
    #[arg(long, env = "SPOT_CORE_REPLICA")]
    pub replica: Option<String>,
    /// The etcd cluster holding the leader's lease: `host:port` list, comma-separated.
    #[arg(long, env = "SPOT_CORE_ETCD")]
    pub etcd: Option<String>,
    /// Address the replication listener binds (leaders connect here).
    #[arg(long, env = "SPOT_CORE_REPL_LISTEN")]
    pub repl_listen: Option<String>,
    /// The other replicas: `name=host:port` of their replication listeners, comma-separated.
    #[arg(long, env = "SPOT_CORE_PEERS")]
    pub peers: Option<String>,
    /// The client address clients are told to use for this replica when it leads (default: the
    /// bound `--listen` address).
    #[arg(long, env = "SPOT_CORE_ADVERTISE")]
    pub advertise: Option<String>,
    /// The leader lease's time to live, seconds.
    #[arg(long, env = "SPOT_CORE_LEASE_TTL", default_value_t = 3)]
    pub lease_ttl: u64,
    /// How long a leader waits for a follower's acknowledgement before it steps down, ms.
    #[arg(long, env = "SPOT_CORE_ACK_TIMEOUT_MS", default_value_t = 3000)]
    pub ack_timeout_ms: u64,
}

/// Another replica of the cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub repl: String,
}

/// Parses `name=host:port,...`.
pub fn parse_peers(text: &str) -> anyhow::Result<Vec<Peer>> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (name, repl) = s
                .split_once('=')
                .with_context(|| format!("a peer must be name=host:port, not {s:?}"))?;
            Ok(Peer {
                name: name.to_owned(),
                repl: repl.to_owned(),
            })
        })
        .collect()
}

/// What this replica is now, as the client protocol's `hello` tells it.
#[derive(Debug, Default)]
pub struct Role {
    leading: AtomicBool,
    epoch: AtomicU64,
    leader: Mutex<Option<String>>,
}

impl Role {
    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    /// The epoch this replica leads, or the highest it has promised or seen.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The leader's client address, when known (told to clients that reach a follower).
    pub fn leader(&self) -> Option<String> {
        self.leader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn follow(&self, epoch: u64, leader: Option<String>) {
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        if leader.is_some() {
            *self.leader.lock().unwrap_or_else(|e| e.into_inner()) = leader;
        }
    }

    fn lead(&self, epoch: u64, me: String) {
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        *self.leader.lock().unwrap_or_else(|e| e.into_inner()) = Some(me);
        self.leading.store(true, Ordering::Release);
    }
}

/// Everything the replication tasks share.
#[derive(Debug)]
pub struct ReplicaCtx {
    pub name: String,
    pub peers: Vec<Peer>,
    pub token: Option<String>,
    pub cell: Option<u16>,
    pub data_dir: PathBuf,
    pub catalog: SharedCatalog,
    pub progress: Arc<Progress>,
    pub ack_timeout: Duration,
    pub lease_ttl: u64,
    pub role: Arc<Role>,
    pub etcd: Etcd,
    pub info: LeaderInfo,
    jobs: Mutex<Option<std::sync::mpsc::SyncSender<FollowJob>>>,
    pub shipper: Mutex<Option<Arc<Shipper>>>,
    /// The lease this replica leads under (0: none).
    pub lease: std::sync::atomic::AtomicI64,
}

impl ReplicaCtx {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        args: &ReplicaArgs,
        name: String,
        token: Option<String>,
        cell: Option<u16>,
        data_dir: PathBuf,
        catalog: SharedCatalog,
        progress: Arc<Progress>,
        jobs: std::sync::mpsc::SyncSender<FollowJob>,
        info: LeaderInfo,
    ) -> anyhow::Result<ReplicaCtx> {
        let etcd = Etcd::new(
            args.etcd.as_deref().context("--replica needs --etcd")?,
            cell.unwrap_or(0),
        )?;
        let peers = parse_peers(args.peers.as_deref().context("--replica needs --peers")?)?;
        anyhow::ensure!(
            peers.len() == 2,
            "a cell runs three spot-core replicas: --peers must name the other two"
        );
        Ok(ReplicaCtx {
            name,
            peers,
            token,
            cell,
            data_dir,
            catalog,
            progress,
            ack_timeout: Duration::from_millis(args.ack_timeout_ms),
            lease_ttl: args.lease_ttl,
            role: Arc::new(Role::default()),
            etcd,
            info,
            jobs: Mutex::new(Some(jobs)),
            shipper: Mutex::new(None),
            lease: std::sync::atomic::AtomicI64::new(0),
        })
    }

    /// The engine thread's follow queue, while it follows.
    pub fn follow_jobs(&self) -> Option<std::sync::mpsc::SyncSender<FollowJob>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Before a replica with no promise and no history answers anything: when the cell has had a
/// leader, it lost its data (`WIPED`: no promise, no campaign until it has caught up), and
/// either way it promises the current epoch, so a deposed leader's frames are refused (ADR 0020
/// §3). Waits for etcd: this cannot be decided without it.
pub async fn fence_blank(epochs: &mut history::Epochs, etcd: &Etcd) -> anyhow::Result<()> {
    if !epochs.blank() {
        return Ok(());
    }
    loop {
        let asked = async {
            Ok::<_, anyhow::Error>((etcd.initialized().await?, etcd.fence_epoch().await?))
        };
        match asked.await {
            Ok((initialized, epoch)) => {
                if initialized {
                    tracing::warn!("this replica's data is gone in a cell that had a leader: it waits to be rebuilt");
                    epochs.mark_wiped()?;
                }
                epochs.promise(epoch)?;
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "etcd unreachable; a blank replica waits for it");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Watches the leader key and campaigns when it is free; returns never (a leader that loses its
/// lease or its quorum aborts, and starts again as a follower).
pub async fn run(ctx: Arc<ReplicaCtx>) {
    // A replica that (re)starts first gives a live leader a lease's time to join it; only then
    // does it campaign (a fresh cell's first leader waits that long too).
    let mut rest = Duration::from_secs(ctx.lease_ttl);
    loop {
        tokio::time::sleep(rest).await;
        rest = Duration::from_millis(250);
        match ctx.etcd.leader().await {
            Ok(Some(l)) => {
                if l.info.name != ctx.name {
                    ctx.role.follow(l.epoch, Some(l.info.client));
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "etcd unreachable");
                continue;
            }
        }
        let Some(jobs) = ctx.follow_jobs() else {
            return;
        };
        if ctx.progress.wiped.load(Ordering::Acquire) {
            tracing::warn!("no leader, and this replica lost its data: not campaigning until a leader rebuilds it");
            rest = Duration::from_secs(1);
            continue;
        }
        match campaign(&ctx, &jobs).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "campaign failed"),
        }
    }
}

/// One campaign: the key won, taken over, led (true); or the key lost or given back (false).
async fn campaign(
    ctx: &Arc<ReplicaCtx>,
    jobs: &std::sync::mpsc::SyncSender<FollowJob>,
) -> anyhow::Result<bool> {
    let lease = ctx.etcd.grant(ctx.lease_ttl).await?;
    let Some(epoch) = ctx.etcd.campaign(&ctx.info, lease).await? else {
        let _ = ctx.etcd.revoke(lease).await;
        return Ok(false);
    };
    tracing::info!(epoch, "won the leader key; taking over");
    ctx.lease.store(lease, Ordering::Release);
    // Before anything can be acknowledged: from now on a replica that starts blank knows it lost
    // its data.
    ctx.etcd.mark_initialized().await?;
    let keeper = tokio::spawn(keep_lease(ctx.clone(), lease));
    match leader::take_over(ctx, jobs, epoch).await {
        Ok(()) => {}
        Err(why) => {
            keeper.abort();
            let _ = ctx.etcd.revoke(lease).await;
            let rest = match why {
                TakeOver::NoQuorum => {
                    // Cut off, or alone: let a replica that can reach the others win next.
                    tracing::warn!(epoch, "no other replica promised: not leading");
                    Duration::from_secs(2 * ctx.lease_ttl)
                }
                TakeOver::Diverged => {
                    tracing::warn!(epoch, "this log has a tail the others lack: not leading");
                    Duration::from_secs(3 * ctx.lease_ttl)
                }
                TakeOver::Failed(e) => {
                    tracing::warn!(epoch, error = %format!("{e:#}"), "take-over failed");
                    Duration::from_secs(1)
                }
            };
            tokio::time::sleep(rest).await;
            return Ok(false);
        }
    }
    leader::ask(jobs, |reply| FollowJob::Lead { epoch, reply }).await?;
    ctx.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
    ctx.role.lead(epoch, ctx.info.client.clone());
    tracing::info!(epoch, "leading");
    Ok(true)
}

/// Keeps the lease alive; a leader that cannot (etcd says it is gone, or no renewal for a
/// lease's time) stops at once: another replica may lead already.
async fn keep_lease(ctx: Arc<ReplicaCtx>, lease: i64) {
    let ttl = Duration::from_secs(ctx.lease_ttl);
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(ttl / 3).await;
        match ctx.etcd.keep_alive(lease).await {
            Ok(true) => renewed = Instant::now(),
            Ok(false) => step_down("etcd says the lease is gone"),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "renewing the lease failed");
                if renewed.elapsed() + ttl / 3 >= ttl {
                    step_down("the lease could not be renewed within its time to live");
                }
            }
        }
    }
}

fn step_down(why: &str) -> ! {
    tracing::error!(why, "stepping down");
    eprintln!("spot-core: stepping down: {why}; aborting");
    std::process::abort();
}
