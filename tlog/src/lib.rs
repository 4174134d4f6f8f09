//! The tamper-evident log, pure (no I/O, no clock): what the ledger hashes and signs so that no
//! one can rewrite its history unseen (`docs/adr/0016-tamper-evident-log.md`).
//!
//! By job, bottom up: `leaf` (an entry's exact bytes, RFC 8785 canonical JSON) → `hash` (RFC 6962
//! leaf and node hashes) → `tree` (perfect subtrees, the right edge that grows by one leaf, roots)
//! → `proof` (which subtrees an inclusion or consistency proof needs, and the RFC 9162
//! verifications) → `tile` (where a subtree's hash is stored: tiles of 256 hashes every 8 levels);
//! apart: `note` (C2SP signed notes with Ed25519, signer and verifier keys) and
//! `checkpoint` (C2SP tlog-checkpoint bodies); `invariant` (what a broken invariant of the tree's
//! own state does). The storage and the follower that feeds it live in `tlog-follower`; the HTTP
//! routes (`/api/v1/log/...`: checkpoint, key, entries, proofs, receipts) in
//! `query-api/src/log_routes.rs`; the CLI (`ledger verify`, `ledger log ...`, `ledger log-key`)
//! in `ledger/src/log_cli.rs`.

pub mod checkpoint;
pub mod hash;
pub mod invariant;
pub mod leaf;
pub mod note;
pub mod proof;
pub mod tile;
pub mod tree;

pub use checkpoint::Checkpoint;
pub use hash::{leaf_hash, node_hash, Hash, EMPTY_ROOT};
pub use leaf::Entry;
pub use note::{NoteError, Signer, Verifier};
pub use proof::{
    consistency_plan, inclusion_plan, verify_consistency, verify_inclusion, ProofPlan,
};
pub use tile::{Tile, TileSlice, TILE_HEIGHT, TILE_WIDTH};
pub use tree::{RightEdge, Subtree};

/// The origin of a log: the ledger's name, and its cell's when the ledger runs several cells.
/// One cell (`None`) keeps the bare name, so a single-cell ledger's origin never changes when
/// cells land.
pub fn origin(ledger: &str, cell: Option<&str>) -> String {
    match cell {
        None => ledger.to_owned(),
        Some(cell) => format!("{ledger}/cell/{cell}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_origin_names_its_cell_only_when_there_is_one() {
        assert_eq!(
            super::origin("ledger.example/log", None),
            "ledger.example/log"
        );
        assert_eq!(
            super::origin("ledger.example/log", Some("2")),
            "ledger.example/log/cell/2"
        );
    }
}
