//! RFC 6962's hashes, with SHA-256: a leaf is `SHA-256(0x00 ‖ leaf bytes)`, an interior node
//! `SHA-256(0x01 ‖ left ‖ right)`, the empty tree's root `SHA-256("")`. The prefixes keep a leaf
//! from ever being taken for a node (second-preimage resistance).

use sha2::{Digest, Sha256};

/// A SHA-256 hash.
pub type Hash = [u8; 32];

/// The root of the empty tree: SHA-256 of nothing.
pub const EMPTY_ROOT: Hash = [
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
    0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
];

/// The hash of one leaf's bytes.
pub fn leaf_hash(leaf: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0x00]);
    h.update(leaf);
    h.finalize().into()
}

/// The hash of an interior node over its two children.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([0x01]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// Lowercase hex, for messages and tests.
pub fn hex(hash: &Hash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_root_is_sha256_of_nothing() {
        assert_eq!(EMPTY_ROOT, <[u8; 32]>::from(Sha256::digest(b"")));
    }

    /// Vectors computed independently of this crate (Python's hashlib).
    #[test]
    fn leaf_and_node_hashes_match_independent_sha256_runs() {
        let l = leaf_hash(b"");
        assert_eq!(
            hex(&l),
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        );
        assert_eq!(
            hex(&node_hash(&l, &l)),
            "fe43d66afa4a9a5c4f9c9da89f4ffb52635c8f342e7ffb731d68e36c5982072a"
        );
    }
}
