//! Inclusion and consistency proofs (RFC 6962 section 2.1.1 and 2.1.2, verified as RFC 9162
//! sections 2.1.3.2 and 2.1.4.2 say).
//!
//! Building a proof is split from reading hashes, so that the store can answer with one read:
//! a [`ProofPlan`] lists, for each hash of the proof, the perfect subtrees whose right fold it
//! is ([`crate::tree::fold_right`]); the store reads those subtrees (O(log n) of them, more
//! only along the right edge of a tree whose size is not a power of two) and
//! [`ProofPlan::resolve`] folds them. Nothing here re-hashes leaves.

use std::collections::HashMap;

use crate::hash::{node_hash, Hash};
use crate::invariant;
use crate::tree::{fold_right, range_subtrees, Subtree};

/// What a proof is made of: for each of its hashes in order, the perfect subtrees that fold
/// into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofPlan {
    pub items: Vec<Vec<Subtree>>,
}

/// Why no proof can be planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanError {
    /// The position is not below the size (inclusion), or `from` is above `to` (consistency).
    OutOfRange,
}

impl ProofPlan {
    /// Every subtree the proof needs, each once.
    pub fn needed(&self) -> Vec<Subtree> {
        let mut all: Vec<Subtree> = self.items.iter().flatten().copied().collect();
        all.sort();
        all.dedup();
        all
    }

    /// The proof's hashes from the subtrees' hashes; `None` if one is missing.
    pub fn resolve(&self, nodes: &HashMap<Subtree, Hash>) -> Option<Vec<Hash>> {
        self.items
            .iter()
            .map(|item| {
                let hashes = item
                    .iter()
                    .map(|s| nodes.get(s).copied())
                    .collect::<Option<Vec<_>>>()?;
                fold_right(&hashes)
            })
            .collect()
    }
}

/// The largest power of two strictly below `n` (`n >= 2`).
fn split(n: u64) -> u64 {
    1u64 << (63 - (n - 1).leading_zeros())
}

/// The audit path of leaf `index` (from 0) in the tree of `size` leaves.
pub fn inclusion_plan(index: u64, size: u64) -> Result<ProofPlan, PlanError> {
    if index >= size {
        return Err(PlanError::OutOfRange);
    }
    let mut items = Vec::new();
    path(index, 0, size, &mut items);
    // RFC 9162's length of an inclusion proof: the inner nodes below the point where the leaf's
    // and the last leaf's paths part, plus one per perfect subtree of the border. Every item is
    // a non-empty range inside the tree.
    let inner = 64 - (index ^ (size - 1)).leading_zeros();
    let border = (index >> inner).count_ones();
    invariant!(
        items.len() == (inner + border) as usize && plan_inside(&items, size),
        "inclusion of {index} in {size}: a plan of {} items, RFC 9162 says {}",
        items.len(),
        inner + border
    );
    Ok(ProofPlan { items })
}

/// RFC 6962's PATH(m, D[start:start+n]), appended to `out`.
fn path(m: u64, start: u64, n: u64, out: &mut Vec<Vec<Subtree>>) {
    if n <= 1 {
        return;
    }
    let k = split(n);
    if m < k {
        path(m, start, k, out);
        out.push(range_subtrees(start + k, start + n));
    } else {
        path(m - k, start + k, n - k, out);
        out.push(range_subtrees(start, start + k));
    }
}

/// The consistency proof between the trees of `from` and `to` leaves. Empty when `from` is 0
/// (every tree extends the empty one) or equals `to`.
pub fn consistency_plan(from: u64, to: u64) -> Result<ProofPlan, PlanError> {
    if from > to {
        return Err(PlanError::OutOfRange);
    }
    let mut items = Vec::new();
    if from > 0 && from < to {
        subproof(from, 0, to, true, &mut items);
    }
    invariant!(
        items.len() == consistency_len(from, to) && plan_inside(&items, to),
        "consistency of {from} with {to}: a plan of {} items, RFC 9162 says {}",
        items.len(),
        consistency_len(from, to)
    );
    Ok(ProofPlan { items })
}

