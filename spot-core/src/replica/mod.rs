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

pub mod ctx;
pub mod follower;
pub mod history;
pub mod leader;
pub mod lease;
pub mod rules;
pub mod takeover;
pub mod wire;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ctx::{parse_peers, Peer, ReplicaArgs, ReplicaCtx, Role};

use crate::wal::FollowJob;
use lease::Etcd;
use takeover::TakeOver;

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
    match takeover::take_over(ctx, jobs, epoch).await {
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
    ctx.stop_following();
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
