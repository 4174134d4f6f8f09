//! Group commit: the one thread that owns the engine and the active segment. It takes every
//! request waiting (up to `MAX_BATCH`), decides them in memory, writes and syncs their records
//! once, and only then answers; it hands `journal` requests to the reader thread and a
//! serialized snapshot to the snapshot thread (`compact.rs`) when one is due.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rust_decimal::Decimal;
use tokio::sync::{mpsc, oneshot};

use super::compact::{write_snapshot, SnapshotJob};
use super::writer::Wal;
use crate::engine::Engine;
use crate::invariant;
use crate::journal::{self, JournalJob};
use crate::protocol::{JournalRecord, Request, Response};
use crate::snapshot::{self, WalPosition};
use crate::storage::{encode_record, FailPoints};

/// Most requests folded into one write + sync.
pub const MAX_BATCH: usize = 4096;

/// A leader's replication, as the group commit sees it (`replica/leader.rs`,
/// docs/adr/0020-high-availability.md §3): each batch is shipped once, after it is written and
/// before the leader's own fsync, and answered only when a follower holds it fsynced.
pub trait Replicate: Send + Sync {
    /// Hands the frames `first..=last` to every follower (never blocks).
    fn ship(&self, first: u64, last: u64, frames: &[u8]);
    /// Waits until a follower of this epoch has fsynced everything up to `last`; false when
    /// none did within the acknowledgement timeout (the leader then stops).
    fn wait_acked(&self, last: u64) -> bool;
    /// The last seq written to the leader's segments (what a catching-up follower may read).
    fn written(&self, last: u64);
    /// The followers as the leader sees them, at its last seq `last_seq` (for `status`).
    fn status(&self, last_seq: u64) -> crate::protocol::ReplicationStatus;
    /// Gives leadership back before the process stops (best effort, bounded): the others need
    /// not wait for the lease to expire.
    fn step_down(&self);
}

pub(super) struct Job {
    request: Request,
    reply: oneshot::Sender<Response>,
    /// The caller's span (its `spot_core.call`) when it sent its trace context and this engine
    /// exports traces (`server.rs`): the WAL append is its child, the batch's sync links it.
    trace: Option<telemetry::SpanContext>,
}

/// Cheap handle for submitting requests to the engine thread.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
}

impl EngineHandle {
    /// Queue a request; the returned receiver yields its response once it is durable.
    /// `None` means the engine thread is gone (only during shutdown).
    pub async fn submit(&self, request: Request) -> Option<oneshot::Receiver<Response>> {
        self.submit_traced(request, None).await
    }

    /// `submit`, with the caller's span context: the request's WAL append is a span whose parent
    /// is the caller's span, and the batch's sync links the caller's span.
    pub async fn submit_traced(
        &self,
        request: Request,
        trace: Option<telemetry::SpanContext>,
    ) -> Option<oneshot::Receiver<Response>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job {
                request,
                reply,
                trace,
            })
            .await
            .ok()?;
        Some(rx)
    }

    pub async fn call(&self, request: Request) -> Option<Response> {
        self.submit(request).await?.await.ok()
    }
}

/// Start the single thread that owns `engine` and `wal`, with the journal reader and the
/// snapshot writer beside it. It exits when every handle is dropped.
/// The engine thread's queue: the handle the server submits on, and the thread's end.
pub(super) fn engine_channel() -> (EngineHandle, mpsc::Receiver<Job>) {
    let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
    (EngineHandle { tx }, rx)
}

pub fn spawn_committer(
    engine: Engine,
    wal: Wal,
    fail: FailPoints,
) -> io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
    let side = spawn_side(&engine, &wal, fail)?;
    let thread = std::thread::Builder::new()
        .name("spot-engine".into())
        .spawn(move || commit_loop(engine, wal, rx, side, fail))?;
    Ok((EngineHandle { tx }, thread))
}

