//! The event store: postgres-es's layout and reads, with a batching repository whose appends from many
//! concurrent commits share one PostgreSQL transaction (group commit), and the few raw reads of
//! the log the conservation check and the GraphQL `events` field need.
//!
//! A batching event repository: postgres-es's layout and reads, but appends from many
//! concurrent commits share one PostgreSQL transaction (group commit). Each commit is still
//! durable before its caller hears "ok", and each commit's events stay all-or-nothing: a batch
//! that hits a conflict is retried commit by commit, so exactly the conflicting writer is told.

use std::sync::Arc;

use cqrs_es::persist::{
    PersistedEventRepository, PersistedEventStore, PersistenceError, ReplayStream, SerializedEvent,
    SerializedSnapshot,
};
use cqrs_es::Aggregate;
use domain::{Transfer, TransferEvent};
use futures_util::TryStreamExt;
use postgres_es::PostgresEventRepository;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::group_commit::{Committer, GroupCommit, KeptConnection};

mod insert;
mod together;
mod traces;

use eventlog::append::{is_conflict, is_fenced, refused_alone};
use insert::{insert, Pending};
pub use together::{Call, Extras, Record, Written};
pub use traces::first_trace;

/// The event store in plain event-store mode (postgres-es's snapshot modes double-apply events),
/// over the batching repository: postgres-es's table and reads, group-committed appends.
pub type TransferStore = PersistedEventStore<BatchingEventRepository, Transfer>;

/// Most commits one appender puts into one transaction.
pub const BATCH_COMMITS_MAX: usize = 512;
/// Commits waiting for the appender before `persist` itself waits (back-pressure).
///
/// There is one appender task, with at most one transaction in flight. Measured with
/// `ledger-bench transfers` at 32 clients: 4 appenders 1,193/s, 2 appenders 1,326/s, 1 appender
/// 1,383/s; fewer, larger batches cost PostgreSQL less CPU than more, smaller ones.
const QUEUE_LENGTH_MAX: usize = 8192;

/// One caller's commits (one, or a bulk request's many), each all-or-nothing on its own, and
/// where their answers go, in order.
struct Job {
    aggregate_type: &'static str,
    commits: Vec<Vec<SerializedEvent>>,
    /// The appending span's traceparent when these commits create a transfer and traces are
    /// exported (`traces.rs`): the transfer's first trace, stored beside its creation.
    trace: Option<String>,
    /// The claims and charges its creations write with them (ADR 0022), if any.
    extras: Option<Extras>,
    reply: oneshot::Sender<Vec<Answer>>,
}

/// What one commit came to.
type Answer = Result<Written, PersistenceError>;

/// A plain append's answer: only `Appended` is written without extras.
fn appended(answer: Answer) -> Result<(), PersistenceError> {
    match answer? {
        Written::Appended => Ok(()),
        other => Err(PersistenceError::UnknownError(
            format!("a plain append answered {other:?}").into(),
        )),
    }
}

/// The read-back check of one aggregate's stored events (every load folds them): sequences
/// `after + 1`, `after + 2`, ... in order, no gap and no repeat, each of `aggregate_id`. A gap
/// would fold a transfer past a step of the transition table it never took (and the next
/// append, decided on the short sequence, would conflict forever). Persisted input: refused
/// with an error (the transfer is not driven from it; the worker keeps reporting it), never an
/// abort, which would only crash-loop on the same rows.
fn dense(
    aggregate_id: &str,
    after: usize,
    events: &[SerializedEvent],
) -> Result<(), PersistenceError> {
    for (i, e) in events.iter().enumerate() {
        let want = after + i + 1;
        if e.sequence != want || e.aggregate_id != aggregate_id {
            tracing::error!(%aggregate_id, want, found = e.sequence, of = %e.aggregate_id, "event log read back out of order; refused");
            return Err(PersistenceError::UnknownError(
                format!(
                    "event log: {aggregate_id}: expected sequence {want}, read {} of {}",
                    e.sequence, e.aggregate_id
                )
                .into(),
            ));
        }
    }
    Ok(())
}

