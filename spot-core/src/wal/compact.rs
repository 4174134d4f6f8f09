//! The snapshot thread's work: write a snapshot the engine thread serialized, then compact
//! (delete or archive the segments and snapshots no longer needed).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;

use crate::journal::{self, Catalog, SharedCatalog};
use crate::snapshot;
use crate::storage::{segment_name, sync_dir, FailPoints};

/// A snapshot serialized by the engine thread, for the snapshot thread to write.
pub(super) struct SnapshotJob {
    pub(super) seq: u64,
    pub(super) bytes: Vec<u8>,
    pub(super) pause: std::time::Duration,
}

/// Write one snapshot, then compact; returns the buffer for reuse. Failures are logged, never
/// fatal: the WAL still holds everything the snapshot would have covered.
pub(super) fn write_snapshot(
    dir: &Path,
    catalog: &SharedCatalog,
    job: SnapshotJob,
    retain: &AtomicU64,
    fail: FailPoints,
) -> Vec<u8> {
    let started = Instant::now();
    match snapshot::write_file(dir, job.seq, &job.bytes, fail) {
        Ok(path) => {
            tracing::info!(
                "snapshot seq={} pause_ms={} bytes={} write_ms={} path={}",
                job.seq,
                millis(job.pause),
                job.bytes.len(),
                millis(started.elapsed()),
                path.display()
            );
            journal::lock(catalog)
                .snapshots
                .push((job.seq, job.bytes.len() as u64));
            if let Err(e) = compact(catalog, retain.load(Ordering::Acquire)) {
                tracing::error!(error = %format!("{e:#}"), "compaction failed");
            }
        }
        Err(e) => {
            tracing::error!(seq = job.seq, error = %format!("{e:#}"), "writing a snapshot failed");
        }
    }
    job.bytes
}

/// A duration as milliseconds with three decimals, without float arithmetic.
fn millis(d: std::time::Duration) -> String {
    format!("{}.{:03}", d.as_millis(), d.as_micros() % 1000)
}

/// Remove (or archive) every sealed segment whose last seq is at or before both the older of
/// the two newest durable snapshots and the conservation check's retained position, then delete snapshots
/// older than the two newest.
fn compact(catalog: &SharedCatalog, retain_after: u64) -> anyhow::Result<()> {
    let (dir, archive, victims, old_snapshots) = {
        let c = journal::lock(catalog);
        let n = c.snapshots.len();
        if n < 2 {
            return Ok(());
        }
        let limit = c.snapshots[n - 2].0.min(retain_after);
        let victims: Vec<u64> = c
            .live
            .windows(2)
            .filter(|w| w[1].first_seq - 1 <= limit)
            .map(|w| w[0].first_seq)
            .collect();
        let old: Vec<u64> = c.snapshots[..n - 2].iter().map(|s| s.0).collect();
        (c.dir.clone(), c.archive.clone(), victims, old)
    };
    for first in &victims {
        let name = segment_name(*first);
        let from = dir.join(&name);
        match &archive {
            Some(archive) => {
                let to = archive.join(&name);
                move_file(&from, &to, catalog, *first)?;
                sync_dir(archive)?;
            }
            None => {
                let mut c = journal::lock(catalog);
                std::fs::remove_file(&from)
                    .with_context(|| format!("removing {}", from.display()))?;
                c.live.retain(|s| s.first_seq != *first);
                c.drop_index(*first);
            }
        }
        tracing::info!(segment = %name, archived = archive.is_some(), "WAL segment compacted");
    }
    if !victims.is_empty() {
        sync_dir(&dir)?;
    }
    for seq in &old_snapshots {
        let path = dir.join(snapshot::file_name(*seq));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
        journal::lock(catalog).snapshots.retain(|s| s.0 != *seq);
    }
    if !old_snapshots.is_empty() {
        sync_dir(&dir)?;
    }
    Ok(())
}

/// Move a sealed segment into the archive: a rename when both are on one file system, else a
/// copy (fsynced, renamed into place) and a removal. The catalog switches under its lock, so a
/// journal reader never picks a path that is gone.
fn move_file(from: &Path, to: &Path, catalog: &SharedCatalog, first: u64) -> anyhow::Result<()> {
    let switch = |c: &mut Catalog| {
        c.live.retain(|s| s.first_seq != first);
        if !c.archived.contains(&first) {
            c.archived.push(first);
            c.archived.sort_unstable();
        }
    };
    {
        let mut c = journal::lock(catalog);
        match std::fs::rename(from, to) {
            Ok(()) => {
                switch(&mut c);
                return Ok(());
            }
            Err(e) if e.raw_os_error() == Some(18) => {} // EXDEV: another file system
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("moving {} to {}", from.display(), to.display()))
            }
        }
    }
    let tmp = PathBuf::from(format!("{}.tmp", to.display()));
    std::fs::copy(from, &tmp)
        .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", tmp.display()))?;
    let mut c = journal::lock(catalog);
    std::fs::rename(&tmp, to).with_context(|| format!("renaming {}", tmp.display()))?;
    if let Some(parent) = to.parent() {
        sync_dir(parent)?;
    }
    std::fs::remove_file(from).with_context(|| format!("removing {}", from.display()))?;
    switch(&mut c);
    Ok(())
}
