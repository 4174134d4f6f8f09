//! Start-up: lock the data directory, take the base snapshot (`base.rs`), replay every WAL
//! segment after it (`scan.rs`), cut a torn tail off the last one, and hand back the engine with
//! the active segment open for appends. Anything that could forget acknowledged money (a gap,
//! damage in the middle, a WAL behind the snapshot) refuses to start and leaves the files as
//! they are.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};

use super::base::{load_base, set_aside, Base};
use super::scan::{later_valid_frame, scan_segment};
use super::writer::{StorageOptions, Wal};
use crate::assets::Assets;
use crate::engine::Engine;
use crate::journal::{Catalog, LiveSegment};
use crate::snapshot::{self, WalPosition};
use crate::storage::{create_dir, list_segments, segment_name, sync_dir, LOCK_FILE};

/// What start-up found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Seq of the snapshot start-up began from (0: none, the WAL from seq 1).
    pub snapshot_seq: u64,
    /// WAL records applied after the snapshot.
    pub records: u64,
    /// Bytes of a torn or damaged tail that were cut off the last segment.
    pub dropped_bytes: u64,
    /// Length of the last segment after repair.
    pub valid_len: u64,
    /// Snapshots found damaged and skipped (renamed to `*.damaged`).
    pub damaged_snapshots: Vec<String>,
    /// Time spent reading and decoding snapshots, ms.
    pub snapshot_ms: u64,
}

/// Open the data directory: lock it, load the newest valid snapshot
/// (falling back to the previous one when it is damaged), replay the WAL after it and repair
/// a torn tail of the last segment. Refuses (leaving every file as it is) when the WAL does not
/// reach the snapshot, when there is a gap between the snapshot and the segments or between
/// segments, when a segment other than the last is damaged, or when the last one is damaged in
/// the middle: any of those could forget acknowledged money.
pub fn open(
    assets: Assets,
    dir: &Path,
    options: &StorageOptions,
) -> anyhow::Result<(Engine, Wal, ReplayReport)> {
    let lock = lock_dir(dir, options)?;
    let mut base = load_base(dir, assets)?;
    let segs = wal_segments(dir, &base)?;
    let start = first_segment_to_replay(dir, &segs, &base)?;
    let mut report = ReplayReport {
        snapshot_seq: base.seq,
        records: 0,
        dropped_bytes: 0,
        valid_len: 0,
        damaged_snapshots: base.damaged_names(),
        snapshot_ms: base.snapshot_ms,
    };
    let (file, active_bytes) = replay_segments(dir, &segs, start, &mut base, &mut report)?;
    let active_first = *segs.last().context("there is at least one segment")?;
    set_aside(dir, &base.damaged)?;
    let catalog = build_catalog(dir, options, &segs, &base)?;
    let wal = Wal {
        file,
        dir: dir.to_path_buf(),
        active_first,
        active_bytes,
        options: options.clone(),
        catalog: Arc::new(std::sync::Mutex::new(catalog)),
        since_snapshot_records: report.records,
        _lock: lock,
    };
    Ok((base.engine, wal, report))
}

/// Create the data directory (and the archive) and take its `LOCK`: two engines appending to
/// one log would interleave records and double-spend.
fn lock_dir(dir: &Path, options: &StorageOptions) -> anyhow::Result<File> {
    create_dir(dir)?;
    if let Some(archive) = &options.archive_dir {
        create_dir(archive)?;
    }
    let lock_path = dir.join(LOCK_FILE);
    let lock_existed = lock_path.exists();
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            bail!(
                "{} is locked by another spot-core process",
                lock_path.display()
            )
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", lock_path.display()))
        }
    }
    if !lock_existed {
        sync_dir(dir)?;
    }
    Ok(lock)
}

