//! A replica that leads (docs/adr/0020-high-availability.md §3), once it took over: shipping every batch to
//! both followers and counting their acknowledgements (`Shipper`, the group commit's
//! `Replicate`). A follower that connects from behind is streamed what it lacks from the
//! leader's segments, then the live batches; one whose log is not a prefix, or whose missing
//! records were compacted, is sent the leader's files to rebuild from. The take-over itself
//! (promises, the most advanced log adopted) is `takeover.rs`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::ctx::{Peer, ReplicaCtx};
use super::history::Position;
use super::wire::{self, Message};
use crate::invariant;
use crate::journal::{read_journal, SharedCatalog};
use crate::protocol::Response;
use crate::storage::encode_record;
use crate::wal::{FollowJob, Replicate};

/// One batch as shipped: shared by every follower's queue, copied once.
#[derive(Debug)]
pub struct Shipment {
    first: u64,
    last: u64,
    frames: Vec<u8>,
}

#[derive(Debug)]
struct PeerLink {
    connected: AtomicBool,
    tx: mpsc::UnboundedSender<Arc<Shipment>>,
}

/// The leader's side of replication: what the group commit calls.
#[derive(Debug)]
pub struct Shipper {
    pub epoch: u64,
    pub start: u64,
    history: Position,
    links: Vec<PeerLink>,
    /// The followers' names, in `links`' order.
    names: Vec<String>,
    /// Each follower's last acknowledged seq and the epoch its history ended with then.
    acks: Mutex<HashMap<String, (u64, u64)>>,
    acked: Condvar,
    written: AtomicU64,
    ack_timeout: Duration,
    ctx: Arc<ReplicaCtx>,
}

impl Shipper {
    fn record_ack(&self, name: &str, seq: u64, epoch: u64) {
        let mut acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        acks.insert(name.to_owned(), (seq, epoch));
        self.acked.notify_all();
    }

    /// The followers acknowledging this epoch, and how far (for status and alerts).
    pub fn acknowledging(&self) -> Vec<(String, u64)> {
        let acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        acks.iter()
            .filter(|(_, (_, e))| *e == self.epoch)
            .map(|(n, (s, _))| (n.clone(), *s))
            .collect()
    }

    fn position(&self) -> Position {
        Position {
            history: self.history.history.clone(),
            last_seq: self.written.load(Ordering::Acquire),
        }
    }
}

impl Replicate for Shipper {
    fn ship(&self, first: u64, last: u64, frames: &[u8]) {
        // A batch is shipped whole, after the leader's write of it (`written`) and before its
        // sync: seqs `first..=last` of at least one frame, the last the one written. A follower
        // refuses anything else (`wal/follow.rs`), and would stop following.
        invariant!(
            first >= 1
                && first <= last
                && !frames.is_empty()
                && self.written.load(Ordering::Acquire) == last,
            "shipping {first}..={last} ({} bytes) with {} written",
            frames.len(),
            self.written.load(Ordering::Acquire)
        );
        let shipment = Arc::new(Shipment {
            first,
            last,
            frames: frames.to_vec(),
        });
        for link in &self.links {
            if link.connected.load(Ordering::Acquire) {
                let _ = link.tx.send(shipment.clone());
            }
        }
    }

