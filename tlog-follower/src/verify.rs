//! `ledger verify`'s work: re-read the whole log in one COPY stream (one REPEATABLE READ
//! snapshot, with the tree's head and checkpoints), recompute every leaf and the tree, and check
//! that every stored leaf hash matches the log, that the tree holds no entry the log lost, and
//! that every checkpoint (stored, and any saved outside the database) carries a valid signature
//! by the configured key and the root recomputed at its size. Two checkpoints that both match
//! the one recomputed tree are consistent: both are prefixes of the same log. In the same
//! snapshot, every external deposit is held to its entry (`deposits`): money that entered the
//! system without an entry of the log, or an entry without its deposit, is named. Stops at the
//! first difference, which it names: a position, a deposit or a checkpoint, and why.

use std::collections::BTreeMap;

use sqlx::PgPool;
use tlog::{leaf_hash, Checkpoint, Hash, RightEdge, Subtree, Verifier, TILE_WIDTH};

use crate::copy::{fields, for_each_line, next_field, CopyEntry};
use crate::finding::finding;
pub use crate::finding::Finding;
use crate::map_facts::MapFacts;
use crate::{deposits, store, LogError};

/// The tile levels `verify` holds to the recomputed tree: 0 (leaf hashes) to 6, whose tiles
/// cover 2^56 entries each (level 7's would cover 2^64, more than a feed position counts).
const TILE_LEVELS: usize = 7;

/// How many entries a tile of `level` covers: 256^(level + 1).
fn tile_span(level: usize) -> u64 {
    TILE_WIDTH << (8 * level)
}

/// What a verification read and found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Entries read from the log.
    pub entries: u64,
    /// The stored tree's size.
    pub tree_size: u64,
    /// Checkpoints checked: stored, and from outside.
    pub stored_checkpoints: usize,
    pub outside_checkpoints: usize,
    /// External deposits each found with its entry (0 when a difference stopped the check
    /// before them).
    pub deposits: u64,
    /// Partition moves and added cells each found with its entry (ADR 0023 §6).
    pub map_facts: u64,
    /// The first difference, if any: `None` means everything holds.
    pub finding: Option<Finding>,
}

/// A checkpoint saved outside the database, with where it came from (for the message).
#[derive(Debug, Clone)]
pub struct OutsideNote {
    pub source: String,
    pub note: String,
}

/// A checkpoint to compare with the recomputed tree.
struct Expected {
    at: String,
    root: Hash,
}

/// Opens a checkpoint note with `verifier` and reads its body.
fn open(verifier: &Verifier, note: &str) -> Result<Checkpoint, String> {
    let text = verifier.open(note).map_err(|e| format!("signature: {e}"))?;
    let checkpoint = Checkpoint::parse(text).ok_or("malformed checkpoint body")?;
    if checkpoint.origin != verifier.name() {
        return Err(format!(
            "origin {} is not the key's {}",
            checkpoint.origin,
            verifier.name()
        ));
    }
    Ok(checkpoint)
}

/// Checks the stored and outside checkpoints' signatures and forms; returns what each says the
/// root at its size is, or the first one refused.
fn expectations(
    verifier: &Verifier,
    stored: &[(u64, Hash, String)],
    outside: &[OutsideNote],
) -> Result<BTreeMap<u64, Vec<Expected>>, Finding> {
    let mut out: BTreeMap<u64, Vec<Expected>> = BTreeMap::new();
    for (size, root, note) in stored {
        let at = format!("checkpoint of size {size} (database)");
        let c = open(verifier, note).map_err(|why| finding(&at, why))?;
        if c.size != *size || c.root != *root {
            return Err(finding(
                at,
                "its note does not say the size and root stored with it",
            ));
        }
        out.entry(c.size)
            .or_default()
            .push(Expected { at, root: c.root });
    }
    for n in outside {
        let opened = open(verifier, &n.note);
        let size = opened
            .as_ref()
            .map(|c| c.size.to_string())
            .unwrap_or("?".into());
        let at = format!("checkpoint of size {size} ({})", n.source);
        let c = opened.map_err(|why| finding(&at, why))?;
        out.entry(c.size)
            .or_default()
            .push(Expected { at, root: c.root });
    }
    Ok(out)
}

/// The recomputation as the stream goes.
struct Checker {
    tree_size: u64,
    edge: RightEdge,
    expected: BTreeMap<u64, Vec<Expected>>,
    /// The current tile of each tile level (`tiles[0]`: the leaf hashes of the current entries;
    /// above: the interior hashes proofs are folded from), each read on the line of the first
    /// entry it covers and held until the next: a few KiB, whatever the log's length. Empty when
    /// the tree stores none there.
    tiles: [Vec<u8>; TILE_LEVELS],
    /// The current entry's leaf bytes (one buffer for every entry).
    leaf: Vec<u8>,
    /// The first interior hash that differs, found while pushing a leaf.
    interior: Option<Finding>,
    /// The map's entries met so far (`map_facts`).
    facts: MapFacts,
}