/// The segments to start from; the first one is created in an empty directory, refused when a
/// snapshot (or a damaged one) says there should be a WAL.
fn wal_segments(dir: &Path, base: &Base) -> anyhow::Result<Vec<u64>> {
    let segs = list_segments(dir)?;
    if !segs.is_empty() {
        return Ok(segs);
    }
    if base.seq > 0 {
        bail!(
            "snapshot {} covers seq {} but {} holds no WAL segment: the WAL is behind \
             the snapshot; refusing to start",
            base.path(dir).display(),
            base.seq,
            dir.display()
        );
    }
    if !base.damaged.is_empty() {
        bail!(
            "no usable snapshot (damaged: {}) and no WAL segment in {}; refusing to start",
            base.damaged_names().join(", "),
            dir.display()
        );
    }
    let path = dir.join(segment_name(1));
    File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    sync_dir(dir)?;
    Ok(vec![1])
}

/// Index in `segs` of the segment holding the record after the snapshot; refused when the
/// segments start later (records would be missing).
fn first_segment_to_replay(dir: &Path, segs: &[u64], base: &Base) -> anyhow::Result<usize> {
    let snap_seq = base.seq;
    if let Some(start) = segs.iter().rposition(|f| *f <= snap_seq + 1) {
        return Ok(start);
    }
    if snap_seq == 0 {
        bail!(
            "the WAL segments in {} start at {} (seq {}), not at seq 1, and there is no usable \
             snapshot{}: records 1..{} are missing; refusing to start",
            dir.display(),
            segment_name(segs[0]),
            segs[0],
            if base.damaged.is_empty() {
                String::new()
            } else {
                format!(" (damaged: {})", base.damaged_names().join(", "))
            },
            segs[0] - 1
        );
    }
    bail!(
        "gap between snapshot {} (seq {snap_seq}) and the first WAL segment {} (seq {}): \
         records {}..{} are missing; refusing to start",
        base.path(dir).display(),
        segment_name(segs[0]),
        segs[0],
        snap_seq + 1,
        segs[0] - 1
    );
}

/// Apply every record after the snapshot, segment by segment from `segs[start]`, cutting a torn
/// tail off the last one. Returns the last segment, open for appends, and its valid length.
fn replay_segments(
    dir: &Path,
    segs: &[u64],
    start: usize,
    base: &mut Base,
    report: &mut ReplayReport,
) -> anyhow::Result<(File, u64)> {
    let mut wal_last = 0u64;
    let mut active = None;
    for (j, &first) in segs.iter().enumerate().skip(start) {
        let path = dir.join(segment_name(first));
        if j > start && first != base.engine.last_seq() + 1 {
            return Err(segment_gap(
                segs[j - 1],
                base.engine.last_seq(),
                first,
                &path,
            ));
        }
        let from_snapshot = base.pos.filter(|p| j == start && p.segment == first);
        let (file, valid_len) =
            replay_segment(dir, &path, from_snapshot, base, &mut wal_last, report)?;
        let total_len = file.metadata()?.len();
        if valid_len < total_len {
            if j + 1 < segs.len() {
                bail!(
                    "{} is damaged at byte {} (after seq {}), and later segments follow: this is \
                     corruption in the middle of the log, not a torn tail; refusing to start and \
                     leaving the files untouched",
                    path.display(),
                    valid_len,
                    base.engine.last_seq()
                );
            }
            let last_seq = base.engine.last_seq();
            report.dropped_bytes = cut_torn_tail(
                &file,
                &path,
                valid_len,
                total_len,
                wal_last.max(last_seq),
                last_seq,
            )?;
        }
        if j + 1 == segs.len() {
            report.valid_len = valid_len;
            active = Some((file, valid_len));
        }
    }
    if wal_last < base.seq {
        bail!(
            "snapshot {} covers seq {} but the WAL ends at seq {wal_last}: the WAL is \
             behind the snapshot; refusing to start",
            base.path(dir).display(),
            base.seq
        );
    }
    active.context("there is at least one segment")
}