    fn wait_acked(&self, last: u64) -> bool {
        let deadline = Instant::now() + self.ack_timeout;
        let mut acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if super::rules::may_acknowledge(acks.values().copied(), last, self.epoch) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            acks = self
                .acked
                .wait_timeout(acks, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn written(&self, last: u64) {
        self.written.store(last, Ordering::Release);
    }

    fn step_down(&self) {
        let lease = self.ctx.lease.load(Ordering::Acquire);
        if lease == 0 {
            return;
        }
        let Ok(etcd) = self.ctx.etcd.fresh() else {
            return;
        };
        // The engine thread is not a runtime's: revoke on a thread of its own, at most 1 s.
        let revoked = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            // The timeout is made inside the runtime: its timer needs the runtime's driver.
            runtime
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(1), etcd.revoke(lease)).await
                })
                .ok()
        })
        .join();
        let revoked = revoked.ok().flatten().is_some_and(|r| r.is_ok());
        eprintln!("spot-core: leadership given back (lease {lease} revoked: {revoked})");
    }

    fn status(&self, last_seq: u64) -> crate::protocol::ReplicationStatus {
        let acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        let followers: Vec<crate::protocol::FollowerStatus> = self
            .names
            .iter()
            .map(|name| {
                let acked = match acks.get(name) {
                    Some(&(seq, epoch)) if epoch == self.epoch => seq,
                    _ => 0,
                };
                crate::protocol::FollowerStatus {
                    name: name.clone(),
                    acked_seq: acked,
                    lag: last_seq.saturating_sub(acked),
                }
            })
            .collect();
        // Within one batch of the leader: every record it holds, or all but the batch in flight.
        let caught_up = acks
            .values()
            .filter(|&&(seq, epoch)| {
                epoch == self.epoch && last_seq.saturating_sub(seq) <= crate::wal::MAX_BATCH as u64
            })
            .count() as u32;
        crate::protocol::ReplicationStatus {
            epoch: self.epoch,
            acknowledging: 1 + caught_up,
            followers,
        }
    }
}

/// Builds the shipper and starts one task per follower on `runtime`.
pub fn start_shipping(
    ctx: Arc<ReplicaCtx>,
    runtime: tokio::runtime::Handle,
    epoch: u64,
    start: u64,
    history: Position,
) -> Arc<Shipper> {
    let mut links = Vec::new();
    let mut receivers = Vec::new();
    for peer in &ctx.peers {
        let (tx, rx) = mpsc::unbounded_channel();
        links.push(PeerLink {
            connected: AtomicBool::new(false),
            tx,
        });
        receivers.push((peer.clone(), rx));
    }
    let shipper = Arc::new(Shipper {
        names: ctx.peers.iter().map(|p| p.name.clone()).collect(),
        epoch,
        start,
        written: AtomicU64::new(history.last_seq),
        history,
        links,
        acks: Mutex::new(HashMap::new()),
        acked: Condvar::new(),
        ack_timeout: ctx.ack_timeout,
        ctx: ctx.clone(),
    });
    for (i, (peer, rx)) in receivers.into_iter().enumerate() {
        let shipper = shipper.clone();
        let ctx = ctx.clone();
        runtime.spawn(async move { follow_peer(shipper, i, peer, rx, ctx).await });
    }
    shipper
}

