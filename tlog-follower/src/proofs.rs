//! What the log routes read: the newest signed checkpoint, an entry's exact leaf, inclusion and
//! consistency proofs folded from stored subtree hashes (O(log n) tile slices in one query; a
//! subtree between tile levels is folded in memory from the at most 128 stored hashes under it;
//! no leaf or event is read or hashed again), and the stored signing identity.

use sqlx::PgPool;
use tlog::proof::PlanError;
use tlog::{consistency_plan, inclusion_plan, Hash, ProofPlan};

pub use crate::store::TreeHead;
use crate::{store, LogError};

/// Why a proof cannot be given.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    /// The size asked for is beyond the tree (it has not grown that far yet).
    #[error("the tree has {size} entries")]
    BeyondTree { size: u64 },
    /// The position is not inside the size, or `from` is above `to`.
    #[error("out of range")]
    OutOfRange,
    #[error(transparent)]
    Log(#[from] LogError),
}

impl From<sqlx::Error> for ProofError {
    fn from(e: sqlx::Error) -> Self {
        Self::Log(e.into())
    }
}

/// The tree's size and identity.
pub async fn head(pool: &PgPool) -> Result<TreeHead, LogError> {
    let mut conn = pool.acquire().await?;
    store::tree_head(&mut conn).await
}

/// The newest signed checkpoint's note, if any was made.
pub async fn latest_checkpoint(pool: &PgPool) -> Result<Option<String>, LogError> {
    Ok(
        sqlx::query_scalar("SELECT note FROM tlog_checkpoints ORDER BY size DESC LIMIT 1")
            .fetch_optional(pool)
            .await?,
    )
}

/// Every signed checkpoint's note, by size (for `ledger log export-checkpoints`).
pub async fn all_checkpoints(pool: &PgPool) -> Result<Vec<(u64, String)>, LogError> {
    let mut conn = pool.acquire().await?;
    Ok(store::checkpoints(&mut conn)
        .await?
        .into_iter()
        .map(|(size, _, note)| (size, note))
        .collect())
}

/// An inclusion proof: the leaf's hash and its audit path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inclusion {
    pub leaf_hash: Hash,
    pub hashes: Vec<Hash>,
}

/// The proof that the entry at feed `position` (from 1) is in the tree of `size` entries.
pub async fn inclusion(pool: &PgPool, position: u64, size: u64) -> Result<Inclusion, ProofError> {
    let index = position.checked_sub(1).ok_or(ProofError::OutOfRange)?;
    let plan =
        inclusion_plan(index, size).map_err(|PlanError::OutOfRange| ProofError::OutOfRange)?;
    let leaf = tlog::Subtree { level: 0, index };
    let mut hashes = resolve(pool, size, &plan, &[leaf]).await?;
    let leaf_hash = hashes.pop().expect("the leaf was asked for last");
    Ok(Inclusion { leaf_hash, hashes })
}

/// The proof that the tree of `to` entries extends the tree of `from`.
pub async fn consistency(pool: &PgPool, from: u64, to: u64) -> Result<Vec<Hash>, ProofError> {
    let plan =
        consistency_plan(from, to).map_err(|PlanError::OutOfRange| ProofError::OutOfRange)?;
    resolve(pool, to, &plan, &[]).await
}

/// Reads the plan's subtrees (and `extra` ones, appended to the answer) for a tree of `size`.
async fn resolve(
    pool: &PgPool,
    size: u64,
    plan: &ProofPlan,
    extra: &[tlog::Subtree],
) -> Result<Vec<Hash>, ProofError> {
    let mut conn = pool.acquire().await?;
    let tree = store::tree_head(&mut conn).await?.size;
    if size > tree {
        return Err(ProofError::BeyondTree { size: tree });
    }
    resolve_on(&mut conn, plan, extra).await
}

/// Reads the plan's subtrees (and `extra` ones, appended to the answer) on `conn`.
pub(crate) async fn resolve_on(
    conn: &mut sqlx::PgConnection,
    plan: &ProofPlan,
    extra: &[tlog::Subtree],
) -> Result<Vec<Hash>, ProofError> {
    let mut needed = plan.needed();
    needed.extend_from_slice(extra);
    let nodes = store::subtrees(conn, &needed).await?;
    let missing = || LogError::Corrupt("a stored subtree a proof needs is missing".into());
    let mut hashes = plan.resolve(&nodes).ok_or_else(missing)?;
    for s in extra {
        hashes.push(*nodes.get(s).ok_or_else(missing)?);
    }
    Ok(hashes)
}