/// Reads through postgres-es; appends through the batching appender.
#[derive(Clone)]
pub struct BatchingEventRepository {
    reads: Arc<PostgresEventRepository>,
    queue: GroupCommit<Job>,
}

impl BatchingEventRepository {
    /// Starts the appender task on the current tokio runtime. The task is owned by this value's
    /// clones (see `group_commit`) and ends when the last one is dropped.
    pub fn new(pool: PgPool) -> Self {
        let appender = Appender {
            conn: KeptConnection::new(pool.clone()),
        };
        Self {
            reads: Arc::new(PostgresEventRepository::new(pool)),
            queue: GroupCommit::start(
                "event_store.group_commit",
                appender,
                QUEUE_LENGTH_MAX,
                BATCH_COMMITS_MAX,
            ),
        }
    }

    /// Appends many aggregates' commits in one transaction of the appender (with whatever else
    /// is waiting): one answer per commit, in order. Each commit is still all-or-nothing with its
    /// own version check: when one conflicts, the transaction is retried commit by commit, so
    /// only that one hears `OptimisticLockError`.
    pub async fn append_many<A: Aggregate>(
        &self,
        commits: Vec<Vec<SerializedEvent>>,
    ) -> Vec<Result<(), PersistenceError>> {
        self.write::<A>(commits, None)
            .await
            .into_iter()
            .map(appended)
            .collect()
    }

    /// `append_many` of creations, each written in the same transaction as its claim and its
    /// charge in `extras` (one entry per commit; ADR 0022): `KeyTaken` or `Refused` leave
    /// nothing of that creation behind.
    pub async fn create_many<A: Aggregate>(
        &self,
        commits: Vec<Vec<SerializedEvent>>,
        extras: Extras,
    ) -> Vec<Answer> {
        self.write::<A>(commits, Some(extras)).await
    }

    async fn write<A: Aggregate>(
        &self,
        commits: Vec<Vec<SerializedEvent>>,
        extras: Option<Extras>,
    ) -> Vec<Answer> {
        let count = commits.len();
        let span = traces::append_span(commits.iter().flatten());
        // A FUNDING movement made in this write (ADR 0024) keeps its call span, a sibling of
        // the append's under the caller's, open while the write is: the trace still shows
        // FUNDING's part, decided by the group commit instead of the funding batch.
        let funding = extras
            .as_ref()
            .and_then(|x| x.calls.iter().flatten().next())
            .map(|c| crate::traced::funding_call(c.op, std::slice::from_ref(&c.movement)));
        let asked = async {
            let trace = traces::creation_trace(commits.iter().flatten());
            self.queue
                .ask(|reply| Job {
                    aggregate_type: A::TYPE,
                    commits,
                    trace,
                    extras,
                    reply,
                })
                .await
        }
        .instrument(span)
        .await;
        drop(funding);
        match asked {
            Ok(answers) if answers.len() == count => answers,
            Ok(_) | Err(_) => (0..count)
                .map(|_| {
                    Err(PersistenceError::UnknownError(
                        "the appender stopped".into(),
                    ))
                })
                .collect(),
        }
    }
}

/// The event store over `pool`, its appender started on the current tokio runtime.
pub fn transfer_store(pool: PgPool) -> TransferStore {
    PersistedEventStore::new_event_store(BatchingEventRepository::new(pool))
}

struct Appender {
    conn: KeptConnection,
}

impl Committer for Appender {
    type Job = Job;

