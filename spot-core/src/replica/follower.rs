//! A replica's replication listener: what a leader (or a replica taking over) asks of it.
//! Promises, joins and appends go to the engine thread (`wal/follow.rs`) in the order they
//! arrive; answers go back in the same order, an append's once it is fsynced. A `Fetch` is
//! served from this replica's own segments; a `Rebuild` receives the leader's files into
//! `<data-dir>.rebuild` and restarts this process on them (`swap_in_rebuild` at start).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::ctx::ReplicaCtx;
use super::history::{write_durably, EpochStart, EPOCHS_FILE, EPOCH_FILE};
use super::leader::read_frames;
use super::wire::{self, Message};
use crate::wal::{FollowJob, JoinAnswer};

/// Marks a complete rebuild directory.
const COMPLETE: &str = "COMPLETE";

/// Accepts leaders' connections forever.
pub async fn listen(listener: TcpListener, ctx: Arc<ReplicaCtx>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &ctx).await {
                        tracing::debug!(%peer, error = %format!("{e:#}"), "replication connection ended");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

enum Reply {
    Ready(Message, Vec<u8>),
    Ack(oneshot::Receiver<Result<(u64, u64), String>>),
}

async fn serve(stream: TcpStream, ctx: &ReplicaCtx) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let _ = liveness::TcpLiveness::DEFAULT.apply(&stream);
    let (mut rd, wr) = stream.into_split();
    match wire::read(&mut rd).await? {
        Some((Message::Hello { token, cell }, _)) => {
            let token_ok = ctx.token.as_deref().is_none_or(|t| t == token);
            let cell_ok = ctx.cell.is_none() || cell.is_none() || ctx.cell == cell;
            if !token_ok || !cell_ok {
                bail!("a replication hello with the wrong token or cell");
            }
        }
        other => bail!("the first message must be a hello, not {other:?}"),
    }
    let (tx, rx) = mpsc::channel::<Reply>(4096);
    let writer = tokio::spawn(write_replies(wr, rx));
    let result = read_requests(&mut rd, ctx, &tx).await;
    drop(tx);
    let _ = writer.await;
    result
}

// long: one match over the replication messages a follower answers, each arm a request and its reply, in the order they arrive.
async fn read_requests(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    ctx: &ReplicaCtx,
    tx: &mpsc::Sender<Reply>,
) -> anyhow::Result<()> {
    let Some(jobs) = ctx.follow_jobs() else {
        let refused = Message::Refused {
            reason: "this replica leads".into(),
        };
        tx.send(Reply::Ready(refused, Vec::new())).await?;
        return Ok(());
    };
    while let Some((message, body)) = wire::read(rd).await? {
        let reply = match message {
            Message::Promise { epoch } => {
                match super::leader::ask(&jobs, |reply| FollowJob::Promise { epoch, reply }).await {
                    Ok(position) => {
                        ctx.role.follow(epoch, None);
                        Reply::Ready(Message::Position { position }, Vec::new())
                    }
                    Err(e) => refused(e),
                }
            }
            Message::Join {
                epoch,
                start,
                leader,
            } => {
                let answer = super::leader::ask(&jobs, |reply| FollowJob::Join {
                    epoch,
                    start,
                    leader,
                    reply,
                })
                .await;
                match answer {
                    Ok((JoinAnswer::From(last_seq), epoch_line)) => {
                        ctx.role.follow(epoch, None);
                        Reply::Ready(
                            Message::Joined {
                                last_seq,
                                epoch: epoch_line,
                            },
                            Vec::new(),
                        )
                    }
                    Ok((JoinAnswer::Rebuild, _)) => {
                        tx.send(Reply::Ready(
                            Message::Rebuild {
                                epoch,
                                history: Vec::new(),
                            },
                            Vec::new(),
                        ))
                        .await?;
                        let Some((Message::Rebuild { epoch, history }, _)) = wire::read(rd).await?
                        else {
                            bail!("a rebuild must begin with the leader's Rebuild");
                        };
                        return receive_rebuild(rd, ctx, epoch, history).await;
                    }
                    Err(e) => refused(e),
                }
            }
            Message::Append { epoch, first, last } => {
                let (reply, rx) = oneshot::channel();
                let job = FollowJob::Append {
                    epoch,
                    first,
                    last,
                    frames: body,
                    reply,
                };
                // At once when the queue has room (the usual case: no thread hand-off on the
                // path every batch takes); from a blocking thread when it is full.
                match jobs.try_send(job) {
                    Ok(()) => {}
                    Err(std::sync::mpsc::TrySendError::Full(job)) => {
                        let jobs = jobs.clone();
                        tokio::task::spawn_blocking(move || jobs.send(job))
                            .await?
                            .map_err(|_| anyhow::anyhow!("the engine thread no longer follows"))?;
                    }
                    Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
                        anyhow::bail!("the engine thread no longer follows")
                    }
                }
                Reply::Ack(rx)
            }
            Message::Fetch { after, upto } => {
                let upto = upto.min(ctx.progress.written.load(Ordering::Acquire));
                let mut sent = after;
                while sent < upto {
                    let (first, last, frames) = read_frames(&ctx.catalog, sent, upto).await?;
                    tx.send(Reply::Ready(Message::Frames { first, last }, frames))
                        .await?;
                    sent = last;
                }
                Reply::Ready(Message::Done, Vec::new())
            }
            // A leader whose log no longer reaches this replica's (compacted) sends its files.
            Message::Rebuild { epoch, history } => {
                return receive_rebuild(rd, ctx, epoch, history).await;
            }
            other => refused(format!("unexpected {other:?}")),
        };
        let stop = matches!(&reply, Reply::Ready(Message::Refused { .. }, _));
        tx.send(reply).await?;
        if stop {
            return Ok(());
        }
    }
    Ok(())
}

