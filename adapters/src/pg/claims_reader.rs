//! The client keys' claims read together (issue 49): every request with a `cid` asks whether
//! its key is claimed before anything else (a repeat is answered first, contract §5.5 step 7),
//! and each ask was a statement of its own on a pooled connection, one per transfer. The asks
//! now queue into one reader (the group-commit skeleton, `adapters::group_commit`, as the
//! receipts' reader uses it): a lone ask goes out at once, and those that arrive while a read is
//! in flight go in the next one, as one statement on a connection the reader keeps. Each read
//! starts after every ask it carries was queued, so it sees every claim committed before the
//! request asked, as its own statement would have.

use std::collections::HashMap;

use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::group_commit::{Committer, GroupCommit, KeptConnection};

/// Asks waiting beyond this make their callers wait to queue (back-pressure).
const QUEUE_LENGTH_MAX: usize = 4096;
/// Most asks one read carries.
const BATCH_MAX: usize = 512;

/// A claim as stored: its req_id and fingerprint, or why the read failed (shared by a batch).
pub(crate) type Found = Result<Option<(String, String)>, String>;

pub(crate) struct Ask {
    user: i64,
    cid: String,
    reply: oneshot::Sender<Found>,
}

/// The reader: one statement for everything queued, on a kept connection.
pub(crate) struct Reader {
    conn: KeptConnection,
}

impl Committer for Reader {
    type Job = Ask;

    async fn commit(&mut self, batch: &mut Vec<Ask>) {
        let users: Vec<i64> = batch.iter().map(|a| a.user).collect();
        let cids: Vec<&str> = batch.iter().map(|a| a.cid.as_str()).collect();
        let read = match self.conn.take().await {
            Ok(mut conn) => {
                let read: Result<Vec<(i64, String, String, String)>, sqlx::Error> = sqlx::query_as(
                    "SELECT c.user_id, c.cid, c.req_id, c.fingerprint
                           FROM transfer_cids c
                           JOIN unnest($1::bigint[], $2::text[]) AS k (u, cid)
                             ON c.user_id = k.u AND c.cid = k.cid",
                )
                .bind(&users)
                .bind(&cids)
                .fetch_all(&mut *conn)
                .await;
                if read.is_ok() {
                    self.conn.keep(conn);
                }
                read
            }
            Err(e) => Err(e),
        };
        match read {
            Ok(rows) => {
                let found: HashMap<(i64, String), (String, String)> = rows
                    .into_iter()
                    .map(|(u, c, r, f)| ((u, c), (r, f)))
                    .collect();
                for ask in batch.drain(..) {
                    let claim = found.get(&(ask.user, ask.cid)).cloned();
                    let _ = ask.reply.send(Ok(claim));
                }
            }
            Err(e) => {
                let error = e.to_string();
                for ask in batch.drain(..) {
                    let _ = ask.reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Starts the reader over `pool` on the current runtime.
pub(crate) fn start(pool: &PgPool) -> GroupCommit<Ask> {
    GroupCommit::start_untraced(
        Reader {
            conn: KeptConnection::new(pool.clone()),
        },
        QUEUE_LENGTH_MAX,
        BATCH_MAX,
    )
}

/// The claim of `cid` for `user`, read with whatever else is asked meanwhile.
pub(crate) async fn find(reader: &GroupCommit<Ask>, user: i64, cid: &str) -> Found {
    reader
        .ask(|reply| Ask {
            user,
            cid: cid.to_owned(),
            reply,
        })
        .await
        .map_err(|e| e.to_string())?
}