impl Checker {
    /// One COPY line: an entry and the leaf hash the tree stores for its position.
    fn line(&mut self, line: &[u8]) -> Result<(), Finding> {
        let next = self.edge.size() + 1;
        let at = || format!("position {next}");
        let mut fields = fields(line);
        let (row, tiles) = CopyEntry::read(&mut fields)
            .and_then(|row| Ok((row, next_field(&mut fields, "tiles")?)))
            .map_err(|why| finding(at(), format!("unreadable entry: {why}")))?;
        if row.position != next as i64 {
            return Err(finding(
                at(),
                format!(
                    "missing from the log (the next entry is at position {})",
                    row.position
                ),
            ));
        }
        if let Some(tiles) = tiles {
            self.load_tiles(next, &tiles)
                .map_err(|why| finding(at(), format!("unreadable entry: {why}")))?;
        }
        let offset = ((next - 1) % TILE_WIDTH) as usize * 32;
        let stored: Option<Hash> = self.tiles[0]
            .get(offset..offset + 32)
            .map(|h| h.try_into().expect("32 bytes"));
        let entry = row.entry();
        entry.write_leaf(&mut self.leaf);
        let hash = leaf_hash(&self.leaf);
        match stored {
            Some(s) if s != hash => {
                return Err(finding(
                    at(),
                    "its entry differs from the leaf the tree holds (edited, replaced or moved)",
                ))
            }
            None if next <= self.tree_size => {
                return Err(finding(at(), "the tree holds no leaf for it"))
            }
            _ => {}
        }
        // An entry the tree already holds was caught above if edited; this names one that was
        // never a deposit's as the ledger writes it (appended before the tree took it).
        deposits::check_shape(&entry).map_err(|why| finding(at(), why))?;
        self.facts.see(&entry).map_err(|why| finding(at(), why))?;
        let (tiles, tree_size, interior) = (&self.tiles, self.tree_size, &mut self.interior);
        self.edge.push(hash, |subtree, hash| {
            if interior.is_none() {
                *interior = check_interior(tiles, tree_size, subtree, &hash).err();
            }
        });
        if let Some(f) = self.interior.take() {
            return Err(f);
        }
        self.check_roots()
    }

    /// At the entry at `position`, the tiles whose ranges begin there replace the current ones:
    /// those `tiles` carries (`level:hex`, comma-separated), and an empty one for each level the
    /// tree stores no tile of there.
    fn load_tiles(&mut self, position: u64, tiles: &str) -> Result<(), String> {
        for level in 0..TILE_LEVELS {
            if (position - 1).is_multiple_of(tile_span(level)) {
                self.tiles[level].clear();
            }
        }
        for tile in tiles.split(',').filter(|t| !t.is_empty()) {
            let (level, hex) = tile.split_once(':').ok_or("bad tile")?;
            let level: usize = level.parse().map_err(|_| "bad tile level")?;
            if level >= TILE_LEVELS || !(position - 1).is_multiple_of(tile_span(level)) {
                return Err(format!("a tile of level {level} at position {position}"));
            }
            self.tiles[level] = decode_hex(hex)?;
        }
        Ok(())
    }