/// Keeps one follower in step, reconnecting forever.
async fn follow_peer(
    shipper: Arc<Shipper>,
    index: usize,
    peer: Peer,
    mut rx: mpsc::UnboundedReceiver<Arc<Shipment>>,
    ctx: Arc<ReplicaCtx>,
) {
    loop {
        let result = session(&shipper, index, &peer, &mut rx, &ctx).await;
        shipper.links[index]
            .connected
            .store(false, Ordering::Release);
        while rx.try_recv().is_ok() {}
        if let Err(e) = result {
            tracing::warn!(peer = %peer.name, error = %format!("{e:#}"), "follower session ended");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Connects to `peer`'s replication address and says hello.
pub async fn connect(peer: &Peer, ctx: &ReplicaCtx) -> anyhow::Result<TcpStream> {
    let mut stream = tokio::time::timeout(Duration::from_secs(1), connect_from(peer, ctx))
        .await
        .context("connect timed out")??;
    stream.set_nodelay(true)?;
    let _ = liveness::TcpLiveness::DEFAULT.apply(&stream);
    wire::write(
        &mut stream,
        &Message::Hello {
            token: ctx.token.clone().unwrap_or_default(),
            cell: ctx.cell,
        },
        &[],
    )
    .await?;
    Ok(stream)
}

/// Connects from this replica's own replication address (its host, any port), so that what
/// the network sees of a replica is one address: a partition can cut exactly one machine.
async fn connect_from(peer: &Peer, ctx: &ReplicaCtx) -> anyhow::Result<TcpStream> {
    let to = tokio::net::lookup_host(&peer.repl)
        .await?
        .next()
        .with_context(|| format!("{} resolves to nothing", peer.repl))?;
    let local: Option<std::net::SocketAddr> = ctx.info.repl.parse().ok();
    let socket = if to.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(local) = local.filter(|l| !l.ip().is_unspecified() && l.is_ipv4() == to.is_ipv4()) {
        socket.bind(std::net::SocketAddr::new(local.ip(), 0))?;
    }
    Ok(socket.connect(to).await?)
}

// long: one follower's session in the order it happens: join, rebuild or stream, the acknowledgements read beside it; splitting it would pass its state around.
async fn session(
    shipper: &Arc<Shipper>,
    index: usize,
    peer: &Peer,
    rx: &mut mpsc::UnboundedReceiver<Arc<Shipment>>,
    ctx: &Arc<ReplicaCtx>,
) -> anyhow::Result<()> {
    let mut stream = connect(peer, ctx).await?;
    let join = Message::Join {
        epoch: shipper.epoch,
        start: shipper.start,
        leader: shipper.position(),
    };
    wire::write(&mut stream, &join, &[]).await?;
    let mut sent = match wire::read(&mut stream).await? {
        Some((Message::Joined { last_seq, .. }, _))
            if crate::journal::lock(&ctx.catalog).first_seq() > last_seq + 1 =>
        {
            // What it lacks was compacted here: it rebuilds from this leader's files instead.
            tracing::info!(peer = %peer.name, last_seq, "follower is behind the compacted log: rebuilding it");
            return send_rebuild(&mut stream, shipper, ctx).await;
        }
        Some((Message::Joined { last_seq, epoch }, _)) => {
            shipper.record_ack(&peer.name, last_seq, epoch);
            last_seq
        }
        Some((Message::Rebuild { .. }, _)) => {
            tracing::info!(peer = %peer.name, "follower's log is not a prefix of ours: rebuilding it");
            return send_rebuild(&mut stream, shipper, ctx).await;
        }
        other => bail!("join answered {other:?}"),
    };
    let (mut rd, mut wr) = stream.into_split();
    let name = peer.name.clone();
    let acks = shipper.clone();
    let mut reader = tokio::spawn(async move {
        loop {
            match wire::read(&mut rd).await {
                Ok(Some((Message::Ack { seq, epoch }, _))) => acks.record_ack(&name, seq, epoch),
                Ok(Some((other, _))) => return anyhow::anyhow!("follower said {other:?}"),
                Ok(None) => return anyhow::anyhow!("follower closed the connection"),
                Err(e) => return anyhow::anyhow!("reading acknowledgements: {e}"),
            }
        }
    });
    // From here every batch written is either in the segments read below or in the queue.
    shipper.links[index]
        .connected
        .store(true, Ordering::Release);
    let result = async {
        catch_up(&mut wr, shipper, &ctx.catalog, &mut sent, u64::MAX).await?;
        loop {
            let shipment = tokio::select! {
                s = rx.recv() => s.context("the shipper is gone")?,
                e = &mut reader => bail!("{}", e.map_err(|e| anyhow::anyhow!("{e}"))?),
            };
            if shipment.last <= sent {
                continue;
            }
            if shipment.first > sent + 1 {
                catch_up(
                    &mut wr,
                    shipper,
                    &ctx.catalog,
                    &mut sent,
                    shipment.first - 1,
                )
                .await?;
            }
            let frames = if shipment.first <= sent {
                frames_after(&shipment.frames, sent)?
            } else {
                shipment.frames.clone()
            };
            let append = Message::Append {
                epoch: shipper.epoch,
                first: sent + 1,
                last: shipment.last,
            };
            wire::write(&mut wr, &append, &frames).await?;
            sent = shipment.last;
        }
    }
    .await;
    reader.abort();
    result
}

/// Streams the records after `sent` up to what is written (and at most `upto`) from the
/// leader's own segments.
async fn catch_up(
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    shipper: &Shipper,
    catalog: &SharedCatalog,
    sent: &mut u64,
    upto: u64,
) -> anyhow::Result<()> {
    loop {
        let target = shipper.written.load(Ordering::Acquire).min(upto);
        if *sent >= target {
            return Ok(());
        }
        let (first, last, frames) = read_frames(catalog, *sent, target).await?;
        let append = Message::Append {
            epoch: shipper.epoch,
            first,
            last,
        };
        wire::write(wr, &append, &frames).await?;
        *sent = last;
    }
}

/// The frames after `after`, up to `upto`, at most a journal page, read from the segments.
pub async fn read_frames(
    catalog: &SharedCatalog,
    after: u64,
    upto: u64,
) -> anyhow::Result<(u64, u64, Vec<u8>)> {
    let catalog = catalog.clone();
    let response = tokio::task::spawn_blocking(move || {
        read_journal(&catalog, after, crate::protocol::MAX_JOURNAL_LIMIT, upto)
    })
    .await?;
    let records = match response {
        Response::Ok {
            records: Some(r), ..
        } if !r.is_empty() => r,
        other => bail!("reading records after {after}: {other:?}"),
    };
    let mut frames = Vec::new();
    for record in &records {
        encode_record(record, &mut frames);
    }
    let last = records.last().map_or(after, |r| r.seq());
    Ok((after + 1, last, frames))
}

/// The frames of `frames` whose seq is above `sent`.
fn frames_after(frames: &[u8], sent: u64) -> anyhow::Result<Vec<u8>> {
    let mut cursor = std::io::Cursor::new(frames);
    loop {
        let at = cursor.position() as usize;
        match crate::journal::read_frame(&mut cursor)? {
            Some((record, _)) if record.seq() > sent => return Ok(frames[at..].to_vec()),
            Some(_) => continue,
            None => return Ok(Vec::new()),
        }
    }
}

/// Sends this leader's files (its newest snapshot, every segment, its history) to a follower
/// that rebuilds from them.
async fn send_rebuild(
    stream: &mut TcpStream,
    shipper: &Shipper,
    ctx: &ReplicaCtx,
) -> anyhow::Result<()> {
    let rebuild = Message::Rebuild {
        epoch: shipper.epoch,
        history: shipper.history.history.clone(),
    };
    wire::write(stream, &rebuild, &[]).await?;
    for path in files_to_copy(&ctx.data_dir)? {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("a file name")?
            .to_owned();
        let bytes = tokio::fs::read(&path)
            .await
            .with_context(|| format!("reading {}", path.display()))?;
        for chunk in bytes
            .chunks(16 << 20)
            .chain(bytes.is_empty().then_some(&[][..]))
        {
            wire::write(stream, &Message::File { name: name.clone() }, chunk).await?;
        }
    }
    wire::write(stream, &Message::Done, &[]).await?;
    // The follower restarts on its new files; its answer is the closed connection.
    let _ = tokio::time::timeout(Duration::from_secs(30), wire::read(stream)).await;
    Ok(())
}

/// The newest snapshot and every segment of `dir`.
fn files_to_copy(dir: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut snapshots = Vec::new();
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(seq) = crate::snapshot::parse_name(&name) {
            snapshots.push((seq, entry.path()));
        } else if crate::storage::parse_segment_name(&name).is_some() {
            segments.push(entry.path());
        }
    }
    snapshots.sort();
    segments.sort();
    let mut out: Vec<PathBuf> = snapshots.pop().map(|(_, p)| p).into_iter().collect();
    out.extend(segments);
    Ok(out)
}

/// Sends a job to the engine thread and waits for its answer.
pub async fn ask<T>(
    jobs: &std::sync::mpsc::SyncSender<FollowJob>,
    job: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, String>>) -> FollowJob,
) -> anyhow::Result<T> {
    let (reply, rx) = tokio::sync::oneshot::channel();
    let jobs = jobs.clone();
    let job = job(reply);
    tokio::task::spawn_blocking(move || jobs.send(job))
        .await?
        .map_err(|_| anyhow::anyhow!("the engine thread no longer follows"))?;
    rx.await
        .context("the engine thread dropped the job")?
        .map_err(|e| anyhow::anyhow!(e))
}
