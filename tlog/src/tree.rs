//! The tree's shape: perfect subtrees addressed by (level, index), the right edge of a growing
//! tree (the perfect subtrees its size decomposes into, largest first) and its root.
//!
//! RFC 6962 splits a tree of `n` leaves at the largest power of two below `n`; so the tree of
//! `n` leaves is the right fold, with the node hash, of the perfect subtrees of `n`'s binary
//! decomposition taken left to right. Every perfect subtree, once complete, never changes: a
//! store keeps each one by (level, index) and answers any proof from them alone.

use crate::hash::{node_hash, Hash, EMPTY_ROOT};
use crate::invariant;

/// The perfect subtree of `2^level` leaves starting at leaf `index << level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subtree {
    pub level: u8,
    pub index: u64,
}

impl Subtree {
    /// The first leaf it covers.
    pub fn start(self) -> u64 {
        self.index << self.level
    }
}

/// The perfect subtrees covering leaves `[start, end)`, largest first. `start` must be a
/// multiple of a power of two at least `end - start` (every range an RFC 6962 split makes is).
pub fn range_subtrees(start: u64, end: u64) -> Vec<Subtree> {
    let mut out = Vec::new();
    let mut at = start;
    let size = end.saturating_sub(start);
    for level in (0..64u8).rev() {
        if size & (1u64 << level) != 0 {
            out.push(Subtree {
                level,
                index: at >> level,
            });
            at += 1u64 << level;
        }
    }
    out
}

/// The hash of a range from its perfect subtrees' hashes (largest first): their right fold.
/// `None` for no subtree.
pub fn fold_right(hashes: &[Hash]) -> Option<Hash> {
    let (last, rest) = hashes.split_last()?;
    Some(rest.iter().rev().fold(*last, |acc, h| node_hash(h, &acc)))
}

/// The right edge of a tree: its size and the hashes of the perfect subtrees its size
/// decomposes into, largest first. Appending a leaf completes zero or more subtrees, which a
/// store keeps; the root is their fold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RightEdge {
    size: u64,
    hashes: Vec<Hash>,
}

impl RightEdge {
    /// The empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// A right edge as stored: its size and its hashes, largest subtree first. `None` when the
    /// number of hashes is not the number of one bits of `size`.
    pub fn from_parts(size: u64, hashes: Vec<Hash>) -> Option<Self> {
        (hashes.len() == size.count_ones() as usize).then_some(Self { size, hashes })
    }