/// RFC 9162's length of the consistency proof from `from` to `to` leaves (0 when there is
/// nothing to prove): the inclusion proof of leaf `from - 1` in `to`, less the levels of the
/// perfect subtree `from` ends on, plus that subtree's own hash unless it is the whole old tree.
fn consistency_len(from: u64, to: u64) -> usize {
    if from == 0 || from >= to {
        return 0;
    }
    let shift = from.trailing_zeros();
    let inner = 64 - ((from - 1) ^ (to - 1)).leading_zeros();
    let border = ((from - 1) >> inner).count_ones();
    let seed = u32::from(from != 1u64 << shift);
    (seed + inner - shift + border) as usize
}

/// Whether every item of a plan is a non-empty range of subtrees inside a tree of `size`.
fn plan_inside(items: &[Vec<Subtree>], size: u64) -> bool {
    items.iter().all(|item| {
        !item.is_empty()
            && item
                .iter()
                .all(|s| s.level < 64 && s.index < size >> s.level)
    })
}

/// RFC 6962's SUBPROOF(m, D[start:start+n], b), appended to `out`.
fn subproof(m: u64, start: u64, n: u64, whole: bool, out: &mut Vec<Vec<Subtree>>) {
    if m == n {
        if !whole {
            out.push(range_subtrees(start, start + n));
        }
        return;
    }
    let k = split(n);
    if m <= k {
        subproof(m, start, k, whole, out);
        out.push(range_subtrees(start + k, start + n));
    } else {
        subproof(m - k, start + k, n - k, false, out);
        out.push(range_subtrees(start, start + k));
    }
}

/// RFC 9162 section 2.1.3.2: whether `proof` shows the leaf of hash `leaf` at `index` in the
/// tree of `size` leaves whose root is `root`.
pub fn verify_inclusion(leaf: &Hash, index: u64, size: u64, proof: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut fn_, mut sn) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    sn == 0 && r == *root
}

