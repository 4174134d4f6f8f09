//! The follower: the tree's one writer. Each pass, in one transaction under an advisory lock
//! (one follower at a time across processes, as the projector), reads the events after the
//! tree's size in feed order, takes them while their positions are dense and their transactions
//! are below the commit watermark (positions are handed out in commit order under the feed's lock,
//! so nothing can appear below a taken one later), hashes their leaves, appends the hashes of every
//! subtree they complete at a tile level to its tile (one upsert per touched tile), stores the new
//! right edge, and signs a checkpoint every `checkpoint_events` events or
//! `checkpoint_interval`. Appends never wait for it: it only reads the event table.
//!
//! It never signs a tree that does not extend the last checkpoint it signed (or the newest
//! stored one it found when it began): before each signature it checks a consistency proof from
//! that checkpoint, so a log cut or rewritten in the database while the ledger runs is refused
//! with a CRITICAL log line instead of being re-signed with the real key.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tlog::{
    consistency_plan, leaf_hash, verify_consistency, Checkpoint, Hash, RightEdge, Signer, Subtree,
};

use crate::copy::{fields, for_each_line, CopyEntry};
use crate::store::{self, Head};
use crate::LogError;

/// The advisory lock the follower holds while it writes ('LEDGER' 0004; the projector's are
/// 0001 and 0002, the feed's 0003).
pub const FOLLOWER_LOCK_KEY: i64 = 0x4c45_4447_4552_0004;

/// The most events one pass adds (streamed: the pass holds their hashes, not their rows).
pub const BATCH_EVENTS_MAX: i64 = 20_000;

/// How long the follower sleeps after a pass that did not fill [`BATCH_EVENTS_MAX`]. Nobody
/// waits on the tree between checkpoints (a proof is asked against a signed size, at most
/// every `checkpoint_interval`), so it trades lag no one sees for fewer passes: each pass has
/// a fixed cost (its transaction and lock, the head row, the partial tiles rewritten, a
/// commit), paid 4 times a second under load instead of 20 (`docs/perf-log.md`).
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Default: a checkpoint at least every this many events...
pub const CHECKPOINT_EVENTS_DEFAULT: u64 = 10_000;
/// ... or this often, when the tree grew.
pub const CHECKPOINT_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);

/// What the follower signs with and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerConfig {
    /// The signing identity; its key name is the log's origin.
    pub signer: Signer,
    pub checkpoint_events: u64,
    pub checkpoint_interval: Duration,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Entries added to the tree.
    pub added: u64,
    /// The tree's size after it.
    pub size: u64,
    /// The size of the checkpoint it signed, if it signed one.
    pub checkpoint: Option<u64>,
}

/// The tree's writer over one database.
#[derive(Debug, Clone)]
pub struct Follower {
    pool: PgPool,
    config: FollowerConfig,
    /// The last checkpoint (size, root) signed or found stored by this follower: every later
    /// one must extend it.
    anchor: Arc<Mutex<Option<(u64, Hash)>>>,
}

impl Follower {
    pub fn new(pool: PgPool, config: FollowerConfig) -> Self {
        Self {
            pool,
            config,
            anchor: Arc::default(),
        }
    }

    /// One pass (see the module's comment).
    pub async fn pass(&self) -> Result<Pass, LogError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(FOLLOWER_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        let interval_ms =
            i64::try_from(self.config.checkpoint_interval.as_millis()).unwrap_or(i64::MAX);
        let mut head = store::lock_head(&mut tx, interval_ms).await?;
        let (origin, vkey) = self.identity(&head)?;
        // Only subtrees at tile levels are stored: about one per leaf.
        let mut completed: Vec<(Subtree, Hash)> = Vec::new();
        let added = extend_with_settled(&mut tx, &mut head.edge, &mut completed).await?;
        let appends = tlog::tile::tile_appends(&completed);
        if !appends.is_empty() {
            store::append_tiles(&mut tx, &appends).await?;
        }
        let checkpoint = self.checkpoint_if_due(&mut tx, &head, &origin).await?;
        if added > 0 || checkpoint.is_some() || head.origin.is_none() {
            store::write_head(&mut tx, &origin, &vkey, &head.edge, checkpoint.is_some()).await?;
        }
        tx.commit().await?;
        Ok(Pass {
            added,
            size: head.edge.size(),
            checkpoint,
        })
    }

    /// The origin and verifier key to store: the configured ones, refused when the tree was
    /// signed by another identity (a changed key or origin would fork the log's history).
    fn identity(&self, head: &Head) -> Result<(String, String), LogError> {
        let origin = self.config.signer.name().to_owned();
        let vkey = self.config.signer.verifier().to_vkey();
        match (&head.origin, &head.vkey) {
            (Some(o), Some(v)) if (o, v) != (&origin, &vkey) => Err(LogError::Identity(format!(
                "the log is signed as {v}; the configured key is {vkey}: refusing to sign with it"
            ))),
            _ => Ok((origin, vkey)),
        }
    }

