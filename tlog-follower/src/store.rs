//! The tree's tables (migration 0021): `tlog_state` (size, right edge, root, signing identity),
//! `tlog_nodes` (every perfect subtree by (level, index)), `tlog_checkpoints` (signed notes by
//! size). Written only by the follower, in its locked transaction; read by proofs and verify.

use std::collections::HashMap;

use sqlx::PgConnection;
use tlog::{Hash, RightEdge, Subtree};

use crate::LogError;

/// The tree's head as stored.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub origin: Option<String>,
    pub vkey: Option<String>,
    pub edge: RightEdge,
    /// Whether the last checkpoint is older than the interval asked for.
    pub time_due: bool,
}

fn to_hash(bytes: &[u8]) -> Result<Hash, LogError> {
    bytes
        .try_into()
        .map_err(|_| LogError::Corrupt(format!("a hash of {} bytes", bytes.len())))
}

fn size_of(size: i64) -> Result<u64, LogError> {
    u64::try_from(size).map_err(|_| LogError::Corrupt(format!("tree size {size}")))
}

/// Reads the head, locked for update until the transaction ends.
pub(crate) async fn lock_head(conn: &mut PgConnection, interval_ms: i64) -> Result<Head, LogError> {
    let (origin, vkey, size, edge, time_due): (Option<String>, Option<String>, i64, Vec<u8>, bool) =
        sqlx::query_as(
            "SELECT origin, vkey, size, edge,
                    checkpointed_at <= now() - $1 * interval '1 millisecond'
             FROM tlog_state FOR UPDATE",
        )
        .bind(interval_ms)
        .fetch_one(conn)
        .await?;
    let size = size_of(size)?;
    let edge = RightEdge::from_bytes(size, &edge)
        .ok_or_else(|| LogError::Corrupt(format!("the right edge of a tree of size {size}")))?;
    Ok(Head {
        origin,
        vkey,
        edge,
        time_due,
    })
}

/// Stores newly completed subtrees.
pub(crate) async fn insert_nodes(
    conn: &mut PgConnection,
    nodes: &[(Subtree, Hash)],
) -> Result<(), sqlx::Error> {
    let levels: Vec<i16> = nodes.iter().map(|(s, _)| i16::from(s.level)).collect();
    let idxs: Vec<i64> = nodes.iter().map(|(s, _)| s.index as i64).collect();
    let hashes: Vec<Vec<u8>> = nodes.iter().map(|(_, h)| h.to_vec()).collect();
    sqlx::query(
        "INSERT INTO tlog_nodes (level, idx, hash)
         SELECT * FROM unnest($1::smallint[], $2::bigint[], $3::bytea[])",
    )
    .bind(levels)
    .bind(idxs)
    .bind(hashes)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes the head; `checkpointed` moves the last checkpoint's time to now.
pub(crate) async fn write_head(
    conn: &mut PgConnection,
    origin: &str,
    vkey: &str,
    edge: &RightEdge,
    checkpointed: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE tlog_state SET origin = $1, vkey = $2, size = $3, edge = $4, root = $5,
                checkpointed_at = CASE WHEN $6 THEN now() ELSE checkpointed_at END",
    )
    .bind(origin)
    .bind(vkey)
    .bind(edge.size() as i64)
    .bind(edge.to_bytes())
    .bind(edge.root().to_vec())
    .bind(checkpointed)
    .execute(conn)
    .await?;
    Ok(())
}

/// The size of the newest checkpoint, if any.
pub(crate) async fn last_checkpoint_size(conn: &mut PgConnection) -> Result<Option<u64>, LogError> {
    let size: Option<i64> = sqlx::query_scalar("SELECT max(size) FROM tlog_checkpoints")
        .fetch_one(conn)
        .await?;
    size.map(size_of).transpose()
}

/// The newest checkpoint's size and root, if any.
pub(crate) async fn last_checkpoint(
    conn: &mut PgConnection,
) -> Result<Option<(u64, Hash)>, LogError> {
    let row: Option<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT size, root FROM tlog_checkpoints ORDER BY size DESC LIMIT 1")
            .fetch_optional(conn)
            .await?;
    row.map(|(size, root)| Ok((size_of(size)?, to_hash(&root)?)))
        .transpose()
}

/// Stores a signed checkpoint.
pub(crate) async fn insert_checkpoint(
    conn: &mut PgConnection,
    size: u64,
    root: &Hash,
    note: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO tlog_checkpoints (size, root, note) VALUES ($1, $2, $3)")
        .bind(size as i64)
        .bind(root.to_vec())
        .bind(note)
        .execute(conn)
        .await?;
    Ok(())
}

/// The stored hashes of `subtrees` (those stored; a missing one is absent from the map).
pub(crate) async fn nodes(
    conn: &mut PgConnection,
    subtrees: &[Subtree],
) -> Result<HashMap<Subtree, Hash>, LogError> {
    let levels: Vec<i16> = subtrees.iter().map(|s| i16::from(s.level)).collect();
    let idxs: Vec<i64> = subtrees.iter().map(|s| s.index as i64).collect();
    let rows: Vec<(i16, i64, Vec<u8>)> = sqlx::query_as(
        "SELECT n.level, n.idx, n.hash
         FROM unnest($1::smallint[], $2::bigint[]) AS w(level, idx)
         JOIN tlog_nodes n ON n.level = w.level AND n.idx = w.idx",
    )
    .bind(levels)
    .bind(idxs)
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|(level, idx, hash)| {
            let subtree = Subtree {
                level: u8::try_from(level).map_err(|_| LogError::Corrupt("a level".into()))?,
                index: size_of(idx)?,
            };
            Ok((subtree, to_hash(&hash)?))
        })
        .collect()
}

/// The tree's size and signing identity, as the readers see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeHead {
    pub size: u64,
    pub origin: Option<String>,
    pub vkey: Option<String>,
}

/// The stored head, without a lock.
pub(crate) async fn tree_head(conn: &mut PgConnection) -> Result<TreeHead, LogError> {
    let (size, origin, vkey): (i64, Option<String>, Option<String>) =
        sqlx::query_as("SELECT size, origin, vkey FROM tlog_state")
            .fetch_one(conn)
            .await?;
    Ok(TreeHead {
        size: size_of(size)?,
        origin,
        vkey,
    })
}

/// Every stored checkpoint (size, root, note), by size.
pub(crate) async fn checkpoints(
    conn: &mut PgConnection,
) -> Result<Vec<(u64, Hash, String)>, LogError> {
    let rows: Vec<(i64, Vec<u8>, String)> =
        sqlx::query_as("SELECT size, root, note FROM tlog_checkpoints ORDER BY size")
            .fetch_all(conn)
            .await?;
    rows.into_iter()
        .map(|(size, root, note)| Ok((size_of(size)?, to_hash(&root)?, note)))
        .collect()
}
