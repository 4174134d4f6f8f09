//! The feed positions a transfer answer carries (its receipt in the tamper-evident log), read
//! together for the single route's concurrent answers: `application::reads::ReceiptPositions`
//! over PostgreSQL.
//!
//! Every single-transfer answer read its own positions, one statement and one pool acquire
//! (with its check, a statement of its own) per request: at 32 clients those two were 2.0 of the
//! 2.5 statements PostgreSQL ran per transfer (`docs/perf-log.md`, issue 35). The lookups now
//! queue into one reader (the group-commit skeleton, `adapters::group_commit`, used for a read):
//! a lone lookup goes out at once, and those that arrive while a read is in flight go in the
//! next one, as one `= ANY($1)` statement on a connection the reader keeps between reads. A
//! lookup of several transfers at once (the bulk route's answer) is one statement already and
//! goes straight to the pool.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use application::reads::ReceiptPositions;
use application::StoreError;
use async_trait::async_trait;
use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::group_commit::{Committer, GroupCommit, KeptConnection};

/// Lookups waiting beyond this make their callers wait to queue (back-pressure).
const QUEUE_LENGTH_MAX: usize = 4096;
/// Most lookups one read carries.
const BATCH_MAX: usize = 512;

/// One transfer's positions, or why they could not be read (one failure shared by the batch).
type Answer = Result<Vec<i64>, StoreError>;

struct Lookup {
    req_id: String,
    reply: oneshot::Sender<Answer>,
}

/// The reader: one statement for everything queued, on a kept connection.
struct Reader {
    conn: KeptConnection,
}

impl Committer for Reader {
    type Job = Lookup;

    async fn commit(&mut self, batch: &mut Vec<Lookup>) {
        let req_ids: Vec<String> = batch.iter().map(|l| l.req_id.clone()).collect();
        let read = match self.conn.take().await {
            Ok(mut conn) => {
                let read = tlog_follower::entries::positions_of(&mut *conn, &req_ids).await;
                if read.is_ok() {
                    self.conn.keep(conn);
                }
                read
            }
            Err(e) => Err(e),
        };
        match read {
            Ok(found) => {
                // Looked up, not taken: two lookups of one transfer in one read (its answer and
                // a GET of it at the same moment) each get its positions.
                for lookup in batch.drain(..) {
                    let positions = found.get(&lookup.req_id).cloned().unwrap_or_default();
                    let _ = lookup.reply.send(Ok(positions));
                }
            }
            Err(e) => {
                let error = StoreError::new(e);
                for lookup in batch.drain(..) {
                    let _ = lookup.reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// The receipts' reads over one database. Cheap to clone; the reader starts at the first
/// single lookup, on the runtime serving it, and stops when the last clone is dropped.
#[derive(Clone)]
pub struct Receipts {
    pool: PgPool,
    reader: Arc<OnceLock<GroupCommit<Lookup>>>,
}

impl Receipts {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            reader: Arc::default(),
        }
    }

    /// The feed positions of each transfer's events, in sequence order, by req_id (a req_id
    /// without events is absent).
    pub async fn positions_of(
        &self,
        req_ids: &[String],
    ) -> Result<HashMap<String, Vec<i64>>, StoreError> {
        let [req_id] = req_ids else {
            return tlog_follower::entries::positions_of(&self.pool, req_ids)
                .await
                .map_err(StoreError::new);
        };
        let reader = self.reader.get_or_init(|| {
            GroupCommit::start_untraced(
                Reader {
                    conn: KeptConnection::new(self.pool.clone()),
                },
                QUEUE_LENGTH_MAX,
                BATCH_MAX,
            )
        });
        let req_id = req_id.clone();
        let positions = reader
            .ask(|reply| Lookup {
                req_id: req_id.clone(),
                reply,
            })
            .await
            .map_err(StoreError::new)??;
        Ok(if positions.is_empty() {
            HashMap::new()
        } else {
            HashMap::from([(req_id, positions)])
        })
    }
}

#[async_trait]
impl ReceiptPositions for Receipts {
    async fn positions_of(
        &self,
        req_ids: &[String],
    ) -> Result<HashMap<String, Vec<i64>>, StoreError> {
        Receipts::positions_of(self, req_ids).await
    }
}
