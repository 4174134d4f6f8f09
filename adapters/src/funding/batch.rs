//! Group commit for fresh funding movements: the movements of concurrent transfers are decided
//! and applied by one call of `funding_fresh_movements` (migration 0008), one statement and one
//! commit for all of them. Each caller still hears its own movement's outcome only after that
//! commit is durable, and each movement is still all-or-nothing with its journal row.

use domain::Movement;
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use tokio::sync::oneshot;

use crate::group_commit::{Committer, GroupCommit, KeptConnection};

/// Most movements one call decides.
const BATCH_MAX: usize = 256;
/// Movements waiting for the batcher before a caller itself waits (back-pressure).
const QUEUE_LENGTH_MAX: usize = 4096;

/// What the journal says was decided for a movement claimed by this call.
#[derive(Debug)]
pub(super) struct Decided {
    pub outcome: String,
    pub code: Option<String>,
    pub moved: i64,
}

/// `None`: the key was claimed before; nothing changed.
type Answer = Result<Option<Decided>, sqlx::Error>;

struct Job {
    op: &'static str,
    req_id: String,
    user_id: i64,
    asset: String,
    amount: Decimal,
    reply: oneshot::Sender<Answer>,
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
            queue: GroupCommit::start(committer, QUEUE_LENGTH_MAX, BATCH_MAX),
        }
    }

    /// Decides one movement with whatever else is waiting, and answers once that is durable.
    pub async fn submit(&self, op: &'static str, m: &Movement) -> Answer {
        self.queue
            .ask(|reply| Job {
                op,
                req_id: m.req_id.to_string(),
                user_id: m.user_id.as_i64(),
                asset: m.asset.as_str().to_owned(),
                amount: m.amount.value(),
                reply,
            })
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
    }
}

struct FundingCommitter {
    conn: KeptConnection,
}

impl Committer for FundingCommitter {
    type Job = Job;

    async fn commit(&mut self, jobs: &mut Vec<Job>) {
        // Every batch locks its accounts in one order, so two batches (two ledger processes)
        // never wait on each other in a cycle.
        jobs.sort_by(|a, b| (a.user_id, &a.asset).cmp(&(b.user_id, &b.asset)));
        let result = match self.conn.take().await {
            Ok(mut held) => {
                let result = decide(&mut held, jobs).await;
                if result.is_ok() {
                    self.conn.keep(held);
                }
                result
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(mut decided) => {
                for (i, job) in jobs.drain(..).enumerate() {
                    let _ = job.reply.send(Ok(decided[i].take()));
                }
            }
            Err(e) if jobs.len() == 1 => {
                let job = jobs.pop().expect("one job");
                let _ = job.reply.send(Err(e));
            }
            Err(e) => {
                // Nothing of the call was applied, unless the connection died during its commit;
                // either way each movement alone is safe to decide again (a committed claim
                // answers with its first decision). Alone, one movement's own error reaches only
                // its own caller. Concurrently, so an outage costs one timeout, not one each;
                // the batch waits for all of them, so no task outlives it.
                tracing::warn!(error = %e, movements = jobs.len(), "funding batch failed; deciding each movement alone");
                let pool = self.conn.pool().clone();
                let alone = jobs.drain(..).map(|job| {
                    let pool = pool.clone();
                    async move {
                        let result = match pool.acquire().await {
                            Ok(mut conn) => decide(&mut conn, std::slice::from_ref(&job))
                                .await
                                .map(|mut d| d.pop().flatten()),
                            Err(e) => Err(e),
                        };
                        let _ = job.reply.send(result);
                    }
                });
                futures_util::future::join_all(alone).await;
            }
        }
    }
}

/// One autocommit call for every job: atomic, and durable when it returns. Answers in job order.
async fn decide(
    conn: &mut PgConnection,
    jobs: &[Job],
) -> Result<Vec<Option<Decided>>, sqlx::Error> {
    let ops: Vec<&str> = jobs.iter().map(|j| j.op).collect();
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
        *slot = Some(Decided {
            outcome,
            code,
            moved,
        });
    }
    Ok(answers)
}