    /// Compares the checkpoints at the current size with the recomputed root.
    fn check_roots(&mut self) -> Result<(), Finding> {
        let size = self.edge.size();
        if let Some(expected) = self.expected.remove(&size) {
            let root = self.edge.root();
            if let Some(e) = expected.into_iter().find(|e| e.root != root) {
                return Err(finding(
                    e.at,
                    format!(
                        "its root is not the root of the log's first {size} entries: \
                         the log was rewritten at or before position {size}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// After the last entry: the tree and the checkpoints must not be longer than the log.
    fn finish(&mut self) -> Result<(), Finding> {
        let entries = self.edge.size();
        if self.tree_size > entries {
            return Err(finding(
                format!("position {}", entries + 1),
                format!(
                    "the tree holds {} entries but the log only {entries}: entries were removed",
                    self.tree_size
                ),
            ));
        }
        if let Some((size, expected)) = self.expected.pop_first() {
            let at = expected
                .into_iter()
                .next()
                .map(|e| e.at)
                .unwrap_or_default();
            return Err(finding(
                at,
                format!("the log has only {entries} entries, not {size}: its tail was cut"),
            ));
        }
        Ok(())
    }
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
        })
        .collect::<Option<_>>()
        .ok_or("bad tile")?;
    if !bytes.len().is_multiple_of(32) {
        return Err(format!("a tile of {} bytes", bytes.len()));
    }
    Ok(bytes)
}

/// Compares a subtree the recomputation completed with the tree's stored hash of it, when the
/// tree stores it (a tile level above 0, within the tree's size).
fn check_interior(
    tiles: &[Vec<u8>; TILE_LEVELS],
    tree_size: u64,
    subtree: Subtree,
    hash: &Hash,
) -> Result<(), Finding> {
    if subtree.level == 0 || !tlog::tile::is_stored(subtree) {
        return Ok(());
    }
    let first = subtree.start() + 1;
    let last = subtree.start() + (1 << subtree.level);
    let slice = subtree.tile_slice();
    let level = usize::from(slice.tile.level);
    if last > tree_size || level >= TILE_LEVELS {
        return Ok(());
    }
    let at = || {
        format!(
            "the tree's tile {}/{}, hash {} (positions {first} to {last})",
            slice.tile.level, slice.tile.index, slice.offset
        )
    };
    // The current tile of the level is this subtree's: its range holds the subtree's last entry.
    let offset = slice.offset as usize * 32;
    let stored = tiles[level].get(offset..offset + 32);
    match stored {
        None => Err(finding(at(), "the tree holds no hash for it")),
        Some(s) if s != hash => Err(finding(
            at(),
            "it differs from the hash recomputed from the log: the tree's stored interior was \
             edited (proofs folded from it fail)",
        )),
        Some(_) => Ok(()),
    }
}

/// Streams every entry, with the leaf hashes the tree stores for it (its level-0 tile), through
/// `checker`; the first difference.
async fn stream_entries(
    conn: &mut sqlx::PgConnection,
    checker: &mut Checker,
    progress: &mut impl FnMut(u64),
) -> Result<Option<Finding>, LogError> {
    // Each tile rides on the line of the first entry it covers: one read of each tile, the
    // level-0 ones 256 entries apart, level 1's 65,536, and so on; one subquery per level, each
    // an index lookup behind a test of the position.
    let per_level: Vec<String> = (0..TILE_LEVELS)
        .map(|level| {
            let bits = 8 * (level + 1);
            format!(
                "SELECT {level} AS l, t.hashes AS h FROM tlog_tiles t
                 WHERE (e.feed_position - 1) % {span} = 0
                   AND t.level = {level} AND t.idx = (e.feed_position - 1) >> {bits}",
                span = tile_span(level)
            )
        })
        .collect();
    let query = eventlog::entries::copy_all_with(&format!(
        "CASE WHEN (e.feed_position - 1) % {TILE_WIDTH} = 0 THEN
                          (SELECT coalesce(string_agg(l || ':' || encode(h, 'hex'), ','), '')
                           FROM ({}) u)
                      END",
        per_level.join(" UNION ALL ")
    ));
    let stream = conn.copy_out_raw(&query).await?;
    let outcome = for_each_line(stream, |line| {
        checker.line(line)?;
        if checker.edge.size().is_multiple_of(65_536) {
            progress(checker.edge.size());
        }
        Ok(true)
    })
    .await?;
    Ok(outcome.err())
}

/// Verifies the log of `pool` (see the module's comment); `progress` gets the number of entries
/// read so far, now and then.
pub async fn verify(
    pool: &PgPool,
    verifier: &Verifier,
    outside: &[OutsideNote],
    mut progress: impl FnMut(u64),
) -> Result<Report, LogError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let head = store::tree_head(&mut tx).await?;
    let stored = store::checkpoints(&mut tx).await?;
    let mut report = Report {
        entries: 0,
        tree_size: head.size,
        stored_checkpoints: stored.len(),
        outside_checkpoints: outside.len(),
        deposits: 0,
        map_facts: 0,
        finding: None,
    };
    let expected = match expectations(verifier, &stored, outside) {
        Ok(expected) => expected,
        Err(f) => {
            report.finding = Some(f);
            return Ok(report);
        }
    };
    let mut checker = Checker {
        tree_size: head.size,
        edge: RightEdge::new(),
        expected,
        tiles: Default::default(),
        leaf: Vec::new(),
        interior: None,
        facts: MapFacts::default(),
    };
    // Checkpoints of the empty tree are checked before the first entry.
    if let Err(f) = checker.check_roots() {
        report.finding = Some(f);
        return Ok(report);
    }
    report.finding = stream_entries(&mut tx, &mut checker, &mut progress).await?;
    report.entries = checker.edge.size();
    progress(report.entries);
    if report.finding.is_none() {
        report.finding = checker.finish().err();
    }
    if report.finding.is_none() {
        match deposits::check(&mut tx).await? {
            Ok(matched) => report.deposits = matched,
            Err(f) => report.finding = Some(f),
        }
    }
    if report.finding.is_none() {
        match checker.facts.check(&mut tx).await? {
            Ok(held) => report.map_facts = held,
            Err(f) => report.finding = Some(f),
        }
    }
    tx.rollback().await?;
    Ok(report)
}
