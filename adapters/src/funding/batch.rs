//! Group commit for fresh funding movements: the movements of concurrent transfers are decided
//! and applied by one call of `funding_fresh_movements` (migration 0008), one statement and one
//! commit for all of them. Each caller still hears its own movement's outcome only after that
//! commit is durable, and each movement is still all-or-nothing with its journal row. A caller
//! may bring many movements at once (a bulk request's): they go into the same call.

use domain::{Movement, Operation};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use tokio::sync::oneshot;

use crate::group_commit::{Committer, GroupCommit, KeptConnection};

/// Most callers (jobs) one batch takes; their movements are decided in calls of at most
/// `CALL_MOVEMENTS_MAX`.
const BATCH_MAX: usize = 256;
/// Callers waiting for the batcher before a caller itself waits (back-pressure).
const QUEUE_LENGTH_MAX: usize = 4096;

/// What the journal says was decided for a movement claimed by this call.
#[derive(Debug)]
pub(crate) struct Decided {
    pub outcome: String,
    pub code: Option<String>,
    pub moved: i64,
}

/// `None`: the key was claimed before; nothing changed.
type Answer = Result<Option<Decided>, sqlx::Error>;

/// One movement to decide.
struct Item {
    op: Operation,
    req_id: String,
    user_id: i64,
    asset: String,
    amount: Decimal,
}

impl Item {
    fn of(op: Operation, m: &Movement) -> Self {
        Self {
            op,
            req_id: m.req_id.to_string(),
            user_id: m.user_id.as_i64(),
            asset: m.asset.as_str().to_owned(),
            amount: m.amount.value(),
        }
    }
}

/// One caller's movements (one, or a bulk request's many) and where their answers go, in order.
struct Job {
    items: Vec<Item>,
    reply: oneshot::Sender<Vec<Answer>>,
}

/// The queue into one batcher task (see `group_commit`: the task is owned by the handles).
#[derive(Clone)]
pub(super) struct Batcher {
    queue: GroupCommit<Job>,
}

impl Batcher {
    /// Starts the batcher task on the current tokio runtime.
    pub fn start(pool: PgPool) -> Self {
        let committer = FundingCommitter {
            conn: KeptConnection::new(pool),
        };
        Self {
            queue: GroupCommit::start("funding.batch", committer, QUEUE_LENGTH_MAX, BATCH_MAX),
        }
    }

    /// Decides one movement with whatever else is waiting, and answers once that is durable.
    pub async fn submit(&self, op: Operation, m: &Movement) -> Answer {
        let mut answers = self.submit_many(vec![(op, m)]).await;
        answers.pop().unwrap_or(Err(sqlx::Error::WorkerCrashed))
    }

    /// Decides many movements in the same call (with whatever else is waiting), one answer per
    /// movement in order, once that call is durable.
    pub async fn submit_many(&self, movements: Vec<(Operation, &Movement)>) -> Vec<Answer> {
        let count = movements.len();
        let items = movements
            .into_iter()
            .map(|(op, m)| Item::of(op, m))
            .collect();
        match self.queue.ask(|reply| Job { items, reply }).await {
            Ok(answers) if answers.len() == count => answers,
            _ => (0..count)
                .map(|_| Err(sqlx::Error::WorkerCrashed))
                .collect(),
        }
    }
}

struct FundingCommitter {
    conn: KeptConnection,
}

impl Committer for FundingCommitter {
    type Job = Job;

    async fn commit(&mut self, jobs: &mut Vec<Job>) {
        // Every movement of the batch, each with its (job, position), in one lock order: sorted
        // by account, so two batches (two ledger processes) never wait on each other in a cycle.
        let mut order: Vec<(usize, usize)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, job)| (0..job.items.len()).map(move |i| (j, i)))
            .collect();
        order.sort_by(|&(ja, ia), &(jb, ib)| {
            let (a, b) = (&jobs[ja].items[ia], &jobs[jb].items[ib]);
            (a.user_id, &a.asset).cmp(&(b.user_id, &b.asset))
        });
        let mut answers: Vec<Vec<Option<Answer>>> = jobs
            .iter()
            .map(|job| job.items.iter().map(|_| None).collect())
            .collect();
        for part in order.chunks(CALL_MOVEMENTS_MAX) {
            let items: Vec<&Item> = part.iter().map(|&(j, i)| &jobs[j].items[i]).collect();
            for (k, answer) in self.decide_part(&items).await.into_iter().enumerate() {
                let (j, i) = part[k];
                answers[j][i] = Some(answer);
            }
        }
        for (job, answers) in jobs.drain(..).zip(answers) {
            let answers = answers
                .into_iter()
                .map(|a| a.unwrap_or(Err(sqlx::Error::WorkerCrashed)))
                .collect();
            let _ = job.reply.send(answers);
        }
    }
}

