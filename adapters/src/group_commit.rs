//! The one group-commit skeleton behind the ledger's two batchers (the event store's appends and
//! the funding ledger's fresh movements) and one batched read (the answers' receipts,
//! `edge::receipts`): callers queue a job with a reply channel and wait; one task takes
//! everything waiting, up to a batch limit, and commits it together, so batches grow with load
//! and a lone job still goes out at once.
//!
//! When traces are exported, each job of a batcher started with [`GroupCommit::start`] remembers
//! its caller's span, and a batch that served a traced job is committed in a span of its own
//! (named by the batcher) linked to every traced caller it served (`docs/adr/0018-traces.md`).
//! One started with [`GroupCommit::start_untraced`] remembers none, so its batches make no span.

use std::future::Future;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::{mpsc, oneshot};

/// A job and its caller's span context (when traces are exported).
struct Queued<J> {
    job: J,
    from: Option<telemetry::SpanContext>,
}

/// Commits one batch of jobs. Answering every job (through the reply channel it carries) is the
/// committer's duty; a job dropped unanswered is heard by its caller as [`Stopped`].
pub trait Committer: Send + 'static {
    type Job: Send + 'static;
    /// Commits `batch` and answers each job in it. Whatever is left in `batch` afterwards is
    /// dropped.
    fn commit(&mut self, batch: &mut Vec<Self::Job>) -> impl Future<Output = ()> + Send;
}

/// The group-commit task stopped (or dropped a job) before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the group-commit task stopped before answering")]
pub struct Stopped;

/// The queue into one group-commit task. Cheap to clone.
///
/// The task is owned by its handles, not a background service of the process: it is started by
/// [`GroupCommit::start`] on the current tokio runtime and ends by itself when the last handle is
/// dropped (its queue closes).
pub struct GroupCommit<J> {
    queue: mpsc::Sender<Queued<J>>,
    /// Whether a batch is a span of its own when traces are exported (a transfer's step), or
    /// never (a read answering requests, no step of any transfer).
    traced: bool,
}

impl<J> Clone for GroupCommit<J> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            traced: self.traced,
        }
    }
}

impl<J> std::fmt::Debug for GroupCommit<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl<J: Send + 'static> GroupCommit<J> {
    /// Starts the task that feeds `committer` batches of at most `batch_max` jobs; at most
    /// `queue_length_max` jobs wait before a caller itself waits (back-pressure). `name` names
    /// a traced batch's span.
    pub fn start<C: Committer<Job = J>>(
        name: &'static str,
        committer: C,
        queue_length_max: usize,
        batch_max: usize,
    ) -> Self {
        let (queue, rx) = mpsc::channel(queue_length_max);
        tokio::spawn(run(name, committer, rx, batch_max.max(1)));
        Self {
            queue,
            traced: true,
        }
    }

    /// [`start`](Self::start) for batches that are no step of a transfer (a read that answers
    /// many requests at once): no caller's span context taken, so no batch ever has a span and
    /// needs no name.
    pub fn start_untraced<C: Committer<Job = J>>(
        committer: C,
        queue_length_max: usize,
        batch_max: usize,
    ) -> Self {
        Self {
            traced: false,
            ..Self::start("untraced", committer, queue_length_max, batch_max)
        }
    }

    /// Queues the job built around a fresh reply channel and waits for its answer.
    pub async fn ask<R>(&self, job: impl FnOnce(oneshot::Sender<R>) -> J) -> Result<R, Stopped> {
        let (reply, answer) = oneshot::channel();
        let queued = Queued {
            job: job(reply),
            from: if self.traced {
                telemetry::current()
            } else {
                None
            },
        };
        self.queue.send(queued).await.map_err(|_| Stopped)?;
        answer.await.map_err(|_| Stopped)
    }
}

async fn run<C: Committer>(
    name: &'static str,
    mut committer: C,
    mut rx: mpsc::Receiver<Queued<C::Job>>,
    batch_max: usize,
) {
    let mut queued = Vec::with_capacity(batch_max);
    let mut batch = Vec::with_capacity(batch_max);
    let mut links = Vec::new();
    while rx.recv_many(&mut queued, batch_max).await > 0 {
        for Queued { job, from } in queued.drain(..) {
            batch.push(job);
            links.extend(from);
        }
        if links.is_empty() {
            committer.commit(&mut batch).await;
        } else {
            let span = tracing::info_span!(
                target: telemetry::TARGET,
                parent: None,
                "group_commit",
                otel.name = name,
                jobs = batch.len(),
                traced_jobs = links.len()
            );
            telemetry::link_all(&span, links.drain(..));
            // Held, never entered: the span starts here and ends when dropped after the
            // commit. Entered (`instrument`), it was current during the commit's statements, and
            // sqlx runs each statement's stream `in_current_span`, so it was entered and exited
            // at every poll of every statement, for nothing: nothing in a commit makes spans.
            committer.commit(&mut batch).await;
            drop(span);
        }
        batch.clear();
    }
}

/// A connection a committer keeps between batches (no pool round trip, no liveness ping per
/// batch) and gives up after any error, so a broken one is never used twice. One kept idle
/// longer than [`KEPT_IDLE_MAX`] goes back to the pool instead, and the batch takes one through
/// the pool's acquire check: after a quiet spell (a cell whose database was down and is back,
/// say) the first batch does not fail on a socket the server closed meanwhile.
#[derive(Debug)]
pub struct KeptConnection {
    pool: PgPool,
    held: Option<(PoolConnection<Postgres>, std::time::Instant)>,
}

/// How long a committer keeps a connection between two batches before the pool checks it again.
pub const KEPT_IDLE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

impl KeptConnection {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, held: None }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The kept connection, or a new one from the pool.
    pub async fn take(&mut self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        match self.held.take() {
            Some((held, since)) if since.elapsed() <= KEPT_IDLE_MAX => Ok(held),
            // Dropped: back to the pool, whose acquire checks it before handing it out.
            _ => self.pool.acquire().await,
        }
    }

    /// Keeps `conn` for the next batch (only after a batch that saw no error on it).
    pub fn keep(&mut self, conn: PoolConnection<Postgres>) {
        self.held = Some((conn, std::time::Instant::now()));
    }
}
