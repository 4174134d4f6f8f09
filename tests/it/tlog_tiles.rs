//! The tree's hashes in tiles (migration 0026, `docs/adr/0016-tamper-evident-log.md`): a ledger
//! whose tree was stored the old way (every perfect subtree a `tlog_nodes` row) is converted by
//! the migration, and its proofs, `ledger verify` and its follower go on from the tiles; a tile
//! edited (a leaf hash or an interior one), cut short or deleted with SQL is caught by `ledger
//! verify` at the position, or the positions, it breaks.

use std::collections::HashMap;

use sqlx::PgPool;
use tlog::{consistency_plan, inclusion_plan, leaf_hash, Checkpoint, Hash, RightEdge, Subtree};
use tlog_follower::proofs;

use crate::helpers::TestDb;
use crate::tlog::{exec, follow, follower, key_file, ledger, signer};

/// `n` events appended with SQL: the log needs no transfer to be hashed.
async fn append(pool: &PgPool, from: i64, n: i64) {
    exec(
        pool,
        &format!(
            "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type,
                                 event_version, payload, metadata)
             SELECT 'Transfer', 'tiles-' || i, 1, 'TransferCreated', '1',
                    json_build_object('n', i), '{{}}'
             FROM generate_series({from}, {}) i",
            from + n - 1
        ),
    )
    .await;
}

/// The tree of the log's first `size` entries as the follower before tiles stored it: every
/// perfect subtree in `tlog_nodes`, the head and one signed checkpoint. Every subtree, for the
/// proofs to compare with.
async fn old_tree(pool: &PgPool, size: i64) -> HashMap<Subtree, Hash> {
    let mut edge = RightEdge::new();
    let mut nodes = HashMap::new();
    for position in 1..=size {
        let entry = tlog_follower::entries::at(pool, position)
            .await
            .unwrap()
            .expect("an entry");
        edge.push(leaf_hash(&entry.leaf()), |s, h| {
            nodes.insert(s, h);
        });
    }
    let levels: Vec<i16> = nodes.keys().map(|s| i16::from(s.level)).collect();
    let idxs: Vec<i64> = nodes.keys().map(|s| s.index as i64).collect();
    let hashes: Vec<Vec<u8>> = nodes.values().map(|h| h.to_vec()).collect();
    sqlx::query(
        "INSERT INTO tlog_nodes (level, idx, hash)
         SELECT * FROM unnest($1::smallint[], $2::bigint[], $3::bytea[])",
    )
    .bind(levels)
    .bind(idxs)
    .bind(hashes)
    .execute(pool)
    .await
    .unwrap();
    let s = signer();
    let root = edge.root();
    let note = s
        .sign(
            &Checkpoint {
                origin: s.name().to_owned(),
                size: size as u64,
                root,
            }
            .to_text(),
        )
        .unwrap();
    sqlx::query("UPDATE tlog_state SET origin = $1, vkey = $2, size = $3, edge = $4, root = $5")
        .bind(s.name())
        .bind(s.verifier().to_vkey())
        .bind(size)
        .bind(edge.to_bytes())
        .bind(root.to_vec())
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO tlog_checkpoints (size, root, note) VALUES ($1, $2, $3)")
        .bind(size)
        .bind(root.to_vec())
        .bind(note)
        .execute(pool)
        .await
        .unwrap();
    nodes
}

/// Proofs served from the tiles, byte for byte the proofs from every old subtree.
async fn proofs_match(pool: &PgPool, nodes: &HashMap<Subtree, Hash>, size: u64) {
    for m in [0, 1, 255, 256, 257, 300, 511, 512, size - 1] {
        let plan = inclusion_plan(m, size).unwrap();
        let served = proofs::inclusion(pool, m + 1, size).await.unwrap();
        assert_eq!(served.hashes, plan.resolve(nodes).unwrap(), "inclusion {m}");
        assert_eq!(served.leaf_hash, nodes[&Subtree { level: 0, index: m }]);
        let plan = consistency_plan(m + 1, size).unwrap();
        let served = proofs::consistency(pool, m + 1, size).await.unwrap();
        assert_eq!(served, plan.resolve(nodes).unwrap(), "consistency {m}");
    }
}