/// Most movements one call of `funding_fresh_movements` decides (a batch of bulk requests is
/// split into calls of this size, each in the batch's one lock order).
const CALL_MOVEMENTS_MAX: usize = 4096;

impl FundingCommitter {
    /// Decides `items` in one call, answering in their order; when the call fails, each movement
    /// alone, so one movement's own error reaches only its own caller.
    async fn decide_part(&mut self, items: &[&Item]) -> Vec<Answer> {
        let result = match self.conn.take().await {
            Ok(mut held) => {
                let result = decide(&mut held, items).await;
                if result.is_ok() {
                    self.conn.keep(held);
                }
                result
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(decided) => decided.into_iter().map(Ok).collect(),
            Err(e) if items.len() == 1 => vec![Err(e)],
            Err(e) => {
                // Nothing of the call was applied, unless the connection died during its commit;
                // either way each movement alone is safe to decide again (a committed claim
                // answers with its first decision). Concurrently, so an outage costs one timeout,
                // not one each; the batch waits for all of them, so no task outlives it.
                tracing::warn!(error = %e, movements = items.len(), "funding batch failed; deciding each movement alone");
                let pool = self.conn.pool().clone();
                let alone = items.iter().map(|item| {
                    let pool = pool.clone();
                    async move {
                        match pool.acquire().await {
                            Ok(mut conn) => decide(&mut conn, &[*item])
                                .await
                                .map(|mut d| d.pop().flatten()),
                            Err(e) => Err(e),
                        }
                    }
                });
                futures_util::future::join_all(alone).await
            }
        }
    }
}

/// Decides `movements` in one call of `funding_fresh_movements` on `conn`, inside whatever
/// transaction it is in (ADR 0024: the event appender's), in their order: the caller sorts them
/// into the one lock order (by account). `None` for a movement whose key was claimed before.
pub(crate) async fn decide_in(
    conn: &mut PgConnection,
    movements: &[(Operation, &Movement)],
) -> Result<Vec<Option<Decided>>, sqlx::Error> {
    let items: Vec<Item> = movements.iter().map(|(op, m)| Item::of(*op, m)).collect();
    let refs: Vec<&Item> = items.iter().collect();
    decide(conn, &refs).await
}

/// One autocommit call for every job: atomic, and durable when it returns. Answers in job order.
async fn decide(
    conn: &mut PgConnection,
    jobs: &[&Item],
) -> Result<Vec<Option<Decided>>, sqlx::Error> {
    let ops: Vec<&str> = jobs.iter().map(|j| j.op.as_str()).collect();
    let req_ids: Vec<&str> = jobs.iter().map(|j| j.req_id.as_str()).collect();
    let user_ids: Vec<i64> = jobs.iter().map(|j| j.user_id).collect();
    let assets: Vec<&str> = jobs.iter().map(|j| j.asset.as_str()).collect();
    let amounts: Vec<Decimal> = jobs.iter().map(|j| j.amount).collect();
    let rows: Vec<(i32, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT idx, outcome, code, moved FROM funding_fresh_movements($1, $2, $3, $4, $5)",
    )
    .bind(&ops)
    .bind(&req_ids)
    .bind(&user_ids)
    .bind(&assets)
    .bind(&amounts)
    .fetch_all(conn)
    .await?;
    let mut answers: Vec<Option<Decided>> = jobs.iter().map(|_| None).collect();
    for (idx, outcome, code, moved) in rows {
        let slot = usize::try_from(idx)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| answers.get_mut(i))
            .ok_or_else(|| sqlx::Error::Protocol(format!("movement index {idx} out of range")))?;
        // Received input: one decision per movement. A second row for one index would answer
        // a movement with whichever came last; refused as the call's error (each movement is
        // then decided alone, `decide_part`).
        if slot.is_some() {
            return Err(sqlx::Error::Protocol(format!(
                "movement index {idx} decided twice"
            )));
        }
        *slot = Some(Decided {
            outcome,
            code,
            moved,
        });
    }
    Ok(answers)
}