    /// Signs and stores a checkpoint of the tree as it now is when none exists yet, when
    /// `checkpoint_events` were added since the last one, or when the interval passed and the
    /// tree grew. Returns its size.
    async fn checkpoint_if_due(
        &self,
        conn: &mut PgConnection,
        head: &Head,
        origin: &str,
    ) -> Result<Option<u64>, LogError> {
        let size = head.edge.size();
        let due = match store::last_checkpoint_size(conn).await? {
            None => true,
            Some(last) if last == size => false,
            Some(last) => head.time_due || size - last >= self.config.checkpoint_events.max(1),
        };
        if !due {
            return Ok(None);
        }
        let root = head.edge.root();
        self.check_extends_anchor(conn, size, &root).await?;
        let body = Checkpoint {
            origin: origin.to_owned(),
            size,
            root,
        }
        .to_text();
        let note = self
            .config
            .signer
            .sign(&body)
            .map_err(|e| LogError::Identity(format!("cannot sign a checkpoint: {e}")))?;
        store::insert_checkpoint(conn, size, &root, &note).await?;
        *self.anchor.lock().expect("anchor lock") = Some((size, root));
        Ok(Some(size))
    }

    /// Refuses a tree of `size` and `root` that does not extend the anchor: the last checkpoint
    /// this follower signed, or else the newest one stored (taken as the anchor the first time).
    async fn check_extends_anchor(
        &self,
        conn: &mut PgConnection,
        size: u64,
        root: &Hash,
    ) -> Result<(), LogError> {
        let remembered = *self.anchor.lock().expect("anchor lock");
        let anchor = match remembered {
            Some(anchor) => Some(anchor),
            None => store::last_checkpoint(conn).await?,
        };
        let Some((old_size, old_root)) = anchor else {
            return Ok(());
        };
        if size < old_size {
            return Err(LogError::Rewritten(format!(
                "the tree has {size} entries but a checkpoint of {old_size} was signed"
            )));
        }
        let plan = consistency_plan(old_size, size).expect("old_size <= size");
        let proof = crate::proofs::resolve_on(conn, &plan, &[])
            .await
            .map_err(|e| {
                LogError::Rewritten(format!("no consistency proof from {old_size}: {e}"))
            })?;
        if !verify_consistency(old_size, size, &old_root, root, &proof) {
            return Err(LogError::Rewritten(format!(
                "the tree of {size} entries does not extend the checkpoint of {old_size}"
            )));
        }
        Ok(())
    }

    /// Follows the log forever: a pass, then a short sleep when there was nothing to add. A
    /// store error is logged and retried with bounded backoff; a signing identity that does not
    /// match the stored tree's ends the task (the server stops on it: start-up's rule).
    pub async fn run(self) {
        let mut backoff = POLL_INTERVAL;
        loop {
            match self.pass().await {
                Ok(pass) => {
                    backoff = POLL_INTERVAL;
                    if let Some(size) = pass.checkpoint {
                        tracing::debug!(size, "tamper-evident log checkpoint signed");
                    }
                    if (pass.added as i64) < BATCH_EVENTS_MAX {
                        tokio::time::sleep(POLL_INTERVAL).await;
                    }
                }
                Err(LogError::Identity(why)) => {
                    tracing::error!(%why, "tamper-evident log follower stops");
                    return;
                }
                Err(LogError::Rewritten(why)) => {
                    tracing::error!(
                        code = "LOG_REWRITTEN",
                        %why,
                        "CRITICAL: the tamper-evident log was rewritten; nothing is signed"
                    );
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "tamper-evident log pass failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// Pushes onto `edge` the leaf hashes of the entries after its size, in feed order, up to
/// [`BATCH_EVENTS_MAX`]: those whose positions follow on from it without a gap and whose
/// transactions are below the commit watermark. Each subtree completed at a tile level goes to
/// `completed`. The entries come in one COPY stream and are hashed as they arrive, each leaf
/// built in one reused buffer. Returns how many were added.
async fn extend_with_settled(
    conn: &mut PgConnection,
    edge: &mut RightEdge,
    completed: &mut Vec<(Subtree, Hash)>,
) -> Result<u64, LogError> {
    let after = edge.size() as i64;
    // COPY takes no parameters; both values are integers of ours. Only settled entries are
    // sent: one not yet settled is absent, so the first gap in positions ends the pass there,
    // and a long-open transaction holding the watermark back does not have every pass read and
    // drop the whole batch behind it.
    let query = eventlog::entries::copy_settled_after(after, BATCH_EVENTS_MAX);
    let stream = conn.copy_out_raw(&query).await?;
    let mut leaf = Vec::new();
    let mut added = 0u64;
    let outcome: Result<(), String> = for_each_line(stream, |line| {
        let row = CopyEntry::read(&mut fields(line))?;
        if row.position != after + 1 + added as i64 {
            return Ok(false);
        }
        row.entry().write_leaf(&mut leaf);
        edge.push(leaf_hash(&leaf), |s, h| {
            if tlog::tile::is_stored(s) {
                completed.push((s, h));
            }
        });
        added += 1;
        Ok(true)
    })
    .await?;
    outcome.map_err(|why| LogError::Corrupt(format!("an entry after {after}: {why}")))?;
    Ok(added)
}
