//! Taking over as leader (docs/adr/0020-high-availability.md §3, steps 1 and 2): promises from
//! a quorum for the new epoch, and the most advanced log among them adopted (fetched from the
//! replica that holds it). Step 3, leading, is `leader.rs`'s shipping.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use tokio::net::TcpStream;

use super::ctx::{Peer, ReplicaCtx};
use super::history::Position;
use super::leader::{ask, connect};
use super::rules::Adopt;
use super::wire::{self, Message};
use crate::wal::FollowJob;

/// Why a take-over did not end in leading.
#[derive(Debug)]
pub enum TakeOver {
    /// Fewer than two replicas (this one included) promised.
    NoQuorum,
    /// This replica's log has a tail the most advanced one lacks: it must not lead.
    Diverged,
    Failed(anyhow::Error),
}

/// Steps 1 and 2 of ADR 0020 §3 for `epoch`: promises from a quorum, the most advanced log
/// adopted. Step 3 (`FollowJob::Lead`) is the caller's.
// long: the take-over's steps in order (promise, gather, choose, fetch) as ADR 0020 §3 lists them.
pub async fn take_over(
    ctx: &Arc<ReplicaCtx>,
    jobs: &std::sync::mpsc::SyncSender<FollowJob>,
    epoch: u64,
) -> Result<(), TakeOver> {
    let mine = ask(jobs, |reply| FollowJob::Promise { epoch, reply })
        .await
        .map_err(TakeOver::Failed)?;
    // Promises come at once from a replica that can answer: one that does not within a second is
    // gone or cut off, and waiting longer only keeps the others from campaigning. Asked of all
    // at once, so one that is cut off costs no other's time.
    let wait = ctx.ack_timeout.min(Duration::from_secs(1));
    let mut asking: futures_util::stream::FuturesUnordered<_> = ctx
        .peers
        .iter()
        .map(|peer| async move {
            let answer = tokio::time::timeout(wait, promise_of(peer, ctx, epoch)).await;
            (peer, answer)
        })
        .collect();
    // One promise makes a quorum; the others are waited for a moment only (a more advanced log
    // among them spares a rebuild later), never for a cut-off replica's timeout.
    let mut promised = Vec::new();
    let mut until: Option<tokio::time::Instant> = None;
    loop {
        let next = match until {
            None => futures_util::StreamExt::next(&mut asking).await,
            Some(t) => {
                match tokio::time::timeout_at(t, futures_util::StreamExt::next(&mut asking)).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            }
        };
        let Some((peer, answer)) = next else { break };
        match answer {
            Ok(Ok((stream, position))) => {
                promised.push((stream, position));
                until.get_or_insert(tokio::time::Instant::now() + Duration::from_millis(100));
            }
            Ok(Err(e)) => {
                tracing::warn!(peer = %peer.name, error = %format!("{e:#}"), "no promise")
            }
            Err(_) => tracing::warn!(peer = %peer.name, "no promise in time"),
        }
    }
    if promised.is_empty() {
        return Err(TakeOver::NoQuorum);
    }
    let best = promised
        .iter_mut()
        .max_by(|a, b| (a.1.last_epoch(), a.1.last_seq).cmp(&(b.1.last_epoch(), b.1.last_seq)))
        .expect("one promise at least");
    let (after, upto) = match super::rules::adopt(&mine, &best.1) {
        Adopt::Lead => return Ok(()),
        Adopt::Diverged => return Err(TakeOver::Diverged),
        Adopt::Fetch { after, upto } => (after, upto),
    };
    let stream = &mut best.0;
    let fetch = Message::Fetch { after, upto };
    wire::write(stream, &fetch, &[])
        .await
        .map_err(|e| TakeOver::Failed(e.into()))?;
    loop {
        match wire::read(stream).await {
            Ok(Some((Message::Frames { first, last }, frames))) => {
                ask(jobs, |reply| FollowJob::Append {
                    epoch,
                    first,
                    last,
                    frames,
                    reply,
                })
                .await
                .map_err(TakeOver::Failed)?;
            }
            Ok(Some((Message::Done, _))) => return Ok(()),
            other => {
                return Err(TakeOver::Failed(anyhow::anyhow!(
                    "fetching the most advanced log answered {other:?}"
                )))
            }
        }
    }
}

async fn promise_of(
    peer: &Peer,
    ctx: &ReplicaCtx,
    epoch: u64,
) -> anyhow::Result<(TcpStream, Position)> {
    let mut stream = connect(peer, ctx).await?;
    wire::write(&mut stream, &Message::Promise { epoch }, &[]).await?;
    match wire::read(&mut stream).await? {
        Some((Message::Position { position }, _)) => Ok((stream, position)),
        other => bail!("promise answered {other:?}"),
    }
}
