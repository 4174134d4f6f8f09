//! Tiles: how the tree's hashes are stored, as Go's checksum database and C2SP tlog-tiles store
//! them. A tile of height [`TILE_HEIGHT`] at tile level `L` and index `N` holds the hashes of the
//! tree's level `8L` at positions `N * 256 .. N * 256 + w` (`w <= 256`; a partial tile at the
//! right edge grows until it is full), concatenated: `32 * w` bytes. Level 0 holds the leaves'
//! hashes, level 8 the subtrees of 256 leaves, level 16 those of 65,536, and so on.
//!
//! A subtree at level `8L + k` (`0 < k < 8`) is not stored: it is the perfect binary fold of the
//! `2^k` level-`8L` hashes under it, which all lie in one tile (a tile's 256 positions are aligned
//! on every power of two up to 256). Computing it folds at most 127 stored hashes in memory; no
//! leaf, no event is ever read or hashed again.

use crate::hash::{node_hash, Hash};
use crate::invariant;
use crate::tree::Subtree;

/// The tree levels a tile spans.
pub const TILE_HEIGHT: u8 = 8;
/// The most hashes a tile holds.
pub const TILE_WIDTH: u64 = 1 << TILE_HEIGHT;

/// A tile: tile level `level` (tree level `8 * level`) and index `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tile {
    pub level: u8,
    pub index: u64,
}

/// Where a subtree's hash comes from: `count` hashes of `tile`, from hash `offset` on, folded
/// (one hash, unfolded, when the subtree's level is a multiple of the tile height).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TileSlice {
    pub tile: Tile,
    pub offset: u64,
    pub count: u64,
}

impl Subtree {
    /// The stored hashes this subtree's hash is computed from.
    pub fn tile_slice(self) -> TileSlice {
        let k = self.level % TILE_HEIGHT;
        let first = self.index << k;
        TileSlice {
            tile: Tile {
                level: self.level / TILE_HEIGHT,
                index: first / TILE_WIDTH,
            },
            offset: first % TILE_WIDTH,
            count: 1 << k,
        }
    }
}

/// The hash of a perfect subtree from the `2^k` hashes under it at `k` levels below, concatenated
/// (`32 * 2^k` bytes). `None` when `hashes` is not that: empty, not a power of two of hashes, or
/// not whole hashes.
pub fn fold_perfect(hashes: &[u8]) -> Option<Hash> {
    if hashes.is_empty() || !hashes.len().is_multiple_of(32) {
        return None;
    }
    let mut level: Vec<Hash> = hashes
        .chunks_exact(32)
        .map(|c| <Hash>::try_from(c).expect("32-byte chunk"))
        .collect();
    if !level.len().is_power_of_two() {
        return None;
    }
    while level.len() > 1 {
        level = level
            .chunks_exact(2)
            .map(|pair| node_hash(&pair[0], &pair[1]))
            .collect();
    }
    level.pop()
}

/// Whether a completed subtree is stored in a tile (its level is a tile level's).
pub fn is_stored(subtree: Subtree) -> bool {
    subtree.level.is_multiple_of(TILE_HEIGHT)
}

