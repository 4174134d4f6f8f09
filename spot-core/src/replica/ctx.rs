//! What a replica's tasks share (docs/adr/0020-high-availability.md §3): its options, its
//! peers, its role as the client protocol's `hello` tells it, and the context the campaign,
//! the leader's shipping and the replication listener work in.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use super::lease::{Etcd, LeaderInfo};
use crate::journal::SharedCatalog;
use crate::wal::{FollowJob, Progress};

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

    pub(super) fn follow(&self, epoch: u64, leader: Option<String>) {
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        if leader.is_some() {
            *self.leader.lock().unwrap_or_else(|e| e.into_inner()) = leader;
        }
    }

    pub(super) fn lead(&self, epoch: u64, me: String) {
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
            lease: std::sync::atomic::AtomicI64::new(0),
        })
    }

    /// It leads now: nothing is sent to the follow queue any more.
    pub fn stop_following(&self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// The engine thread's follow queue, while it follows.
    pub fn follow_jobs(&self) -> Option<std::sync::mpsc::SyncSender<FollowJob>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