fn refused(e: impl std::fmt::Display) -> Reply {
    Reply::Ready(
        Message::Refused {
            reason: e.to_string(),
        },
        Vec::new(),
    )
}

async fn write_replies(
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::Receiver<Reply>,
) -> anyhow::Result<()> {
    while let Some(reply) = rx.recv().await {
        let (message, body) = match reply {
            Reply::Ready(m, b) => (m, b),
            Reply::Ack(ack) => match ack.await {
                Ok(Ok((seq, epoch))) => (Message::Ack { seq, epoch }, Vec::new()),
                Ok(Err(reason)) => (Message::Refused { reason }, Vec::new()),
                Err(_) => bail!("the engine thread dropped an append"),
            },
        };
        let stop = matches!(message, Message::Refused { .. });
        wire::write(&mut wr, &message, &body).await?;
        if stop {
            break;
        }
    }
    let _ = wr.shutdown().await;
    Ok(())
}

/// The directory a rebuild is received into.
pub fn rebuild_dir(data_dir: &Path) -> PathBuf {
    let mut name = data_dir.as_os_str().to_owned();
    name.push(".rebuild");
    PathBuf::from(name)
}

/// Receives the leader's files, then restarts this process on them.
async fn receive_rebuild(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    ctx: &ReplicaCtx,
    epoch: u64,
    history: Vec<EpochStart>,
) -> anyhow::Result<()> {
    let dir = rebuild_dir(&ctx.data_dir);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    loop {
        match wire::read(rd)
            .await?
            .context("the leader closed the rebuild")?
        {
            (Message::File { name }, bytes) => {
                anyhow::ensure!(
                    !name.contains('/') && !name.starts_with('.'),
                    "a file name {name:?}"
                );
                let mut f = tokio::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(&name))
                    .await?;
                f.write_all(&bytes).await?;
                f.sync_all().await?;
            }
            (Message::Done, _) => break,
            (other, _) => bail!("unexpected {other:?} in a rebuild"),
        }
    }
    write_durably(&dir, EPOCH_FILE, format!("{epoch}\n").as_bytes())?;
    let lines: String = history
        .iter()
        .map(|EpochStart { epoch, start }| format!("{epoch} {start}\n"))
        .collect();
    write_durably(&dir, EPOCHS_FILE, lines.as_bytes())?;
    write_durably(&dir, COMPLETE, b"")?;
    tracing::warn!(dir = %dir.display(), "rebuilt from the leader's files; restarting on them");
    restart_self()
}

/// Replaces this process with a new one of the same command line (the data directory's lock
/// and every socket close with it).
fn restart_self() -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .exec();
    bail!("restarting after a rebuild: {err}")
}

/// At start: a complete rebuild directory replaces the data directory (the old one is removed);
/// an incomplete one is discarded.
pub fn swap_in_rebuild(data_dir: &Path) -> anyhow::Result<()> {
    let dir = rebuild_dir(data_dir);
    if !dir.exists() {
        return Ok(());
    }
    if !dir.join(COMPLETE).exists() {
        std::fs::remove_dir_all(&dir)?;
        return Ok(());
    }
    // A promise of a newer epoch made while the files came (to a new leader, on another
    // connection) outranks the leader that sent them: its files are not taken, and the new
    // leader rebuilds this replica itself (found by ledger-sim --replication, seed 197).
    let promised = |d: &Path| -> u64 {
        std::fs::read_to_string(d.join(EPOCH_FILE))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    if promised(data_dir) > promised(&dir) {
        tracing::warn!(
            promised = promised(data_dir),
            sender = promised(&dir),
            "a rebuild from a leader older than this replica's promise is discarded"
        );
        std::fs::remove_dir_all(&dir)?;
        return Ok(());
    }
    let mut old = data_dir.as_os_str().to_owned();
    old.push(".old");
    let old = PathBuf::from(old);
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    if data_dir.exists() {
        std::fs::rename(data_dir, &old)?;
    }
    std::fs::remove_file(dir.join(COMPLETE))?;
    std::fs::rename(&dir, data_dir)?;
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    tracing::info!(dir = %data_dir.display(), "a rebuilt data directory swapped in");
    Ok(())
}