// long: one upgrade read top to bottom (the old tree, the migration, proofs, verify, growth).
#[tokio::test]
async fn tlog_tiles_an_old_tree_is_converted_and_its_proofs_and_verify_hold() {
    let db = TestDb::migrated_before(26).await;
    let (url, pool) = (db.url.clone(), db.pool.clone());
    // Two full level-0 tiles and a partial third (600 = 2 * 256 + 88); level 8's tile holds 2.
    append(&pool, 1, 600).await;
    let nodes = old_tree(&pool, 600).await;
    assert_eq!(nodes.len(), 600 + 300 + 150 + 75 + 37 + 18 + 9 + 4 + 2 + 1);

    schema::MIGRATOR.run(&pool).await.unwrap();
    let gone: bool = sqlx::query_scalar("SELECT to_regclass('tlog_nodes') IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(gone, "tlog_nodes is dropped");
    let tiles: Vec<(i16, i64, i32)> = sqlx::query_as(
        "SELECT level, idx, length(hashes) / 32 FROM tlog_tiles ORDER BY level, idx",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(tiles, [(0, 0, 256), (0, 1, 256), (0, 2, 88), (1, 0, 2)]);
    proofs_match(&pool, &nodes, 600).await;

    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let (ok, out) = ledger(&["verify"], &url, &key);
    assert!(ok, "the converted tree verifies: {out}");

    // The follower goes on from the tiles: the partial tile fills, the next one starts, and the
    // checkpoint it signs extends the one signed before the upgrade.
    append(&pool, 601, 300).await;
    assert_eq!(follow(&pool).await, 900);
    let tiles: Vec<(i16, i64, i32)> = sqlx::query_as(
        "SELECT level, idx, length(hashes) / 32 FROM tlog_tiles ORDER BY level, idx",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        tiles,
        [
            (0, 0, 256),
            (0, 1, 256),
            (0, 2, 256),
            (0, 3, 132),
            (1, 0, 3)
        ]
    );
    let (ok, out) = ledger(&["verify"], &url, &key);
    assert!(ok, "the grown tree verifies: {out}");
    assert!(out.contains("900"), "{out}");
}

/// A database with 600 entries followed by the follower (tiles written by it), and the key.
async fn followed() -> (
    crate::helpers::TestDb,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let db = crate::helpers::TestDb::new().await;
    append(&db.pool, 1, 600).await;
    let f = follower(&db.pool);
    assert_eq!(crate::tlog::follow_with(&f, &db.pool).await, 600);
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let (ok, out) = ledger(&["verify"], &db.url, &key);
    assert!(ok, "the untouched log verifies: {out}");
    (db, dir, key)
}

/// The stored bytes of a tile (`level` 0: leaf hashes; 1: hashes of 256-leaf subtrees).
async fn tile(pool: &PgPool, level: i16, idx: i64) -> Vec<u8> {
    sqlx::query_scalar("SELECT hashes FROM tlog_tiles WHERE level = $1 AND idx = $2")
        .bind(level)
        .bind(idx)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn put_tile(pool: &PgPool, level: i16, idx: i64, hashes: &[u8]) {
    sqlx::query("UPDATE tlog_tiles SET hashes = $3 WHERE level = $1 AND idx = $2")
        .bind(level)
        .bind(idx)
        .bind(hashes)
        .execute(pool)
        .await
        .unwrap();
}

/// `ledger verify` fails, naming `expected`.
fn fails_with(db: &crate::helpers::TestDb, key: &std::path::Path, expected: &str) {
    let (ok, out) = ledger(&["verify"], &db.url, key);
    assert!(!ok, "{out}");
    assert!(out.contains(expected), "{expected}: {out}");
}

// long: five tamperings of the tiles in a row, each undone before the next.
#[tokio::test]
async fn tlog_tiles_a_tile_edited_cut_short_or_deleted_is_caught_at_its_position() {
    let (db, _dir, key) = followed().await;
    let pool = &db.pool;
    let (second, third) = (tile(pool, 0, 1).await, tile(pool, 0, 2).await);
    assert_eq!(third.len(), 88 * 32);

    // One leaf hash of the second tile changed: position 256 + 10 + 1.
    let mut edited = second.clone();
    edited[10 * 32] ^= 1;
    put_tile(pool, 0, 1, &edited).await;
    fails_with(
        &db,
        &key,
        "VERIFY FAILED at position 267: its entry differs",
    );
    put_tile(pool, 0, 1, &second).await;

    // An interior hash changed: the second 256-leaf subtree's, in the tile above. Every leaf
    // still matches; the recomputed subtree does not, and is named with the positions it covers.
    let upper = tile(pool, 1, 0).await;
    assert_eq!(upper.len(), 2 * 32);
    let mut edited = upper.clone();
    edited[32] ^= 1;
    put_tile(pool, 1, 0, &edited).await;
    fails_with(
        &db,
        &key,
        "VERIFY FAILED at the tree's tile 1/0, hash 1 (positions 257 to 512): it differs",
    );
    put_tile(pool, 1, 0, &upper).await;

    // The third tile cut to its first 5 hashes: position 512 + 5 + 1 has none. The follower
    // refuses to append to a tile that does not end where the tree's size says.
    put_tile(pool, 0, 2, &third[..5 * 32]).await;
    fails_with(
        &db,
        &key,
        "VERIFY FAILED at position 518: the tree holds no leaf for it",
    );
    append(pool, 601, 3).await;
    let f = follower(pool);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Other tests' open transactions may hold the commit watermark back a while.
    let refused = loop {
        match f.pass().await {
            Err(e) => break e,
            Ok(pass) => assert_eq!(pass.size, 600, "nothing is added over a cut tile"),
        }
        assert!(std::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(
        refused.to_string().contains("do not end where"),
        "{refused}"
    );
    exec(pool, "DELETE FROM events WHERE feed_position > 600").await;
    put_tile(pool, 0, 2, &third).await;

    // The second tile deleted: its first position is named, and no proof is served from it.
    exec(pool, "DELETE FROM tlog_tiles WHERE level = 0 AND idx = 1").await;
    fails_with(
        &db,
        &key,
        "VERIFY FAILED at position 257: the tree holds no leaf for it",
    );
    let served = proofs::inclusion(pool, 300, 600).await;
    assert!(served.is_err(), "no proof from a deleted tile: {served:?}");
    exec(pool, "DELETE FROM tlog_tiles").await;
    let served = proofs::consistency(pool, 3, 600).await;
    assert!(served.is_err(), "no proof without tiles: {served:?}");
}

/// The follower takes only entries below the commit watermark, and stops at the first it may not
/// take: while a transaction that began before the later appends stays open, the tree holds the
/// entries before them and no more, pass after pass; once it ends, the rest.
#[tokio::test]
async fn tlog_tiles_the_follower_stops_at_the_commit_watermark() {
    let db = TestDb::new().await;
    append(&db.pool, 1, 5).await;
    let f = follower(&db.pool);
    assert_eq!(crate::tlog::follow_with(&f, &db.pool).await, 5);
    // An open transaction with an id: every transaction that commits after it began is above
    // the watermark until it ends.
    let mut open = db.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *open)
        .await
        .unwrap();
    append(&db.pool, 6, 5).await;
    for _ in 0..5 {
        let pass = f.pass().await.unwrap();
        assert_eq!(
            (pass.size, pass.added),
            (5, 0),
            "nothing above the watermark"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    open.commit().await.unwrap();
    assert_eq!(crate::tlog::follow_with(&f, &db.pool).await, 10);
    let (ok, out) = {
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(dir.path());
        ledger(&["verify"], &db.url, &key)
    };
    assert!(ok, "{out}");
}