/// The journal reader and the snapshot writer beside the engine thread.
pub(super) fn spawn_side(engine: &Engine, wal: &Wal, fail: FailPoints) -> io::Result<Side> {
    let journal = journal::spawn_reader(wal.catalog.clone())?;
    let retain = Arc::new(AtomicU64::new(engine.retain_after()));
    let in_flight = Arc::new(AtomicBool::new(false));
    let (snap_tx, snap_rx) = std::sync::mpsc::channel::<SnapshotJob>();
    // Written snapshot buffers go back to the engine thread for reuse.
    let (spare_tx, spare_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let snapshot_thread = {
        let catalog = wal.catalog.clone();
        let retain = retain.clone();
        let in_flight = in_flight.clone();
        let dir = wal.dir.clone();
        std::thread::Builder::new()
            .name("spot-snapshot".into())
            .spawn(move || {
                while let Ok(job) = snap_rx.recv() {
                    let buffer = write_snapshot(&dir, &catalog, job, &retain, fail);
                    let _ = spare_tx.send(buffer);
                    in_flight.store(false, Ordering::Release);
                }
            })?
    };
    Ok(Side {
        journal,
        snapshots: snap_tx,
        spare: spare_rx,
        snapshot_thread,
        in_flight,
        retain,
        replicate: None,
    })
}

/// The engine thread's links to its helper threads.
pub(super) struct Side {
    journal: std::sync::mpsc::Sender<JournalJob>,
    snapshots: std::sync::mpsc::Sender<SnapshotJob>,
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
    snapshot_thread: std::thread::JoinHandle<()>,
    pub(super) in_flight: Arc<AtomicBool>,
    retain: Arc<AtomicU64>,
    /// Set when this engine leads a replicated cell.
    pub(super) replicate: Option<Arc<dyn Replicate>>,
}

/// Aborts the process if the engine thread unwinds: memory may then be ahead of the log or
/// half-updated, and no later answer could be trusted.
pub(super) struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("spot-core: engine thread panicked; aborting");
            std::process::abort();
        }
    }
}

/// The engine thread's buffers, reused from batch to batch, and its snapshot counters.
struct Batch {
    jobs: Vec<Job>,
    answers: Vec<(oneshot::Sender<Response>, Response)>,
    /// The callers' spans of this batch's traced requests, which its sync links; empty when
    /// nothing is traced.
    traced: Vec<telemetry::SpanContext>,
    journals: Vec<JournalJob>,
    framed: Vec<u8>,
    /// The seq of the batch's first record (the last seq before it, plus one).
    first_seq: u64,
    /// A movement is in this batch (the `abort_after_wal_sync` fail point's condition).
    has_movement: bool,
    /// An answer carries a status to fill with the storage figures.
    wants_storage: bool,
    since_records: u64,
    since_bytes: u64,
}

pub(super) fn commit_loop(
    mut engine: Engine,
    mut wal: Wal,
    mut rx: mpsc::Receiver<Job>,
    side: Side,
    fail: FailPoints,
) {
    let _guard = AbortOnPanic;
    let mut batch = Batch {
        jobs: Vec::with_capacity(MAX_BATCH),
        answers: Vec::with_capacity(MAX_BATCH),
        traced: Vec::new(),
        journals: Vec::new(),
        framed: Vec::with_capacity(1 << 16),
        first_seq: 0,
        has_movement: false,
        wants_storage: false,
        since_records: wal.since_snapshot_records,
        since_bytes: 0,
    };
    loop {
        if rx.blocking_recv_many(&mut batch.jobs, MAX_BATCH) == 0 {
            // Every handle is gone: let a snapshot being written finish (it holds no lock the
            // next opener needs, but a test reopening the directory must not race it).
            drop(side.snapshots);
            let _ = side.snapshot_thread.join();
            return;
        }
        batch.first_seq = engine.last_seq() + 1;
        decide(&mut engine, &mut batch);
        if !batch.framed.is_empty() {
            make_durable(&engine, &mut wal, &mut batch, &side, fail);
        }
        answer(&wal, &mut batch, &side);
        let due = (wal.options.snapshot_every_records > 0
            && batch.since_records >= wal.options.snapshot_every_records)
            || (wal.options.snapshot_every_bytes > 0
                && batch.since_bytes >= wal.options.snapshot_every_bytes);
        if due && !side.in_flight.load(Ordering::Acquire) {
            hand_snapshot(&engine, &wal, &side);
            batch.since_records = 0;
            batch.since_bytes = 0;
        }
    }
}