    async fn commit(&mut self, jobs: &mut Vec<Job>) {
        // Transactions of at most BATCH_COMMITS_MAX commits, a job never split (a bulk
        // request's commits larger than that go alone, in one transaction).
        let mut answers: Vec<Vec<Answer>> = Vec::with_capacity(jobs.len());
        let mut start = 0;
        while start < jobs.len() {
            let mut end = start + 1;
            let mut commits = jobs[start].commits.len();
            while end < jobs.len() && commits + jobs[end].commits.len() <= BATCH_COMMITS_MAX {
                commits += jobs[end].commits.len();
                end += 1;
            }
            let together = jobs[start..end].iter().any(|j| j.extras.is_some());
            let mut results = match together {
                false => {
                    let group: Vec<Pending<'_>> = jobs[start..end]
                        .iter()
                        .flat_map(|j| {
                            j.commits
                                .iter()
                                .map(|c| (j.aggregate_type, c.as_slice(), j.trace.as_deref()))
                        })
                        .collect();
                    self.append_group(&group)
                        .await
                        .into_iter()
                        .map(|a| a.map(|()| Written::Appended))
                        .collect::<Vec<_>>()
                }
                true => self.write_together(&jobs[start..end]).await,
            }
            .into_iter();
            for job in &jobs[start..end] {
                answers.push(results.by_ref().take(job.commits.len()).collect());
            }
            start = end;
        }
        for (job, answers) in jobs.drain(..).zip(answers) {
            let _ = job.reply.send(answers);
        }
    }
}

impl Appender {
    /// Appends one transaction's commits: one answer per commit, in order.
    async fn append_group(&mut self, group: &[Pending<'_>]) -> Vec<Result<(), PersistenceError>> {
        match self.conn.take().await {
            Ok(mut held) => {
                let (answers, healthy) = append_batch(&mut held, group).await;
                if healthy {
                    self.conn.keep(held);
                }
                answers
            }
            Err(e) => {
                let message = e.to_string();
                group
                    .iter()
                    .map(|_| Err(PersistenceError::UnknownError(message.clone().into())))
                    .collect()
            }
        }
    }
}

impl Appender {
    /// Writes one transaction's jobs when some carry creations' claims and charges
    /// (`together.rs`): one answer per commit, in order. A conflict (a sequence taken, a claim
    /// moved) is found out as `append_batch` does, one commit per transaction.
    async fn write_together(&mut self, jobs: &[Job]) -> Vec<Answer> {
        let items: Vec<together::Item<'_>> = jobs
            .iter()
            .flat_map(|j| {
                j.commits.iter().enumerate().map(move |(k, c)| {
                    let extras = j.extras.as_ref();
                    together::Item {
                        pending: (j.aggregate_type, c.as_slice(), j.trace.as_deref()),
                        claim: extras.and_then(|x| x.claims.get(k)?.as_ref()),
                        charge: extras.and_then(|x| {
                            Some((x.charges.get(k)?.as_ref()?, x.limits.as_ref(), x.day))
                        }),
                        call: extras.and_then(|x| x.calls.get(k)?.as_ref()),
                    }
                })
            })
            .collect();
        let mut held = match self.conn.take().await {
            Ok(held) => held,
            Err(e) => {
                let message = e.to_string();
                return items
                    .iter()
                    .map(|_| Err(PersistenceError::UnknownError(message.clone().into())))
                    .collect();
            }
        };
        let (answers, healthy) = match together::write(&mut held, &items).await {
            Ok(written) => (written.into_iter().map(Ok).collect(), true),
            Err(e) if items.len() > 1 && refused_alone(&e) => {
                let mut healthy = true;
                let mut answers = Vec::with_capacity(items.len());
                for item in &items {
                    let alone = together::write(&mut held, std::slice::from_ref(item)).await;
                    healthy &= alone.as_ref().map_or_else(refused_alone, |_| true);
                    answers.push(match alone {
                        Ok(mut written) => written
                            .pop()
                            .ok_or_else(|| PersistenceError::UnknownError("no answer".into())),
                        Err(e) => Err(to_persistence(e)),
                    });
                }
                (answers, healthy)
            }
            Err(e) => {
                let answers = items.iter().map(|_| Err(answer_of(&e))).collect();
                (answers, refused_alone(&e))
            }
        };
        if healthy {
            self.conn.keep(held);
        }
        answers
    }
}

/// Appends one batch: its answers, and whether the connection may be kept (no error was seen
/// on it).
async fn append_batch(
    conn: &mut PgConnection,
    commits: &[Pending<'_>],
) -> (Vec<Result<(), PersistenceError>>, bool) {
    match insert(conn, commits).await {
        Ok(()) => (commits.iter().map(|_| Ok(())).collect(), true),
        Err(e) if commits.len() > 1 && refused_alone(&e) => {
            // Someone's sequence number was taken: find out whose, one commit per transaction.
            // A refused statement leaves the connection usable.
            let mut healthy = true;
            let mut answers = Vec::with_capacity(commits.len());
            for commit in commits {
                let result = insert(conn, std::slice::from_ref(commit)).await;
                healthy &= result.as_ref().map_or_else(refused_alone, |()| true);
                answers.push(result.map_err(to_persistence));
            }
            (answers, healthy)
        }
        Err(e) => {
            // The outcome of a failed commit may be unknown (connection lost during COMMIT);
            // every caller hears the error and reloads before acting again.
            let answers = commits.iter().map(|_| Err(answer_of(&e))).collect();
            (answers, refused_alone(&e))
        }
    }
}

/// The metadata key under which a commit names its transfer's owner (the event log's stored
/// form: `eventlog` copies it to the event's `user_id`).
pub use eventlog::OWNER_METADATA_KEY;

/// What every commit of a batch whose statement failed with `e` hears: a conflict, the fence's
/// refusal (typed, so the edge can answer 503 and the front route again), or an unknown outcome.
fn answer_of(e: &sqlx::Error) -> PersistenceError {
    if is_conflict(e) {
        PersistenceError::OptimisticLockError
    } else if is_fenced(e) {
        PersistenceError::UnknownError(Box::new(application::error::Fenced(e.to_string())))
    } else {
        PersistenceError::UnknownError(e.to_string().into())
    }
}

fn to_persistence(e: sqlx::Error) -> PersistenceError {
    if refused_alone(&e) {
        return answer_of(&e);
    }
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            PersistenceError::ConnectionError(Box::new(e))
        }
        other => PersistenceError::UnknownError(Box::new(other)),
    }
}