/// The tiles' new hashes from the subtrees a run of appends completed (in completion order, as
/// [`crate::RightEdge::push`] reports them): for each touched tile, the position in it of its
/// first new hash and the new hashes concatenated, tiles in (level, index) order. Subtrees at
/// levels between tile levels are left out.
pub fn tile_appends(completed: &[(Subtree, Hash)]) -> Vec<(Tile, u64, Vec<u8>)> {
    let mut stored: Vec<(Subtree, Hash)> = completed
        .iter()
        .copied()
        .filter(|(s, _)| is_stored(*s))
        .collect();
    stored.sort_by_key(|(s, _)| (s.level, s.index));
    let stored_count = stored.len();
    let mut out: Vec<(Tile, u64, Vec<u8>)> = Vec::new();
    for (s, h) in stored {
        let slice = s.tile_slice();
        match out.last_mut() {
            Some((tile, offset, bytes))
                if *tile == slice.tile && *offset + (bytes.len() / 32) as u64 == slice.offset =>
            {
                bytes.extend_from_slice(&h);
            }
            _ => out.push((slice.tile, slice.offset, h.to_vec())),
        }
    }
    // Every stored subtree lands once, in a run that fits its tile: a hash past a tile's end
    // would be written where a reader looks for another subtree's.
    invariant!(
        out.iter().map(|(_, _, b)| b.len() / 32).sum::<usize>() == stored_count
            && out
                .iter()
                .all(|(_, offset, b)| *offset + (b.len() / 32) as u64 <= TILE_WIDTH),
        "{stored_count} stored subtrees went into tiles as {:?}",
        out.iter()
            .map(|(t, o, b)| (*t, *o, b.len() / 32))
            .collect::<Vec<_>>()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::leaf_hash;
    use crate::tree::tests::{leaves, naive_root};
    use crate::RightEdge;
    use std::collections::BTreeMap;

    /// Tiles as a store keeps them: appended to by [`tile_appends`], pass after pass.
    fn apply(tiles: &mut BTreeMap<Tile, Vec<u8>>, appends: Vec<(Tile, u64, Vec<u8>)>) {
        for (tile, offset, bytes) in appends {
            let stored = tiles.entry(tile).or_default();
            assert_eq!(
                stored.len() as u64,
                offset * 32,
                "{tile:?} appended in order"
            );
            stored.extend_from_slice(&bytes);
            assert!(stored.len() as u64 <= TILE_WIDTH * 32);
        }
    }

    fn subtree_from_tiles(tiles: &BTreeMap<Tile, Vec<u8>>, s: Subtree) -> Option<Hash> {
        let slice = s.tile_slice();
        let bytes = tiles.get(&slice.tile)?;
        let from = (slice.offset * 32) as usize;
        let to = from + (slice.count * 32) as usize;
        fold_perfect(bytes.get(from..to)?)
    }

    /// Every completed subtree, at every level, read back from tiles built in passes of uneven
    /// sizes, is its RFC 6962 hash; nothing beyond the tree is.
    #[test]
    fn every_subtree_is_read_back_from_tiles_built_pass_by_pass() {
        let all = leaves(1300);
        let mut edge = RightEdge::new();
        let mut tiles = BTreeMap::new();
        let mut every = Vec::new();
        let mut at = 0;
        for pass in [1usize, 255, 1, 300, 7, 256, 480].iter().cycle() {
            if at == all.len() {
                break;
            }
            let end = (at + pass).min(all.len());
            let mut completed = Vec::new();
            for leaf in &all[at..end] {
                edge.push(leaf_hash(leaf), |s, h| completed.push((s, h)));
            }
            every.extend_from_slice(&completed);
            apply(&mut tiles, tile_appends(&completed));
            at = end;
        }
        for (s, h) in &every {
            assert_eq!(subtree_from_tiles(&tiles, *s), Some(*h), "{s:?}");
            let start = s.start() as usize;
            assert_eq!(*h, naive_root(&all[start..start + (1 << s.level)]));
        }
        assert_eq!(tiles[&Tile { level: 0, index: 5 }].len(), 20 * 32);
        assert_eq!(tiles[&Tile { level: 1, index: 0 }].len(), 5 * 32);
        assert!(subtree_from_tiles(&tiles, Subtree { level: 9, index: 2 }).is_none());
        assert!(subtree_from_tiles(
            &tiles,
            Subtree {
                level: 0,
                index: 1300
            }
        )
        .is_none());
    }

    /// Proofs answered from tiles are byte for byte the proofs answered from every stored
    /// subtree (the store before tiles) and RFC 6962's, for every size up to 600 (across tile
    /// borders, partial tiles and a second tile level's first hashes), the tree grown in passes.
    #[test]
    fn proofs_from_tiles_are_the_proofs_from_every_subtree_for_sizes_up_to_600() {
        use crate::proof::{consistency_plan, inclusion_plan};
        use std::collections::HashMap;
        let all = leaves(600);
        let mut edge = RightEdge::new();
        let mut tiles = BTreeMap::new();
        let mut nodes: HashMap<Subtree, Hash> = HashMap::new();
        for (n, leaf) in all.iter().enumerate() {
            let mut completed = Vec::new();
            edge.push(leaf_hash(leaf), |s, h| completed.push((s, h)));
            nodes.extend(completed.iter().copied());
            apply(&mut tiles, tile_appends(&completed));
            let size = n as u64 + 1;
            let from_tiles = |plan: &crate::ProofPlan| {
                let map: HashMap<Subtree, Hash> = plan
                    .needed()
                    .into_iter()
                    .map(|s| (s, subtree_from_tiles(&tiles, s).expect("stored")))
                    .collect();
                plan.resolve(&map).unwrap()
            };
            // The first and last leaves, the middle, and one moving across the tree.
            for m in [0, size / 2, size - 1, (n as u64 * 37) % size] {
                let plan = inclusion_plan(m, size).unwrap();
                assert_eq!(
                    from_tiles(&plan),
                    plan.resolve(&nodes).unwrap(),
                    "{m} {size}"
                );
                let plan = consistency_plan(m + 1, size).unwrap();
                assert_eq!(
                    from_tiles(&plan),
                    plan.resolve(&nodes).unwrap(),
                    "{m} {size}"
                );
            }
            assert_eq!(fold_tiles_root(&tiles, size), edge.root(), "{size}");
        }
    }

    /// The root of a tree of `size` from tiles alone: every subtree of its decomposition.
    fn fold_tiles_root(tiles: &BTreeMap<Tile, Vec<u8>>, size: u64) -> Hash {
        let hashes: Vec<Hash> = crate::tree::range_subtrees(0, size)
            .into_iter()
            .map(|s| subtree_from_tiles(tiles, s).expect("stored"))
            .collect();
        crate::tree::fold_right(&hashes).unwrap()
    }

    #[test]
    fn a_fold_takes_only_a_power_of_two_of_whole_hashes() {
        assert!(fold_perfect(&[]).is_none());
        assert!(fold_perfect(&[0; 33]).is_none());
        assert!(fold_perfect(&[0; 96]).is_none());
        let (a, b) = (leaf_hash(b"a"), leaf_hash(b"b"));
        assert_eq!(fold_perfect(&[a, b].concat()), Some(node_hash(&a, &b)));
        assert_eq!(
            Subtree {
                level: 13,
                index: 5
            }
            .tile_slice(),
            TileSlice {
                tile: Tile { level: 1, index: 0 },
                offset: 160,
                count: 32
            }
        );
    }
}
