//! `LogReads`: the routes' one handle on the stored log, built over the database at start-up,
//! so the HTTP side reads proofs, entries and checkpoints without holding a pool.

use sqlx::PgPool;

use crate::entries::{self, EntryRow, ReceiptEntry};
use crate::proofs::{self, Inclusion, ProofError, TreeHead};
use crate::LogError;

/// How far the tree is behind the feed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogLag {
    /// Entries in the tree.
    pub tree_size: i64,
    /// Feed positions handed out and not yet in the tree.
    pub positions: i64,
    /// Age of the oldest feed entry not yet in the tree (0 when none).
    pub seconds: f64,
}

/// The tamper-evident log's reads. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LogReads {
    pool: PgPool,
    /// The cell whose log this is, under a cell map (`None`: a ledger without one).
    cell: Option<u16>,
}

impl LogReads {
    /// Over the ledger's database.
    pub fn new(pool: PgPool) -> Self {
        Self { pool, cell: None }
    }

    /// The same reads, of cell `cell`'s log (its own database, tree, origin and key).
    pub fn of_cell(self, cell: u16) -> Self {
        Self {
            cell: Some(cell),
            ..self
        }
    }

    /// The cell whose log this is, under a cell map.
    pub fn cell(&self) -> Option<u16> {
        self.cell
    }

    /// The tree's size, root and signing identity now.
    pub async fn head(&self) -> Result<TreeHead, LogError> {
        proofs::head(&self.pool).await
    }

    /// How far the tree is behind the feed, once a follower has ever signed it (`None` for a
    /// log never kept: a ledger without a signing key).
    pub async fn lag(&self) -> Result<Option<LogLag>, sqlx::Error> {
        let row = eventlog::lag::tree_lag(&self.pool).await?;
        Ok(row.map(|(size, head, seconds)| LogLag {
            tree_size: size,
            positions: (head - size).max(0),
            seconds: seconds.max(0.0),
        }))
    }

    /// The newest signed checkpoint's note text, if any.
    pub async fn latest_checkpoint(&self) -> Result<Option<String>, LogError> {
        proofs::latest_checkpoint(&self.pool).await
    }

    /// The entry at feed position `position`, if the log has one there.
    pub async fn entry_at(&self, position: i64) -> Result<Option<EntryRow>, LogError> {
        Ok(entries::at(&self.pool, position).await?)
    }

    /// The feed positions of one transfer's events.
    pub async fn of_transfer(&self, req_id: &str) -> Result<Vec<ReceiptEntry>, LogError> {
        Ok(entries::of_transfer(&self.pool, req_id).await?)
    }

    /// The audit path of the entry at `position` in the tree of `size` entries.
    pub async fn inclusion(&self, position: u64, size: u64) -> Result<Inclusion, ProofError> {
        proofs::inclusion(&self.pool, position, size).await
    }

    /// The proof that the tree of `to` entries extends the tree of `from`.
    pub async fn consistency(&self, from: u64, to: u64) -> Result<Vec<tlog::Hash>, ProofError> {
        proofs::consistency(&self.pool, from, to).await
    }
}