impl PersistedEventRepository for BatchingEventRepository {
    async fn get_events<A: Aggregate>(
        &self,
        aggregate_id: &str,
    ) -> Result<Vec<SerializedEvent>, PersistenceError> {
        let events = self.reads.get_events::<A>(aggregate_id).await?;
        dense(aggregate_id, 0, &events)?;
        Ok(events)
    }

    async fn get_last_events<A: Aggregate>(
        &self,
        aggregate_id: &str,
        last_sequence: usize,
    ) -> Result<Vec<SerializedEvent>, PersistenceError> {
        let events = self
            .reads
            .get_last_events::<A>(aggregate_id, last_sequence)
            .await?;
        dense(aggregate_id, last_sequence, &events)?;
        Ok(events)
    }

    async fn get_snapshot<A: Aggregate>(
        &self,
        aggregate_id: &str,
    ) -> Result<Option<SerializedSnapshot>, PersistenceError> {
        self.reads.get_snapshot::<A>(aggregate_id).await
    }

    async fn persist<A: Aggregate>(
        &self,
        events: &[SerializedEvent],
        snapshot_update: Option<(String, Value, usize)>,
    ) -> Result<(), PersistenceError> {
        if snapshot_update.is_some() {
            // Snapshots are not used (contract §1); refuse rather than drop one silently.
            return Err(PersistenceError::UnknownError(
                "snapshots are not supported by the batching repository".into(),
            ));
        }
        if events.is_empty() {
            return Ok(());
        }
        let span = traces::append_span(events.iter());
        let mut answers = async {
            let trace = traces::creation_trace(events.iter());
            self.queue
                .ask(|reply| Job {
                    aggregate_type: A::TYPE,
                    commits: vec![events.to_vec()],
                    trace,
                    extras: None,
                    reply,
                })
                .await
        }
        .instrument(span)
        .await
        .map_err(|e| PersistenceError::UnknownError(Box::new(e)))?;
        answers.pop().map_or_else(
            || Err(PersistenceError::UnknownError("no answer".into())),
            appended,
        )
    }

    async fn stream_events<A: Aggregate>(
        &self,
        aggregate_id: &str,
    ) -> Result<ReplayStream, PersistenceError> {
        self.reads.stream_events::<A>(aggregate_id).await
    }

