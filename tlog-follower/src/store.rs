//! The tree's tables (migrations 0021 and 0026): `tlog_state` (size, right edge, root, signing
//! identity), `tlog_tiles` (the hashes of every eighth level, 256 to a row: `tlog::tile`),
//! `tlog_checkpoints` (signed notes by size). Written only by the follower, in its locked transaction; read by proofs and verify.

use std::collections::HashMap;

use sqlx::PgConnection;
use tlog::{Hash, RightEdge, Subtree, Tile};

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

/// Appends a pass's new hashes to their tiles (`tlog::tile::tile_appends`): a tile's first
/// hashes insert its row, later ones are appended to the stored bytes, each only where the stored
/// tile ends exactly where the new hashes begin. One statement for every touched tile.
pub(crate) async fn append_tiles(
    conn: &mut PgConnection,
    appends: &[(Tile, u64, Vec<u8>)],
) -> Result<(), LogError> {
    let levels: Vec<i16> = appends.iter().map(|(t, _, _)| i16::from(t.level)).collect();
    let idxs: Vec<i64> = appends.iter().map(|(t, _, _)| t.index as i64).collect();
    let offsets: Vec<i32> = appends.iter().map(|(_, o, _)| *o as i32).collect();
    let hashes: Vec<&[u8]> = appends.iter().map(|(_, _, h)| h.as_slice()).collect();
    let written: i64 = sqlx::query_scalar(
        "WITH w AS (SELECT * FROM unnest($1::smallint[], $2::bigint[], $3::int[], $4::bytea[])
                      AS w(level, idx, off, hashes)),
              appended AS (UPDATE tlog_tiles t SET hashes = t.hashes || w.hashes FROM w
                           WHERE w.off > 0 AND t.level = w.level AND t.idx = w.idx
                             AND length(t.hashes) = w.off * 32
                           RETURNING 1),
              started AS (INSERT INTO tlog_tiles (level, idx, hashes)
                          SELECT level, idx, hashes FROM w WHERE w.off = 0
                          RETURNING 1)
         SELECT (SELECT count(*) FROM appended) + (SELECT count(*) FROM started)",
    )
    .bind(levels)
    .bind(idxs)
    .bind(offsets)
    .bind(hashes)
    .fetch_one(conn)
    .await?;
    if written != appends.len() as i64 {
        return Err(LogError::Corrupt(format!(
            "{} of {} tiles do not end where the tree's size says they do",
            appends.len() as i64 - written,
            appends.len()
        )));
    }
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

/// The hashes of `subtrees` (those stored; a missing one is absent from the map), from the
/// tiles: one slice of one tile each (`Subtree::tile_slice`), read with `substring` (tiles are
/// stored uncompressed, so only the slice's TOAST chunks are read), folded in memory when the
/// subtree's level lies between tile levels. Nothing is re-hashed from the log.
pub(crate) async fn subtrees(
    conn: &mut PgConnection,
    subtrees: &[Subtree],
) -> Result<HashMap<Subtree, Hash>, LogError> {
    let slices: Vec<_> = subtrees.iter().map(|s| s.tile_slice()).collect();
    let levels: Vec<i16> = slices.iter().map(|s| i16::from(s.tile.level)).collect();
    let idxs: Vec<i64> = slices.iter().map(|s| s.tile.index as i64).collect();
    let offsets: Vec<i32> = slices.iter().map(|s| s.offset as i32).collect();
    let counts: Vec<i32> = slices.iter().map(|s| s.count as i32).collect();
    let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
        "SELECT w.n, substring(t.hashes FROM w.off * 32 + 1 FOR w.count * 32)
         FROM unnest($1::smallint[], $2::bigint[], $3::int[], $4::int[])
                WITH ORDINALITY AS w(level, idx, off, count, n)
         JOIN tlog_tiles t ON t.level = w.level AND t.idx = w.idx",
    )
    .bind(levels)
    .bind(idxs)
    .bind(offsets)
    .bind(counts)
    .fetch_all(conn)
    .await?;
    let mut out = HashMap::with_capacity(rows.len());
    for (n, bytes) in rows {
        let i = usize::try_from(n - 1).map_err(|_| LogError::Corrupt("an ordinal".into()))?;
        let (subtree, slice) = (subtrees[i], slices[i]);
        // A tile shorter than the slice has not grown that far: the subtree is not stored.
        if bytes.len() as u64 == slice.count * 32 {
            let hash = tlog::tile::fold_perfect(&bytes).expect("a power of two of hashes");
            out.insert(subtree, hash);
        }
    }
    Ok(out)
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
