//! The snapshot start-up begins from: the newest one that decodes (an unfinished one removed, a
//! damaged one skipped and later set aside), or an empty engine when there is none.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use crate::assets::Assets;
use crate::engine::Engine;
use crate::snapshot::{self, WalPosition};
use crate::storage::sync_dir;

/// The snapshot start-up begins from, and what it found on the way.
pub(super) struct Base {
    /// Seq of the snapshot (0: none, the WAL from seq 1).
    pub(super) seq: u64,
    pub(super) engine: Engine,
    /// Where the WAL record after `seq` starts (none without a snapshot).
    pub(super) pos: Option<WalPosition>,
    /// Seqs of every snapshot file found, sorted.
    pub(super) snapshots: Vec<u64>,
    /// Snapshots found damaged, set aside once start-up succeeds.
    pub(super) damaged: Vec<PathBuf>,
    /// Time spent reading and decoding snapshots, ms.
    pub(super) snapshot_ms: u64,
}

impl Base {
    pub(super) fn path(&self, dir: &Path) -> PathBuf {
        dir.join(snapshot::file_name(self.seq))
    }

    pub(super) fn damaged_names(&self) -> Vec<String> {
        self.damaged
            .iter()
            .map(|p| p.display().to_string())
            .collect()
    }
}

/// Remove the leftovers of an interrupted snapshot write and decode the newest valid snapshot
/// (an empty engine when there is none).
pub(super) fn load_base(dir: &Path, assets: Assets) -> anyhow::Result<Base> {
    let mut snapshots = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("snapshot-") && name.ends_with(".snap.tmp") {
            let p = dir.join(name);
            tracing::warn!(path = %p.display(), "removing an unfinished snapshot");
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        } else if let Some(seq) = snapshot::parse_name(name) {
            snapshots.push(seq);
        }
    }
    snapshots.sort_unstable();
    let mut damaged = Vec::new();
    let loading = Instant::now();
    let mut found = None;
    for &seq in snapshots.iter().rev() {
        let path = dir.join(snapshot::file_name(seq));
        let decoded = std::fs::read(&path)
            .context("reading")
            .and_then(|bytes| snapshot::decode(&bytes, assets.clone()));
        match decoded {
            Ok((engine, pos)) if engine.last_seq() == seq => {
                found = Some((seq, engine, pos));
                break;
            }
            Ok((engine, _)) => {
                tracing::warn!(path = %path.display(), seq = engine.last_seq(), "snapshot holds another seq than its name says; skipping it");
                damaged.push(path);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %format!("{e:#}"), "snapshot is damaged; falling back to the previous one");
                damaged.push(path);
            }
        }
    }
    let (seq, engine, pos) = match found {
        Some((seq, engine, pos)) => (seq, engine, Some(pos)),
        None => (0, Engine::new(assets), None),
    };
    let snapshot_ms = u64::try_from(loading.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(Base {
        seq,
        engine,
        pos,
        snapshots,
        damaged,
        snapshot_ms,
    })
}

/// Damaged snapshots are set aside (kept for an operator, never read again).
pub(super) fn set_aside(dir: &Path, damaged: &[PathBuf]) -> anyhow::Result<()> {
    for p in damaged {
        let aside = PathBuf::from(format!("{}.damaged", p.display()));
        std::fs::rename(p, &aside).with_context(|| format!("setting aside {}", p.display()))?;
    }
    if !damaged.is_empty() {
        sync_dir(dir)?;
    }
    Ok(())
}