    /// The edge as concatenated hashes, largest subtree first (what a store keeps).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.hashes.concat()
    }

    /// The edge from [`RightEdge::to_bytes`] and its size.
    pub fn from_bytes(size: u64, bytes: &[u8]) -> Option<Self> {
        if !bytes.len().is_multiple_of(32) {
            return None;
        }
        let hashes = bytes
            .chunks_exact(32)
            .map(|c| <Hash>::try_from(c).expect("32-byte chunk"))
            .collect();
        Self::from_parts(size, hashes)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The perfect subtrees of the edge, with their hashes, largest first.
    pub fn subtrees(&self) -> impl Iterator<Item = (Subtree, Hash)> + '_ {
        range_subtrees(0, self.size)
            .into_iter()
            .zip(self.hashes.iter().copied())
    }

    /// Appends a leaf by its hash; calls `completed` with every perfect subtree it completes,
    /// the leaf itself (level 0) first, then each larger one.
    pub fn push(&mut self, leaf: Hash, mut completed: impl FnMut(Subtree, Hash)) {
        // The edge holds one perfect subtree per one bit of its size (`from_parts` refuses any
        // other), before and after: a wrong edge would sign a wrong root from here on.
        invariant!(
            self.hashes.len() == self.size.count_ones() as usize && self.size < u64::MAX,
            "a right edge of {} hashes for size {}",
            self.hashes.len(),
            self.size
        );
        let index = self.size;
        let mut hash = leaf;
        let mut level = 0u8;
        completed(Subtree { level, index }, hash);
        while index & (1u64 << level) != 0 {
            let left = self
                .hashes
                .pop()
                .expect("a one bit has its subtree on the edge");
            hash = node_hash(&left, &hash);
            level += 1;
            completed(
                Subtree {
                    level,
                    index: index >> level,
                },
                hash,
            );
        }
        self.hashes.push(hash);
        self.size += 1;
        invariant!(
            self.hashes.len() == self.size.count_ones() as usize
                && level as u32 == index.trailing_ones(),
            "leaf {index} left a right edge of {} hashes for size {}, completing {} levels",
            self.hashes.len(),
            self.size,
            level
        );
    }

    /// The tree's root (RFC 6962's MTH).
    pub fn root(&self) -> Hash {
        fold_right(&self.hashes).unwrap_or(EMPTY_ROOT)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::hash::{hex, leaf_hash};

    /// RFC 6962's MTH, written as the RFC states it: the reference every faster path is checked
    /// against.
    pub(crate) fn naive_root(leaves: &[Vec<u8>]) -> Hash {
        match leaves.len() {
            0 => EMPTY_ROOT,
            1 => leaf_hash(&leaves[0]),
            n => {
                let k = largest_power_below(n);
                node_hash(&naive_root(&leaves[..k]), &naive_root(&leaves[k..]))
            }
        }
    }

    pub(crate) fn largest_power_below(n: usize) -> usize {
        let mut k = 1;
        while k * 2 < n {
            k *= 2;
        }
        k
    }

    pub(crate) fn leaves(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("leaf {i}").into_bytes()).collect()
    }

    #[test]
    fn the_right_edge_root_is_the_rfc_root_for_every_size_up_to_300() {
        let all = leaves(300);
        let mut edge = RightEdge::new();
        assert_eq!(edge.root(), naive_root(&[]));
        for n in 1..=all.len() {
            edge.push(leaf_hash(&all[n - 1]), |_, _| {});
            assert_eq!(edge.root(), naive_root(&all[..n]), "size {n}");
            let stored = RightEdge::from_bytes(edge.size(), &edge.to_bytes()).unwrap();
            assert_eq!(stored, edge);
        }
    }

    /// The test vectors of RFC 6962's reference implementation (eight leaves of growing
    /// lengths), whose roots were computed again with Python's hashlib, apart from this crate.
    #[test]
    fn rfc6962_vectors() {
        let vectors: Vec<Vec<u8>> = vec![
            vec![],
            vec![0x00],
            vec![0x10],
            vec![0x20, 0x21],
            vec![0x30, 0x31],
            vec![0x40, 0x41, 0x42, 0x43],
            (0x50..0x58).collect(),
            (0x60..0x70).collect(),
        ];
        let roots = [
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
            "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
            "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
            "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
            "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
        ];
        let mut edge = RightEdge::new();
        assert_eq!(hex(&edge.root()), roots[0]);
        for (n, leaf) in vectors.iter().enumerate() {
            edge.push(leaf_hash(leaf), |_, _| {});
            assert_eq!(hex(&edge.root()), roots[n + 1], "size {}", n + 1);
            assert_eq!(hex(&naive_root(&vectors[..=n])), roots[n + 1]);
        }
    }

    #[test]
    fn every_completed_subtree_is_reported_once_with_its_hash() {
        let all = leaves(37);
        let mut edge = RightEdge::new();
        let mut seen = std::collections::BTreeMap::new();
        for leaf in &all {
            edge.push(leaf_hash(leaf), |s, h| {
                assert!(seen.insert(s, h).is_none(), "{s:?} twice");
            });
        }
        for (s, h) in &seen {
            let start = s.start() as usize;
            let end = start + (1usize << s.level);
            assert_eq!(*h, naive_root(&all[start..end]), "{s:?}");
        }
        // 37 leaves complete 37 + 18 + 9 + 4 + 2 + 1 subtrees.
        assert_eq!(seen.len(), 37 + 18 + 9 + 4 + 2 + 1);
    }

    #[test]
    fn a_range_decomposes_into_aligned_perfect_subtrees() {
        assert_eq!(
            range_subtrees(8, 15),
            vec![
                Subtree { level: 2, index: 2 },
                Subtree { level: 1, index: 6 },
                Subtree {
                    level: 0,
                    index: 14
                },
            ]
        );
        assert!(range_subtrees(5, 5).is_empty());
        assert!(RightEdge::from_parts(3, vec![[0; 32]]).is_none());
    }
}