/// Apply the batch's requests in memory and frame their records; `journal` requests wait for
/// the sync.
fn decide(engine: &mut Engine, batch: &mut Batch) {
    batch.has_movement = false;
    batch.wants_storage = false;
    let mut appending = Appending::default();
    let mut sums = BatchSums::before(engine, batch.first_seq);
    for job in batch.jobs.drain(..) {
        if let Request::Journal { after_seq, limit } = job.request {
            // Served by the reader thread once this batch is synced, up to what the engine
            // had decided when the request came (read-your-writes on a connection).
            batch.journals.push(JournalJob {
                after_seq,
                limit,
                upto: engine.last_seq(),
                reply: job.reply,
            });
            continue;
        }
        // Only for a traced request: the WAL append's span, the child of the caller's span
        // across the protocol, one for each run of consecutive requests of one call (a round's
        // pipelined movements share their call's).
        let append = match &job.trace {
            Some(caller) => appending.span_for(&job.request, caller),
            None => {
                appending.end();
                tracing::Span::none()
            }
        };
        let entered = append.enter();
        let effect = engine.apply(&job.request);
        if let Some(record) = &effect.record {
            sums.add(record);
            batch.has_movement |= record.as_movement().is_some();
            encode_record(record, &mut batch.framed);
            batch.since_records += 1;
            // The sync links the calls whose records it makes durable, each once; a request
            // that framed none (a replayed answer) has no sync to be linked from.
            if let Some(caller) = job.trace {
                if batch.traced.last() != Some(&caller) {
                    batch.traced.push(caller);
                }
            }
        }
        drop(entered);
        batch.wants_storage |= matches!(&effect.response, Response::Ok { core: Some(_), .. });
        batch.answers.push((job.reply, effect.response));
    }
    sums.after(engine);
}

/// The checks of one batch's decisions: its records' seqs dense from the batch's first, and the
/// engine's money (the sum of every asset's total) moved by exactly the batch's applied
/// movements and moves, before anything of it is written. O(assets) per batch, O(1) per record.
struct BatchSums {
    next_seq: u64,
    money: Option<Decimal>,
    moved: Option<Decimal>,
}

impl BatchSums {
    fn before(engine: &Engine, first_seq: u64) -> Self {
        invariant!(
            first_seq == engine.last_seq() + 1,
            "a batch starts at seq {first_seq} after {}",
            engine.last_seq()
        );
        Self {
            next_seq: first_seq,
            money: engine.money(),
            moved: Some(Decimal::ZERO),
        }
    }

    fn add(&mut self, record: &JournalRecord) {
        invariant!(
            record.seq() == self.next_seq,
            "the batch's record seq {} where {} is next",
            record.seq(),
            self.next_seq
        );
        self.next_seq += 1;
        // An applied withdraw takes its amount out, a deposit or refund brings it in; a move out
        // takes the partition's balances out, a move in brings them in (ADR 0023 §4).
        self.moved = self
            .moved
            .zip(record.money_moved())
            .and_then(|(moved, by)| moved.checked_add(by));
    }

    fn after(&self, engine: &Engine) {
        let money = engine.money();
        let expected = self
            .money
            .zip(self.moved)
            .and_then(|(money, moved)| money.checked_add(moved));
        invariant!(
            engine.last_seq() + 1 == self.next_seq
                && (money.is_none() || expected.is_none() || money == expected),
            "a batch took the engine to seq {} (records up to {}) and its money from {:?} to \
             {money:?}, its movements moved {:?}",
            engine.last_seq(),
            self.next_seq - 1,
            self.money,
            self.moved
        );
    }
}

/// The WAL append span of the run of requests being decided, and whose call it serves. Ends
/// (the span is dropped, with the number of requests it covered recorded) when a request of
/// another call, or an untraced one, comes, and at the end of the batch's decisions.
#[derive(Default)]
struct Appending {
    open: Option<(telemetry::SpanContext, tracing::Span, u32)>,
}

