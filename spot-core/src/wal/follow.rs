//! The engine thread of a replica that follows (docs/adr/0020-high-availability.md §3): it takes
//! the leader's frames in order, appends them to its own segments exactly as written (same seq,
//! same bytes), fsyncs, applies them to its engine (a hot standby) and acknowledges. Promises,
//! joins and the switch to leading go through the same thread, so each one sees every append
//! before it and none after: a promise's answer is the log it fences.
//!
//! Nothing here decides who leads; `replica/` asks etcd and sends the jobs below.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::commit::{
    commit_loop, engine_channel, hand_snapshot, spawn_side, AbortOnPanic, EngineHandle, Replicate,
    Side,
};
use super::writer::Wal;
use crate::engine::Engine;
use crate::journal::read_frame;
use crate::replica::history::{divergence, Epochs, Position};
use crate::storage::FailPoints;

/// What a follower answers a `Join`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinAnswer {
    /// The follower's log is a prefix of the leader's: stream from after this seq.
    From(u64),
    /// It is not (a deposed leader's unacknowledged tail): it must rebuild.
    Rebuild,
}

/// A job for a following engine thread.
#[derive(Debug)]
pub enum FollowJob {
    /// Append the frames `first..=last` of `epoch` (which must be the promised epoch); answered
    /// with the last seq now fsynced and the last epoch of this replica's history.
    Append {
        epoch: u64,
        first: u64,
        last: u64,
        frames: Vec<u8>,
        reply: oneshot::Sender<Result<(u64, u64), String>>,
    },
    /// Refuse every frame below `epoch` from now on; answered with this log's position.
    Promise {
        epoch: u64,
        reply: oneshot::Sender<Result<Position, String>>,
    },
    /// Follow `epoch`, which began at `start` in the leader's log `leader`.
    Join {
        epoch: u64,
        start: u64,
        leader: Position,
        reply: oneshot::Sender<Result<(JoinAnswer, u64), String>>,
    },
    /// Lead `epoch` (promised, and this log the most advanced of a quorum): its history gains
    /// `(epoch, last + 1)` and the thread goes on as the leader's group commit. Answered with the
    /// epoch's first seq.
    Lead {
        epoch: u64,
        reply: oneshot::Sender<Result<u64, String>>,
    },
}

/// How the follow loop ended.
pub(super) struct Led {
    pub epoch: u64,
    pub start: u64,
    pub history: Position,
}

/// Counters the follow loop shares with the replication tasks.
#[derive(Debug, Default)]
pub struct Progress {
    /// The last seq written to this replica's segments (readable by the journal reader).
    pub written: AtomicU64,
    /// It lost its data and has not caught up with a leader yet: it must not campaign.
    pub wiped: std::sync::atomic::AtomicBool,
}