/// RFC 9162 section 2.1.4.2: whether `proof` shows that the tree of `to` leaves and root
/// `to_root` extends the tree of `from` leaves and root `from_root`. From 0 only an empty proof
/// holds; between equal sizes, an empty proof and equal roots.
pub fn verify_consistency(
    from: u64,
    to: u64,
    from_root: &Hash,
    to_root: &Hash,
    proof: &[Hash],
) -> bool {
    if from > to {
        return false;
    }
    if from == 0 {
        return proof.is_empty();
    }
    if from == to {
        return proof.is_empty() && from_root == to_root;
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if from.is_power_of_two() {
        path.push(*from_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    let (mut fn_, mut sn) = (from - 1, to - 1);
    while fn_ & 1 == 1 {
        fn_ >>= 1;
        sn >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    fr == *from_root && sr == *to_root && sn == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::leaf_hash;
    use crate::tree::tests::{largest_power_below, leaves, naive_root};
    use crate::tree::RightEdge;

    /// A store of every perfect subtree of `n` leaves.
    fn store(all: &[Vec<u8>]) -> HashMap<Subtree, Hash> {
        let mut nodes = HashMap::new();
        let mut edge = RightEdge::new();
        for leaf in all {
            edge.push(leaf_hash(leaf), |s, h| {
                nodes.insert(s, h);
            });
        }
        nodes
    }

    /// RFC 6962's PATH over the leaves themselves, as the RFC states it.
    fn naive_path(m: usize, leaves: &[Vec<u8>]) -> Vec<Hash> {
        let n = leaves.len();
        if n <= 1 {
            return vec![];
        }
        let k = largest_power_below(n);
        if m < k {
            let mut p = naive_path(m, &leaves[..k]);
            p.push(naive_root(&leaves[k..]));
            p
        } else {
            let mut p = naive_path(m - k, &leaves[k..]);
            p.push(naive_root(&leaves[..k]));
            p
        }
    }

    /// RFC 6962's SUBPROOF over the leaves themselves.
    fn naive_subproof(m: usize, leaves: &[Vec<u8>], whole: bool) -> Vec<Hash> {
        let n = leaves.len();
        if m == n {
            return if whole {
                vec![]
            } else {
                vec![naive_root(leaves)]
            };
        }
        let k = largest_power_below(n);
        if m <= k {
            let mut p = naive_subproof(m, &leaves[..k], whole);
            p.push(naive_root(&leaves[k..]));
            p
        } else {
            let mut p = naive_subproof(m - k, &leaves[k..], false);
            p.push(naive_root(&leaves[..k]));
            p
        }
    }

    #[test]
    fn inclusion_proofs_match_the_rfc_and_verify_for_every_leaf_of_sizes_up_to_70() {
        let all = leaves(70);
        let nodes = store(&all);
        for n in 1..=all.len() {
            let root = naive_root(&all[..n]);
            for m in 0..n {
                let proof = inclusion_plan(m as u64, n as u64)
                    .unwrap()
                    .resolve(&nodes)
                    .unwrap();
                assert_eq!(proof, naive_path(m, &all[..n]), "m {m} n {n}");
                let leaf = leaf_hash(&all[m]);
                assert!(verify_inclusion(&leaf, m as u64, n as u64, &proof, &root));
                // Any flipped bit, another index, another size or another leaf fails.
                for i in 0..proof.len() {
                    let mut bad = proof.clone();
                    bad[i][i % 32] ^= 1 << (i % 8);
                    assert!(!verify_inclusion(&leaf, m as u64, n as u64, &bad, &root));
                }
                if n > 1 {
                    let other = (m + 1) % n;
                    assert!(!verify_inclusion(
                        &leaf,
                        other as u64,
                        n as u64,
                        &proof,
                        &root
                    ));
                }
                assert!(!verify_inclusion(
                    &leaf_hash(b"x"),
                    m as u64,
                    n as u64,
                    &proof,
                    &root
                ));
            }
        }
        assert_eq!(inclusion_plan(3, 3), Err(PlanError::OutOfRange));
    }

    #[test]
    fn consistency_proofs_match_the_rfc_and_verify_for_every_pair_up_to_70() {
        let all = leaves(70);
        let nodes = store(&all);
        for n in 1..=all.len() {
            let to_root = naive_root(&all[..n]);
            for m in 1..=n {
                let from_root = naive_root(&all[..m]);
                let proof = consistency_plan(m as u64, n as u64)
                    .unwrap()
                    .resolve(&nodes)
                    .unwrap();
                let expected = if m == n {
                    vec![]
                } else {
                    naive_subproof(m, &all[..n], true)
                };
                assert_eq!(proof, expected, "m {m} n {n}");
                assert!(verify_consistency(
                    m as u64, n as u64, &from_root, &to_root, &proof
                ));
                for i in 0..proof.len() {
                    let mut bad = proof.clone();
                    bad[i][(i * 7) % 32] ^= 0x80;
                    assert!(
                        !verify_consistency(m as u64, n as u64, &from_root, &to_root, &bad),
                        "flipped m {m} n {n} i {i}"
                    );
                }
                if m < n {
                    let forged = naive_root(&leaves(n)[..0]);
                    assert!(!verify_consistency(
                        m as u64, n as u64, &forged, &to_root, &proof
                    ));
                    assert!(!verify_consistency(
                        m as u64, n as u64, &from_root, &from_root, &proof
                    ));
                }
            }
        }
        assert!(consistency_plan(0, 5).unwrap().items.is_empty());
        assert!(verify_consistency(0, 5, &[0; 32], &[1; 32], &[]));
        assert_eq!(consistency_plan(6, 5), Err(PlanError::OutOfRange));
    }

    #[test]
    fn a_proof_needs_logarithmically_many_stored_subtrees() {
        let n = (1u64 << 40) - 1; // the worst right edge: forty subtrees
        for m in [0, 1, n / 2, n - 1] {
            let needed = inclusion_plan(m, n).unwrap().needed().len();
            assert!(needed <= 40 * 2, "inclusion of {m}: {needed}");
        }
        let needed = consistency_plan(n / 3, n).unwrap().needed().len();
        assert!(needed <= 40 * 3, "consistency: {needed}");
    }
}