impl Appending {
    /// The span for `request` of the call `caller`: the open one when it is that call's.
    fn span_for(&mut self, request: &Request, caller: &telemetry::SpanContext) -> tracing::Span {
        match &mut self.open {
            Some((of, span, requests)) if of == caller => {
                *requests += 1;
                span.clone()
            }
            _ => {
                self.end();
                let span = append_span(request, caller.clone());
                self.open = Some((caller.clone(), span.clone(), 1));
                span
            }
        }
    }

    fn end(&mut self) {
        if let Some((_, span, requests)) = self.open.take() {
            if requests > 1 {
                span.record("requests", requests);
            }
        }
    }
}

impl Drop for Appending {
    fn drop(&mut self) {
        self.end();
    }
}

/// The span of a traced call's WAL append (its requests' decisions in memory and their framed
/// records), a server span whose parent is the caller's `spot_core.call` across the protocol;
/// `op` and `req_id` are its first request's, `requests` how many it covered when more than one.
fn append_span(request: &Request, caller: telemetry::SpanContext) -> tracing::Span {
    let (op, req_id) = match request.as_movement() {
        Some((op, movement)) => (op.as_str(), movement.req_id.as_str()),
        None => ("", ""),
    };
    let span = tracing::info_span!(
        target: telemetry::TARGET,
        parent: None,
        "wal.append",
        otel.kind = "server",
        op,
        req_id,
        requests = tracing::field::Empty
    );
    telemetry::set_remote_parent(&span, caller);
    span
}

/// Write and sync the batch's records (abort if that fails), then publish the conservation check's retained
/// position and start a new segment when the active one is full.
fn make_durable(engine: &Engine, wal: &mut Wal, batch: &mut Batch, side: &Side, fail: FailPoints) {
    // One write and one fsync for the whole batch: a span of its own, linked to every traced
    // request it made durable.
    let sync = if batch.traced.is_empty() {
        tracing::Span::none()
    } else {
        let sync = tracing::info_span!(
            target: telemetry::TARGET,
            parent: None,
            "wal.sync",
            bytes = batch.framed.len(),
            traced_requests = batch.traced.len()
        );
        telemetry::link_all(&sync, batch.traced.drain(..));
        sync
    };
    let entered = sync.enter();
    let appended = match &side.replicate {
        None => wal.append(&batch.framed),
        Some(replicate) => wal.write(&batch.framed).and_then(|()| {
            replicate.written(engine.last_seq());
            replicate.ship(batch.first_seq, engine.last_seq(), &batch.framed);
            wal.sync()
        }),
    };
    drop(entered);
    drop(sync);
    if let Err(e) = appended {
        // Memory is now ahead of the disk; answering or continuing could acknowledge
        // something a restart would forget.
        tracing::error!(path = %wal.path().display(), error = %e, "WAL write or sync failed; aborting");
        eprintln!("spot-core: WAL write/sync failed: {e}; aborting");
        std::process::abort();
    }
    if let Some(replicate) = &side.replicate {
        if !replicate.wait_acked(engine.last_seq()) {
            // Memory is ahead of what two replicas hold; a lone leader never acknowledges.
            tracing::error!(
                seq = engine.last_seq(),
                "no follower acknowledged; stepping down"
            );
            replicate.step_down();
            eprintln!(
                "spot-core: no follower acknowledged seq {}; aborting",
                engine.last_seq()
            );
            std::process::abort();
        }
    }
    batch.since_bytes += batch.framed.len() as u64;
    batch.framed.clear();
    if fail.abort_after_wal_sync && batch.has_movement {
        eprintln!("spot-core: failpoint abort_after_wal_sync");
        std::process::abort();
    }
    side.retain.store(engine.retain_after(), Ordering::Release);
    if let Err(e) = wal.maybe_rotate(engine.last_seq() + 1) {
        // Not fatal: the active segment keeps taking records; retried next batch.
        tracing::error!(error = %format!("{e:#}"), "starting a new WAL segment failed");
    }
}