/// Runs until a `Lead` job, or until every sender is gone (`None`).
// long: one match over the follow jobs on the one engine thread, each arm a few lines; the order of the arms is the protocol's, kept in one place.
pub(super) fn follow(
    engine: &mut Engine,
    wal: &mut Wal,
    epochs: &mut Epochs,
    jobs: &std::sync::mpsc::Receiver<FollowJob>,
    side: &Side,
    progress: &Arc<Progress>,
    since_records: &mut u64,
) -> Option<Led> {
    // A join's history line waits until the log holds every record before its start.
    let mut pending: Option<(u64, u64)> = None;
    // A WIPED replica ends WIPED only once it holds everything its leader had when it joined
    // (epoch, leader's last seq): the epoch's line alone can come with no record at all (an
    // epoch that began at seq 1), and then its empty log would count toward the next quorum
    // (ledger-sim --replication, seed 14592).
    let mut wiped_until: Option<(u64, u64)> = None;
    progress.written.store(engine.last_seq(), Ordering::Release);
    progress.wiped.store(epochs.wiped, Ordering::Release);
    while let Ok(job) = jobs.recv() {
        match job {
            FollowJob::Append {
                epoch,
                first,
                last,
                frames,
                reply,
            } => {
                match write(engine, wal, epochs, epoch, first, last, &frames) {
                    Ok(records) => {
                        // Durable here: acknowledged before it is applied (applying is for the
                        // hot standby, off the leader's path).
                        *since_records += last + 1 - first;
                        progress.written.store(last, Ordering::Release);
                        let answer = adopt_pending(epochs, &mut pending, last)
                            .and_then(|()| end_wiped(epochs, &mut wiped_until, last))
                            .map(|()| (last, epochs.position(0).last_epoch()));
                        progress.wiped.store(epochs.wiped, Ordering::Release);
                        let _ = reply.send(answer);
                        apply(engine, wal, records);
                        // The follower's state is its log's: what it acknowledged as written is
                        // exactly what it now holds, or a later promise's answer would lie.
                        assert_eq!(engine.last_seq(), last, "applied exactly the shipment");
                    }
                    Err(refused) => {
                        let _ = reply.send(Err(refused));
                    }
                }
                let due = wal.options.snapshot_every_records > 0
                    && *since_records >= wal.options.snapshot_every_records;
                if due && !side.in_flight.load(Ordering::Acquire) {
                    hand_snapshot(engine, wal, side);
                    *since_records = 0;
                }
            }
            FollowJob::Promise { epoch, reply } if epochs.wiped => {
                // It lost its data: its empty log must not count toward a quorum that could
                // then elect a log without what it held (ADR 0020 §3).
                let _ = reply.send(Err(format!(
                    "epoch {epoch} not promised: this replica lost its data and has not caught up yet"
                )));
            }
            FollowJob::Promise { epoch, reply } => {
                let answer = epochs
                    .promise(epoch)
                    .map(|()| epochs.position(engine.last_seq()))
                    .map_err(|e| format!("{e:#}"));
                if answer.is_ok() && pending.is_some_and(|(e, _)| e < epoch) {
                    pending = None;
                }
                let _ = reply.send(answer);
            }
            FollowJob::Join {
                epoch,
                start,
                leader,
                reply,
            } => {
                let answer = join(engine, epochs, epoch, start, &leader).and_then(|a| {
                    if a != JoinAnswer::Rebuild {
                        pending = Some((epoch, start));
                        if epochs.wiped {
                            wiped_until = Some((epoch, leader.last_seq));
                        }
                        adopt_pending(epochs, &mut pending, engine.last_seq())?;
                        end_wiped(epochs, &mut wiped_until, engine.last_seq())?;
                        progress.wiped.store(epochs.wiped, Ordering::Release);
                    }
                    Ok((a, epochs.position(0).last_epoch()))
                });
                let _ = reply.send(answer);
            }
            FollowJob::Lead { epoch, reply } => {
                let start = engine.last_seq() + 1;
                if epoch != epochs.promised {
                    let _ = reply.send(Err(format!(
                        "epoch {epoch} is not the promised {}",
                        epochs.promised
                    )));
                    continue;
                }
                if let Err(e) = epochs.adopt(epoch, start) {
                    let _ = reply.send(Err(format!("{e:#}")));
                    continue;
                }
                let _ = reply.send(Ok(start));
                return Some(Led {
                    epoch,
                    start,
                    history: epochs.position(engine.last_seq()),
                });
            }
        }
    }
    None
}

fn end_wiped(
    epochs: &mut Epochs,
    until: &mut Option<(u64, u64)>,
    last_seq: u64,
) -> Result<(), String> {
    if let Some((epoch, target)) = *until {
        if epochs.position(0).last_epoch() == epoch && last_seq >= target {
            epochs.clear_wiped().map_err(|e| format!("{e:#}"))?;
            *until = None;
        }
    }
    Ok(())
}

fn adopt_pending(
    epochs: &mut Epochs,
    pending: &mut Option<(u64, u64)>,
    last_seq: u64,
) -> Result<(), String> {
    if let Some((epoch, start)) = *pending {
        if last_seq + 1 >= start {
            epochs.adopt(epoch, start).map_err(|e| format!("{e:#}"))?;
            *pending = None;
        }
    }
    Ok(())
}

/// Whether this log is a prefix of the leader's; promises `epoch`.
fn join(
    engine: &Engine,
    epochs: &mut Epochs,
    epoch: u64,
    start: u64,
    leader: &Position,
) -> Result<JoinAnswer, String> {
    epochs.promise(epoch).map_err(|e| format!("{e:#}"))?;
    let mine = epochs.position(engine.last_seq());
    if divergence(&mine, leader) < mine.last_seq {
        return Ok(JoinAnswer::Rebuild);
    }
    // A history line of the leader's epoch that starts elsewhere than the leader says cannot
    // be: one leader per epoch.
    if let Some(line) = mine.history.iter().find(|l| l.epoch == epoch) {
        if line.start != start {
            return Ok(JoinAnswer::Rebuild);
        }
    }
    Ok(JoinAnswer::From(engine.last_seq()))
}