/// Two segments that do not join: refused, records would be missing.
fn segment_gap(previous: u64, last_seq: u64, first: u64, path: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "gap between WAL segments: {} ends at seq {} but the next segment {} starts at \
         seq {first}; refusing to start",
        segment_name(previous),
        last_seq,
        path.display()
    )
}

/// Open one segment and apply its records after the snapshot (from its position when
/// `from_snapshot` is this segment's); returns the file and where its intact records end.
fn replay_segment(
    dir: &Path,
    path: &Path,
    from_snapshot: Option<WalPosition>,
    base: &mut Base,
    wal_last: &mut u64,
    report: &mut ReplayReport,
) -> anyhow::Result<(File, u64)> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let snap_seq = base.seq;
    let mut offset = 0;
    if let Some(p) = from_snapshot {
        let total_len = file.metadata()?.len();
        if p.offset > total_len {
            bail!(
                "snapshot {} covers seq {snap_seq}, ending at byte {} of {}, but that segment \
                 has only {total_len} bytes: the WAL is behind the snapshot; refusing to start",
                base.path(dir).display(),
                p.offset,
                path.display()
            );
        }
        offset = p.offset;
        *wal_last = (*wal_last).max(snap_seq);
    }
    let engine = &mut base.engine;
    let scan = scan_segment(&file, path, offset, |record| {
        let seq = record.seq();
        *wal_last = (*wal_last).max(seq);
        if seq <= snap_seq {
            return Ok(());
        }
        engine.apply_record(record)?;
        report.records += 1;
        Ok(())
    })?;
    Ok((file, scan.valid_len))
}

/// Cut the damaged end of the last segment, `valid_len..total_len`, unless an intact record
/// after `last_seq` follows in it (corruption in the middle: refused). Returns the bytes cut.
fn cut_torn_tail(
    file: &File,
    path: &Path,
    valid_len: u64,
    total_len: u64,
    last_seq: u64,
    engine_seq: u64,
) -> anyhow::Result<u64> {
    let dropped = total_len - valid_len;
    let mut rest = vec![0u8; usize::try_from(dropped).context("WAL tail too large")?];
    let mut f = file;
    f.seek(SeekFrom::Start(valid_len))?;
    f.read_exact(&mut rest)?;
    if let Some((at, seq)) = later_valid_frame(&rest, last_seq) {
        bail!(
            "{} is damaged at byte {} (after seq {}), but an intact record (seq {seq}) \
             follows at byte {}: this is not a torn tail but corruption in the middle of \
             the log; refusing to start and leaving the file untouched",
            path.display(),
            valid_len,
            engine_seq,
            valid_len + at as u64
        );
    }
    tracing::warn!(
        path = %path.display(),
        dropped_bytes = dropped,
        valid_len,
        "WAL ends with a torn or damaged record; dropping it (it was never acknowledged)"
    );
    file.set_len(valid_len)
        .with_context(|| format!("truncating {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    Ok(dropped)
}

/// The catalog of what start-up found: live segments (the last one, active, with 0 bytes),
/// archived ones before them, and the snapshots up to the base.
fn build_catalog(
    dir: &Path,
    options: &StorageOptions,
    segs: &[u64],
    base: &Base,
) -> anyhow::Result<Catalog> {
    let mut catalog = Catalog::new(dir.to_path_buf(), options.archive_dir.clone());
    let active_first = segs.last().copied();
    for &first in segs {
        let bytes = if Some(first) == active_first {
            0
        } else {
            std::fs::metadata(dir.join(segment_name(first)))?.len()
        };
        catalog.live.push(LiveSegment {
            first_seq: first,
            bytes,
        });
    }
    if let Some(archive) = &options.archive_dir {
        catalog.archived = list_segments(archive)?
            .into_iter()
            .filter(|f| *f < segs[0])
            .collect();
    }
    for &seq in base.snapshots.iter().filter(|s| **s <= base.seq) {
        let len = std::fs::metadata(dir.join(snapshot::file_name(seq)))?.len();
        catalog.snapshots.push((seq, len));
    }
    Ok(catalog)
}