/// Send every answer of the synced batch, and hand its `journal` requests to the reader.
fn answer(wal: &Wal, batch: &mut Batch, side: &Side) {
    if batch.wants_storage {
        for (_, response) in batch.answers.iter_mut() {
            if let Response::Ok {
                core: Some(core), ..
            } = response
            {
                wal.fill_status(core);
                if let Some(replicate) = &side.replicate {
                    core.replication = Some(replicate.status(core.last_seq));
                }
            }
        }
    }
    for (reply, response) in batch.answers.drain(..) {
        // The asker may have hung up; the result is durable and visible through lookup.
        let _ = reply.send(response);
    }
    for job in batch.journals.drain(..) {
        if let Err(e) = side.journal.send(job) {
            // The reader is gone (it never exits while we run); answer rather than hang.
            let _ =
                e.0.reply
                    .send(Response::bad_request("journal reader stopped"));
        }
    }
}

/// Serialize a snapshot on this thread (the pause, bounded by what is live: accounts and
/// remembered keys, not history) and hand it to the snapshot thread.
pub(super) fn hand_snapshot(engine: &Engine, wal: &Wal, side: &Side) {
    let started = Instant::now();
    let mut bytes = side.spare.try_recv().unwrap_or_default();
    snapshot::encode_into(
        engine,
        WalPosition {
            segment: wal.active_first,
            offset: wal.active_bytes,
        },
        &mut bytes,
    );
    let pause = started.elapsed();
    side.in_flight.store(true, Ordering::Release);
    let job = SnapshotJob {
        seq: engine.last_seq(),
        bytes,
        pause,
    };
    if side.snapshots.send(job).is_err() {
        side.in_flight.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use rust_decimal::Decimal;

    use super::*;
    use crate::assets::Assets;

    fn job(request: Request, trace: Option<telemetry::SpanContext>) -> Job {
        Job {
            request,
            reply: oneshot::channel().0,
            trace,
        }
    }

    /// The batch's sync links only the callers whose records it makes durable: a replayed
    /// answer frames nothing, and a batch that frames nothing has no sync that would take its
    /// callers away (they would be linked from a later, unrelated sync).
    #[test]
    fn only_requests_that_frame_a_record_are_linked_from_the_sync() {
        let caller =
            telemetry::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .expect("a valid traceparent");
        let req_id = crate::ulid::format(crate::ulid::from_parts(crate::ulid::now_ms(), 42));
        let deposit = || Request::deposit(req_id.clone(), 7, "USDT", Decimal::from(5));
        let mut engine = Engine::new(Assets::builtin());
        let mut batch = Batch {
            jobs: vec![
                job(deposit(), Some(caller.clone())),
                job(deposit(), Some(caller.clone())),
            ],
            answers: Vec::new(),
            traced: Vec::new(),
            journals: Vec::new(),
            framed: Vec::new(),
            first_seq: 1,
            has_movement: false,
            wants_storage: false,
            since_records: 0,
            since_bytes: 0,
        };
        decide(&mut engine, &mut batch);
        assert_eq!(batch.since_records, 1, "the second deposit is a replay");
        assert_eq!(batch.traced, vec![caller.clone()]);

        // A call's pipelined requests are linked once; each call is linked.
        let other =
            telemetry::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b8-01")
                .expect("a valid traceparent");
        batch.traced.clear();
        batch.framed.clear();
        let fresh = |n: u64| {
            let id = crate::ulid::format(crate::ulid::from_parts(crate::ulid::now_ms(), n.into()));
            Request::deposit(id, 7, "USDT", Decimal::from(1))
        };
        batch.jobs.extend([
            job(fresh(100), Some(caller.clone())),
            job(fresh(101), Some(caller.clone())),
            job(fresh(102), Some(other.clone())),
        ]);
        // As `commit_loop` does before each batch: its records follow the engine's last.
        batch.first_seq = engine.last_seq() + 1;
        decide(&mut engine, &mut batch);
        assert_eq!(batch.since_records, 4);
        assert_eq!(batch.traced, vec![caller.clone(), other]);

        batch.traced.clear();
        batch.framed.clear();
        batch.jobs.push(job(deposit(), Some(caller)));
        batch.first_seq = engine.last_seq() + 1;
        decide(&mut engine, &mut batch);
        assert!(batch.framed.is_empty(), "a replay alone frames nothing");
        assert!(batch.traced.is_empty(), "{:?}", batch.traced);
    }
}