/// Checks one shipment, then writes and fsyncs it; its records, to apply.
fn write(
    engine: &Engine,
    wal: &mut Wal,
    epochs: &Epochs,
    epoch: u64,
    first: u64,
    last: u64,
    frames: &[u8],
) -> Result<Vec<crate::protocol::JournalRecord>, String> {
    if !crate::replica::rules::accepts_frames(epochs.promised, epoch) {
        return Err(format!(
            "frames of epoch {epoch} refused: this replica promised epoch {}",
            epochs.promised
        ));
    }
    if first != engine.last_seq() + 1 || last < first {
        return Err(format!(
            "frames {first}..={last} do not follow this log's last seq {}",
            engine.last_seq()
        ));
    }
    // Every frame checked (crc, parse, contiguous seq) before anything is written.
    let mut records = Vec::with_capacity((last + 1 - first) as usize);
    let mut cursor = Cursor::new(frames);
    while let Some((record, _)) = read_frame(&mut cursor).map_err(|e| format!("a frame: {e}"))? {
        if record.seq() != first + records.len() as u64 {
            return Err(format!("frame seq {} out of order", record.seq()));
        }
        records.push(record);
    }
    if first + records.len() as u64 != last + 1 {
        return Err(format!("{} frames for {first}..={last}", records.len()));
    }
    if let Err(e) = wal.append(frames) {
        // The disk refuses: memory and disk could part; stop as the leader's sync does.
        eprintln!("spot-core: follower WAL write/sync failed: {e}; aborting");
        std::process::abort();
    }
    Ok(records)
}

/// Applies written records to the engine, then starts a new segment when the active one is
/// full.
fn apply(engine: &mut Engine, wal: &mut Wal, records: Vec<crate::protocol::JournalRecord>) {
    for record in records {
        if let Err(e) = engine.apply_record(record) {
            // The leader decided these on the same state: a difference means the logs differ.
            eprintln!("spot-core: a replicated record does not apply: {e:?}; aborting");
            std::process::abort();
        }
    }
    side_rotate(wal, engine);
}

fn side_rotate(wal: &mut Wal, engine: &Engine) {
    if let Err(e) = wal.maybe_rotate(engine.last_seq() + 1) {
        tracing::error!(error = %format!("{e:#}"), "starting a new WAL segment failed");
    }
}

/// What a replica's engine thread is started with (`replica/`): its epochs, the follow jobs'
/// queue, the progress it publishes, and how to replicate once it leads.
pub struct ReplicaParts {
    pub epochs: crate::replica::history::Epochs,
    pub jobs: std::sync::mpsc::Receiver<FollowJob>,
    pub progress: Arc<Progress>,
    /// Builds the leader's replication from the epoch, its first seq and the leader's history.
    pub lead:
        Box<dyn FnOnce(u64, u64, crate::replica::history::Position) -> Arc<dyn Replicate> + Send>,
}

/// The engine thread of a replica: it follows (`follow.rs`) until it is told to lead, then runs
/// the group commit, every batch replicated. Requests queued on the handle meanwhile wait (the
/// server refuses clients while this replica does not lead).
pub fn spawn_replica_committer(
    mut engine: Engine,
    mut wal: Wal,
    fail: FailPoints,
    parts: ReplicaParts,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (handle, rx) = engine_channel();
    let mut side = spawn_side(&engine, &wal, fail)?;
    let thread = std::thread::Builder::new()
        .name("spot-engine".into())
        .spawn(move || {
            let _guard = AbortOnPanic;
            let ReplicaParts {
                mut epochs,
                jobs,
                progress,
                lead,
            } = parts;
            let mut since = wal.since_snapshot_records;
            let Some(led) = follow(
                &mut engine,
                &mut wal,
                &mut epochs,
                &jobs,
                &side,
                &progress,
                &mut since,
            ) else {
                return;
            };
            let replicate = lead(led.epoch, led.start, led.history);
            // Nothing is answered until a follower holds this epoch's start: the line in its
            // history that outranks every older log (ADR 0020 §3, step 3).
            if !replicate.wait_acked(led.start - 1) {
                replicate.step_down();
                eprintln!(
                    "spot-core: no follower joined epoch {}; aborting",
                    led.epoch
                );
                std::process::abort();
            }
            tracing::info!(epoch = led.epoch, start = led.start, "leading");
            side.replicate = Some(replicate);
            wal.since_snapshot_records = since;
            commit_loop(engine, wal, rx, side, fail)
        })?;
    Ok((handle, thread))
}
