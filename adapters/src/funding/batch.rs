//! Group commit for fresh funding movements: the movements of concurrent transfers are decided
//! and applied by one call of `funding_fresh_movements` (migration 0008), one statement and one
//! commit for all of them. Each caller still hears its own movement's outcome only after that
//! commit is durable, and each movement is still all-or-nothing with its journal row.

use domain::Movement;
use rust_decimal::Decimal;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::{mpsc, oneshot};

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

/// The queue into one batcher task.
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::Sender<Job>,
}

impl Batcher {
    /// Starts the batcher task on the current tokio runtime.
    pub fn start(pool: PgPool) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE_LENGTH_MAX);
        tokio::spawn(run(pool, rx));
        Self { queue }
    }

    /// Decides one movement with whatever else is waiting, and answers once that is durable.
    pub async fn submit(&self, op: &'static str, m: &Movement) -> Answer {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            op,
            req_id: m.req_id.to_string(),
            user_id: m.user_id.as_i64(),
            asset: m.asset.as_str().to_owned(),
            amount: m.amount.value(),
            reply,
        };
        self.queue
            .send(job)
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?;
        answer.await.map_err(|_| sqlx::Error::WorkerCrashed)?
    }
}

async fn run(pool: PgPool, mut rx: mpsc::Receiver<Job>) {
    let mut jobs = Vec::with_capacity(BATCH_MAX);
    // Kept between batches, given up after any error (as the event appender does).
    let mut conn: Option<PoolConnection<Postgres>> = None;
    // Whatever is waiting goes together: batches grow with load, a lone movement goes at once.
    while rx.recv_many(&mut jobs, BATCH_MAX).await > 0 {
        // Every batch locks its accounts in one order, so two batches (two ledger processes)
        // never wait on each other in a cycle.
        jobs.sort_by(|a, b| (a.user_id, &a.asset).cmp(&(b.user_id, &b.asset)));
        let held = match conn.take() {
            Some(held) => Ok(held),
            None => pool.acquire().await,
        };
        let result = match held {
            Ok(mut held) => {
                let result = decide(&mut held, &jobs).await;
                if result.is_ok() {
                    conn = Some(held);
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
                // its own caller. Concurrently, so an outage costs one timeout, not one each.
                tracing::warn!(error = %e, movements = jobs.len(), "funding batch failed; deciding each movement alone");
                for job in jobs.drain(..) {
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        let result = match pool.acquire().await {
                            Ok(mut conn) => decide(&mut conn, std::slice::from_ref(&job))
                                .await
                                .map(|mut d| d.pop().flatten()),
                            Err(e) => Err(e),
                        };
                        let _ = job.reply.send(result);
                    });
                }
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