    async fn stream_all_events<A: Aggregate>(&self) -> Result<ReplayStream, PersistenceError> {
        self.reads.stream_all_events::<A>().await
    }
}

/// One event of one transfer as the log holds it (the core's type).
pub use application::stores::LoggedEvent;

/// Why a read of the log failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("event log read failed")]
    Database(#[from] sqlx::Error),
    /// An event that does not decode as a `TransferEvent` (or a first event that is not
    /// `TransferCreated`).
    #[error("event log: transfer {req_id}: {problem}")]
    Undecodable { req_id: String, problem: String },
}

/// A stored payload through the log's one decoder (`domain::stored`, with the version check).
fn decode(req_id: &str, event_version: &str, payload: Value) -> Result<TransferEvent, LogError> {
    eventlog::decode_transfer(event_version, payload).map_err(|e| LogError::Undecodable {
        req_id: req_id.to_owned(),
        problem: e.to_string(),
    })
}

/// One transfer's events, in order, from the event log itself (not the feed: events above the
/// projector's commit watermark are included).
pub async fn transfer_events(pool: &PgPool, req_id: &str) -> Result<Vec<LoggedEvent>, LogError> {
    let rows = eventlog::transfers::transfer_events(pool, req_id).await?;
    rows.into_iter()
        .enumerate()
        .map(|(i, row)| {
            // Read back dense: sequences 1, 2, ... (see `dense`).
            if usize::try_from(row.sequence).ok() != Some(i + 1) {
                return Err(LogError::Undecodable {
                    req_id: req_id.to_owned(),
                    problem: format!("expected sequence {}, read {}", i + 1, row.sequence),
                });
            }
            let event = decode(req_id, &row.event_version, row.payload)?;
            Ok(LoggedEvent {
                sequence: row.sequence,
                event_type: row.event_type,
                event_version: row.event_version,
                event,
                global_position: row.global_position,
            })
        })
        .collect()
}

/// A transfer as the conservation check sees it (the core's type).
pub use application::stores::AuditTransfer;

/// The conservation check's read of the log, in one REPEATABLE READ snapshot: that snapshot's watermark
/// (`pg_snapshot_xmin`: every event below it is committed or aborted for good), and every
/// transfer with an event whose transaction id is at or above `since` (0: every transfer) or
/// whose req_id is in `ids` (the conservation check's open transfers), each read by key. Its cost follows the
/// events after `since` plus `ids`, not the log's length.
pub async fn audit_transfers(
    pool: &PgPool,
    since: u64,
    ids: &[String],
) -> Result<(u64, Vec<AuditTransfer>), LogError> {
    let started = std::time::Instant::now();
    let (mut tx, watermark) = crate::audit::begin_snapshot(pool, since).await?;
    // Streamed and decoded row by row: the JSON trees of every transfer's two payloads, held
    // whole, were most of a full check's memory (about 4 KB per transfer, measured by
    // `ledger-bench growth`).
    let mut transfers = Vec::new();
    let mut rows = eventlog::transfers::audit_transfers(&mut tx, since, ids);
    while let Some(eventlog::transfers::AuditRow {
        req_id,
        created,
        created_version,
        created_tx,
        last,
        last_version,
    }) = rows.try_next().await?
    {
        let created = decode(&req_id, &created_version, created)?;
        if !matches!(created, TransferEvent::TransferCreated { .. }) {
            return Err(LogError::Undecodable {
                req_id,
                problem: "first event is not TransferCreated".into(),
            });
        }
        let state = decode(&req_id, &last_version, last)?.resulting_state();
        transfers.push(AuditTransfer {
            req_id,
            created,
            created_tx: u64::try_from(created_tx).unwrap_or(0),
            state,
        });
    }
    drop(rows);
    tx.commit().await?;
    tracing::debug!(
        ids = ids.len(),
        transfers = transfers.len(),
        took_ms = started.elapsed().as_millis(),
        "the conservation check's read of the log"
    );
    Ok((watermark, transfers))
}
