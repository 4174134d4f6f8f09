//! The write-ahead log: segments, start-up (newest valid snapshot plus the WAL after it, with
//! torn-tail repair), and the group-commit thread that owns the engine and the active segment,
//! with the snapshot thread beside it. Framing, names and fail points are in `storage.rs`.
//!
//! Segments: `<data-dir>/wal-<first seq, 20 digits>.seg`, a new one started once the active one
//! reaches `--segment-bytes` (after a synced batch, so a segment never ends with a torn record
//! unless it is the last one).

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use tokio::sync::{mpsc, oneshot};

use crate::assets::Assets;
use crate::engine::Engine;
use crate::journal::{self, Catalog, JournalJob, LiveSegment, SharedCatalog};
use crate::protocol::{JournalRecord, Request, Response};
use crate::snapshot::{self, WalPosition};
use crate::storage::{create_dir, frame_header, list_segments, read_full, sync_dir};
pub use crate::storage::{
    encode_record, parse_segment_name, segment_name, FailPoints, HEADER_BYTES, LEGACY_WAL_FILE,
    LOCK_FILE, MAX_RECORD_BYTES,
};

/// Most requests folded into one write + sync.
pub const MAX_BATCH: usize = 4096;

/// Where and how often spot-core writes segments, snapshots and archives.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct StorageOptions {
    /// Take a snapshot after this many WAL records since the previous one (0: never by count).
    #[arg(
        long,
        env = "SPOT_CORE_SNAPSHOT_EVERY_RECORDS",
        default_value_t = 100_000
    )]
    pub snapshot_every_records: u64,
    /// Take a snapshot after this many WAL bytes since the previous one (0: never by size).
    #[arg(
        long,
        env = "SPOT_CORE_SNAPSHOT_EVERY_BYTES",
        default_value_t = 64 << 20
    )]
    pub snapshot_every_bytes: u64,
    /// Start a new WAL segment once the active one reaches this size.
    #[arg(long, env = "SPOT_CORE_SEGMENT_BYTES", default_value_t = 64 << 20)]
    pub segment_bytes: u64,
    /// Move compacted segments here instead of deleting them (an operator keeps them for
    /// audits; `journal` serves them).
    #[arg(long, env = "SPOT_CORE_ARCHIVE_DIR")]
    pub archive_dir: Option<PathBuf>,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            snapshot_every_records: 100_000,
            snapshot_every_bytes: 64 << 20,
            segment_bytes: 64 << 20,
            archive_dir: None,
        }
    }
}

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

/// The active segment and what the commit thread needs to rotate it and publish it.
#[derive(Debug)]
pub struct Wal {
    file: File,
    dir: PathBuf,
    active_first: u64,
    active_bytes: u64,
    options: StorageOptions,
    catalog: SharedCatalog,
    /// Records replayed after the snapshot start-up began from: they count towards the next
    /// snapshot, so a spot-core restarted more often than every N records still takes one (the
    /// WAL to replay at start stays bounded however often the process dies).
    since_snapshot_records: u64,
    _lock: File,
}

impl Wal {
    /// Write already-framed records and make them durable.
    pub fn append(&mut self, framed: &[u8]) -> io::Result<()> {
        self.file.write_all(framed)?;
        self.file.sync_data()?;
        self.active_bytes += framed.len() as u64;
        Ok(())
    }

    /// Path of the active segment.
    pub fn path(&self) -> PathBuf {
        self.dir.join(segment_name(self.active_first))
    }

    pub fn catalog(&self) -> &SharedCatalog {
        &self.catalog
    }

    /// Start a new segment at `next_seq` when the active one is full. Only called with every
    /// written record synced, so sealed segments never end torn.
    fn maybe_rotate(&mut self, next_seq: u64) -> anyhow::Result<()> {
        if self.active_bytes < self.options.segment_bytes || next_seq == self.active_first {
            return Ok(());
        }
        let path = self.dir.join(segment_name(next_seq));
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        sync_dir(&self.dir)?;
        let sealed = (self.active_first, self.active_bytes);
        self.file = file;
        self.active_first = next_seq;
        self.active_bytes = 0;
        let mut c = journal::lock(&self.catalog);
        if let Some(s) = c.live.last_mut().filter(|s| s.first_seq == sealed.0) {
            s.bytes = sealed.1;
        }
        c.live.push(LiveSegment {
            first_seq: next_seq,
            bytes: 0,
        });
        Ok(())
    }

    /// Fill the storage fields of a status answer.
    fn fill_status(&self, core: &mut crate::protocol::CoreStatus) {
        let c = journal::lock(&self.catalog);
        c.fill(core);
        core.wal_bytes += self.active_bytes;
    }
}

/// Open the data directory: lock it, adopt a legacy `wal.log`, load the newest valid snapshot
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
    adopt_legacy_wal(dir)?;
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

/// Rename a legacy `wal.log` to the first segment, unless segments exist already (refused:
/// which one is current cannot be guessed) or an older spot-core still holds it.
fn adopt_legacy_wal(dir: &Path) -> anyhow::Result<()> {
    let legacy = dir.join(LEGACY_WAL_FILE);
    if !legacy.exists() {
        return Ok(());
    }
    let segs = list_segments(dir)?;
    if !segs.is_empty() {
        bail!(
            "{} holds both a legacy {LEGACY_WAL_FILE} and WAL segments ({} ...); refusing to \
             guess which is current",
            dir.display(),
            segment_name(segs[0])
        );
    }
    // An older spot-core locks `wal.log` itself, not `LOCK`: make sure none is running.
    let old = File::open(&legacy).with_context(|| format!("opening {}", legacy.display()))?;
    if let Err(std::fs::TryLockError::WouldBlock) = old.try_lock() {
        bail!(
            "{} is locked by another (older) spot-core process",
            legacy.display()
        );
    }
    drop(old);
    let first = dir.join(segment_name(1));
    std::fs::rename(&legacy, &first)
        .with_context(|| format!("adopting {} as {}", legacy.display(), first.display()))?;
    sync_dir(dir)?;
    tracing::info!(from = %legacy.display(), to = %first.display(), "legacy WAL adopted as the first segment");
    Ok(())
}

/// The snapshot start-up begins from, and what it found on the way.
struct Base {
    /// Seq of the snapshot (0: none, the WAL from seq 1).
    seq: u64,
    engine: Engine,
    /// Where the WAL record after `seq` starts (none without a snapshot).
    pos: Option<WalPosition>,
    /// Seqs of every snapshot file found, sorted.
    snapshots: Vec<u64>,
    /// Snapshots found damaged, set aside once start-up succeeds.
    damaged: Vec<PathBuf>,
    /// Time spent reading and decoding snapshots, ms.
    snapshot_ms: u64,
}

impl Base {
    fn path(&self, dir: &Path) -> PathBuf {
        dir.join(snapshot::file_name(self.seq))
    }

    fn damaged_names(&self) -> Vec<String> {
        self.damaged
            .iter()
            .map(|p| p.display().to_string())
            .collect()
    }
}

/// Remove the leftovers of an interrupted snapshot write and decode the newest valid snapshot
/// (an empty engine when there is none).
fn load_base(dir: &Path, assets: Assets) -> anyhow::Result<Base> {
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

/// Damaged snapshots are set aside (kept for an operator, never read again).
fn set_aside(dir: &Path, damaged: &[PathBuf]) -> anyhow::Result<()> {
    for p in damaged {
        let aside = PathBuf::from(format!("{}.damaged", p.display()));
        std::fs::rename(p, &aside).with_context(|| format!("setting aside {}", p.display()))?;
    }
    if !damaged.is_empty() {
        sync_dir(dir)?;
    }
    Ok(())
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

/// What `scan_segment` read.
struct Scan {
    /// End of the last intact record.
    valid_len: u64,
}

/// Feed every intact record of one segment from `start` to `apply`, stopping at the first bad
/// frame (short header or payload, absurd length, bad crc, empty payload). An error from
/// `apply`, or a record with a valid checksum that does not parse, aborts.
fn scan_segment(
    file: &File,
    path: &Path,
    start: u64,
    apply: impl FnMut(JournalRecord) -> anyhow::Result<()>,
) -> anyhow::Result<Scan> {
    let mut f = file;
    f.seek(SeekFrom::Start(start))?;
    let reader = BufReader::with_capacity(1 << 20, f);
    let valid_len = scan_frames(reader, path, start, apply)?;
    Ok(Scan { valid_len })
}

/// The frame loop of start-up's segment scan, over any reader positioned at byte `start` of
/// the segment at `path` (named in errors): feeds every intact record to `apply` and returns
/// the end of the last one. Public so the fuzz targets read segments from memory through the
/// same code.
pub fn scan_frames(
    mut reader: impl Read,
    path: &Path,
    start: u64,
    mut apply: impl FnMut(JournalRecord) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut valid_len = start;
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; HEADER_BYTES];
        if read_full(&mut reader, &mut header)? < HEADER_BYTES {
            break;
        }
        let (len, crc) = frame_header(&header);
        if len > MAX_RECORD_BYTES {
            break;
        }
        payload.resize(len as usize, 0);
        if read_full(&mut reader, &mut payload)? < payload.len() {
            break;
        }
        if crc32fast::hash(&payload) != crc {
            break;
        }
        let record = match serde_json::from_slice::<JournalRecord>(&payload) {
            Ok(r) => r,
            // An all-zero header frames an empty payload with a matching crc: that is a
            // zero-filled tail (preallocated or not yet written blocks), i.e. torn.
            Err(_) if payload.is_empty() => break,
            // A checksummed record we cannot read was written whole, most likely by a
            // newer spot-core. Truncating it would silently forget acknowledged money
            // movements, so refuse to start instead.
            Err(e) => bail!(
                "{} holds an intact record at byte {valid_len} that this version cannot read: {e}",
                path.display()
            ),
        };
        let seq = record.seq();
        apply(record).with_context(|| {
            format!(
                "replaying {} at byte {valid_len} (seq {seq})",
                path.display()
            )
        })?;
        valid_len += (HEADER_BYTES + payload.len()) as u64;
    }
    Ok(valid_len)
}

/// The first position after the start of `rest` (which begins with a damaged frame) where an
/// intact frame starts: length within bounds, whole frame inside `rest`, crc matching, and a
/// payload that is a JSON object with a `seq` above `last_seq`. Only `seq` is read, so a record
/// of a newer version counts too. Returns (offset in `rest`, seq).
pub fn later_valid_frame(rest: &[u8], last_seq: u64) -> Option<(usize, u64)> {
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    let mut at = 1;
    while at + HEADER_BYTES <= rest.len() {
        let mut header = [0u8; HEADER_BYTES];
        header.copy_from_slice(&rest[at..at + HEADER_BYTES]);
        let (len, crc) = frame_header(&header);
        let start = at + HEADER_BYTES;
        if len > 0 && len <= MAX_RECORD_BYTES && start + len as usize <= rest.len() {
            let payload = &rest[start..start + len as usize];
            if crc32fast::hash(payload) == crc {
                if let Ok(r) = serde_json::from_slice::<SeqOnly>(payload) {
                    if r.seq > last_seq {
                        return Some((at, r.seq));
                    }
                }
            }
        }
        at += 1;
    }
    None
}

struct Job {
    request: Request,
    reply: oneshot::Sender<Response>,
}

/// Cheap handle for submitting requests to the engine thread.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
}

impl EngineHandle {
    /// Queue a request; the returned receiver yields its response once it is durable.
    /// `None` means the engine thread is gone (only during shutdown).
    pub async fn submit(&self, request: Request) -> Option<oneshot::Receiver<Response>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Job { request, reply }).await.ok()?;
        Some(rx)
    }

    pub async fn call(&self, request: Request) -> Option<Response> {
        self.submit(request).await?.await.ok()
    }
}

/// A snapshot serialized by the engine thread, for the snapshot thread to write.
struct SnapshotJob {
    seq: u64,
    bytes: Vec<u8>,
    pause: std::time::Duration,
}

/// Start the single thread that owns `engine` and `wal`, with the journal reader and the
/// snapshot writer beside it. It exits when every handle is dropped.
pub fn spawn_committer(
    engine: Engine,
    wal: Wal,
    fail: FailPoints,
) -> io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
    let journal = journal::spawn_reader(wal.catalog.clone())?;
    let retain = Arc::new(AtomicU64::new(engine.retain_after()));
    let in_flight = Arc::new(AtomicBool::new(false));
    let (snap_tx, snap_rx) = std::sync::mpsc::channel::<SnapshotJob>();
    // Written snapshot buffers go back to the engine thread for reuse.
    let (spare_tx, spare_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let snapshot_thread = {
        let catalog = wal.catalog.clone();
        let retain = retain.clone();
        let in_flight = in_flight.clone();
        let dir = wal.dir.clone();
        std::thread::Builder::new()
            .name("spot-snapshot".into())
            .spawn(move || {
                while let Ok(job) = snap_rx.recv() {
                    let buffer = write_snapshot(&dir, &catalog, job, &retain, fail);
                    let _ = spare_tx.send(buffer);
                    in_flight.store(false, Ordering::Release);
                }
            })?
    };
    let thread = std::thread::Builder::new()
        .name("spot-engine".into())
        .spawn(move || {
            commit_loop(
                engine,
                wal,
                rx,
                Side {
                    journal,
                    snapshots: snap_tx,
                    spare: spare_rx,
                    snapshot_thread,
                    in_flight,
                    retain,
                },
                fail,
            )
        })?;
    Ok((EngineHandle { tx }, thread))
}

/// The engine thread's links to its helper threads.
struct Side {
    journal: std::sync::mpsc::Sender<JournalJob>,
    snapshots: std::sync::mpsc::Sender<SnapshotJob>,
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
    snapshot_thread: std::thread::JoinHandle<()>,
    in_flight: Arc<AtomicBool>,
    retain: Arc<AtomicU64>,
}

/// Aborts the process if the engine thread unwinds: memory may then be ahead of the log or
/// half-updated, and no later answer could be trusted.
struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("spot-core: engine thread panicked; aborting");
            std::process::abort();
        }
    }
}

/// The engine thread's buffers, reused from batch to batch, and its snapshot counters.
struct Batch {
    jobs: Vec<Job>,
    answers: Vec<(oneshot::Sender<Response>, Response)>,
    journals: Vec<JournalJob>,
    framed: Vec<u8>,
    /// A movement is in this batch (the `abort_after_wal_sync` fail point's condition).
    has_movement: bool,
    /// An answer carries a status to fill with the storage figures.
    wants_storage: bool,
    since_records: u64,
    since_bytes: u64,
}

fn commit_loop(
    mut engine: Engine,
    mut wal: Wal,
    mut rx: mpsc::Receiver<Job>,
    side: Side,
    fail: FailPoints,
) {
    let _guard = AbortOnPanic;
    let mut batch = Batch {
        jobs: Vec::with_capacity(MAX_BATCH),
        answers: Vec::with_capacity(MAX_BATCH),
        journals: Vec::new(),
        framed: Vec::with_capacity(1 << 16),
        has_movement: false,
        wants_storage: false,
        since_records: wal.since_snapshot_records,
        since_bytes: 0,
    };
    loop {
        if rx.blocking_recv_many(&mut batch.jobs, MAX_BATCH) == 0 {
            // Every handle is gone: let a snapshot being written finish (it holds no lock the
            // next opener needs, but a test reopening the directory must not race it).
            drop(side.snapshots);
            let _ = side.snapshot_thread.join();
            return;
        }
        decide(&mut engine, &mut batch);
        if !batch.framed.is_empty() {
            make_durable(&engine, &mut wal, &mut batch, &side, fail);
        }
        answer(&wal, &mut batch, &side);
        let due = (wal.options.snapshot_every_records > 0
            && batch.since_records >= wal.options.snapshot_every_records)
            || (wal.options.snapshot_every_bytes > 0
                && batch.since_bytes >= wal.options.snapshot_every_bytes);
        if due && !side.in_flight.load(Ordering::Acquire) {
            hand_snapshot(&engine, &wal, &side);
            batch.since_records = 0;
            batch.since_bytes = 0;
        }
    }
}

/// Apply the batch's requests in memory and frame their records; `journal` requests wait for
/// the sync.
fn decide(engine: &mut Engine, batch: &mut Batch) {
    batch.has_movement = false;
    batch.wants_storage = false;
    for job in batch.jobs.drain(..) {
        if let Request::Journal { after_seq, limit } = job.request {
            // Served by the reader thread once this batch is synced, up to what the engine
            // had decided when the request came (read-your-writes on a connection).
            batch.journals.push(JournalJob {
                after_seq,
                limit,
                upto: engine.last_seq(),
                reply: job.reply,
            });
            continue;
        }
        let effect = engine.apply(&job.request);
        if let Some(record) = &effect.record {
            batch.has_movement |= record.as_movement().is_some();
            encode_record(record, &mut batch.framed);
            batch.since_records += 1;
        }
        batch.wants_storage |= matches!(&effect.response, Response::Ok { core: Some(_), .. });
        batch.answers.push((job.reply, effect.response));
    }
}

/// Write and sync the batch's records (abort if that fails), then publish the conservation check's retained
/// position and start a new segment when the active one is full.
fn make_durable(engine: &Engine, wal: &mut Wal, batch: &mut Batch, side: &Side, fail: FailPoints) {
    if let Err(e) = wal.append(&batch.framed) {
        // Memory is now ahead of the disk; answering or continuing could acknowledge
        // something a restart would forget.
        tracing::error!(path = %wal.path().display(), error = %e, "WAL write or sync failed; aborting");
        eprintln!("spot-core: WAL write/sync failed: {e}; aborting");
        std::process::abort();
    }
    batch.since_bytes += batch.framed.len() as u64;
    batch.framed.clear();
    if fail.abort_after_wal_sync && batch.has_movement {
        eprintln!("spot-core: failpoint abort_after_wal_sync");
        std::process::abort();
    }
    side.retain.store(engine.retain_after(), Ordering::Release);
    if let Err(e) = wal.maybe_rotate(engine.last_seq() + 1) {
        // Not fatal: the active segment keeps taking records; retried next batch.
        tracing::error!(error = %format!("{e:#}"), "starting a new WAL segment failed");
    }
}

/// Send every answer of the synced batch, and hand its `journal` requests to the reader.
fn answer(wal: &Wal, batch: &mut Batch, side: &Side) {
    if batch.wants_storage {
        for (_, response) in batch.answers.iter_mut() {
            if let Response::Ok {
                core: Some(core), ..
            } = response
            {
                wal.fill_status(core);
            }
        }
    }
    for (reply, response) in batch.answers.drain(..) {
        // The asker may have hung up; the result is durable and visible through lookup.
        let _ = reply.send(response);
    }
    for job in batch.journals.drain(..) {
        if let Err(e) = side.journal.send(job) {
            // The reader is gone (it never exits while we run); answer rather than hang.
            let _ =
                e.0.reply
                    .send(Response::bad_request("journal reader stopped"));
        }
    }
}

/// Serialize a snapshot on this thread (the pause, bounded by what is live: accounts and
/// remembered keys, not history) and hand it to the snapshot thread.
fn hand_snapshot(engine: &Engine, wal: &Wal, side: &Side) {
    let started = Instant::now();
    let mut bytes = side.spare.try_recv().unwrap_or_default();
    snapshot::encode_into(
        engine,
        WalPosition {
            segment: wal.active_first,
            offset: wal.active_bytes,
        },
        &mut bytes,
    );
    let pause = started.elapsed();
    side.in_flight.store(true, Ordering::Release);
    let job = SnapshotJob {
        seq: engine.last_seq(),
        bytes,
        pause,
    };
    if side.snapshots.send(job).is_err() {
        side.in_flight.store(false, Ordering::Release);
    }
}

/// Write one snapshot, then compact; returns the buffer for reuse. Failures are logged, never
/// fatal: the WAL still holds everything the snapshot would have covered.
fn write_snapshot(
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::assets::Assets;
    use crate::protocol::{AccountStatus, MovementRequest};

    fn engine() -> Engine {
        Engine::new(Assets::builtin())
    }

    fn open(dir: &Path) -> anyhow::Result<(Engine, Wal, ReplayReport)> {
        super::open(Assets::builtin(), dir, &StorageOptions::default())
    }

    /// The first (and in these tests only) segment.
    fn seg(dir: &Path) -> PathBuf {
        dir.join(segment_name(1))
    }

    fn expect_report(records: u64, dropped_bytes: u64, valid_len: u64) -> ReplayReport {
        ReplayReport {
            snapshot_seq: 0,
            records,
            dropped_bytes,
            valid_len,
            damaged_snapshots: vec![],
            snapshot_ms: 0,
        }
    }

    /// A canonical ULID for a test label.
    fn id(label: &str) -> String {
        let h = label.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        crate::ulid::format(crate::ulid::from_parts(1_700_000_000_000, u128::from(h)))
    }

    fn mv(kind: &str, req_id: &str, user_id: u64, asset: &str, amount: &str) -> Request {
        let body = MovementRequest {
            req_id: id(req_id),
            user_id,
            asset: asset.into(),
            amount: amount.into(),
        };
        match kind {
            "w" => Request::Withdraw(body),
            "d" => Request::Deposit(body),
            _ => Request::Refund(body),
        }
    }

    /// Apply requests and persist their records, one append per request; returns the end
    /// offset of every record written.
    fn run(engine: &mut Engine, wal: &mut Wal, requests: &[Request]) -> Vec<u64> {
        run_records(engine, wal, requests).0
    }

    /// Like `run`, also returning the records written.
    fn run_records(
        engine: &mut Engine,
        wal: &mut Wal,
        requests: &[Request],
    ) -> (Vec<u64>, Vec<JournalRecord>) {
        let mut ends = Vec::new();
        let mut records = Vec::new();
        let mut offset = std::fs::metadata(wal.path()).unwrap().len();
        for req in requests {
            if let Some(rec) = engine.apply(req).record {
                let mut buf = Vec::new();
                encode_record(&rec, &mut buf);
                wal.append(&buf).unwrap();
                offset += buf.len() as u64;
                ends.push(offset);
                records.push(rec);
            }
        }
        (ends, records)
    }

    fn workload() -> Vec<Request> {
        vec![
            mv("d", "d1", 1, "USDT", "100"),
            mv("d", "d2", 2, "BTC", "0.5"),
            mv("w", "t1", 1, "USDT", "30.25"),
            mv("w", "t2", 1, "USDT", "1000"),
            mv("w", "t1", 1, "USDT", "30.25"),
            mv("r", "t1", 1, "USDT", "30.25"),
            Request::SetStatus {
                user_id: 2,
                asset: "BTC".into(),
                status: AccountStatus::Frozen,
            },
            mv("w", "t3", 2, "BTC", "0.1"),
            mv("d", "d3", 2, "BTC", "0.1"),
            mv("w", "t4", 1, "USDT", "0.00000001"),
        ]
    }

    /// Write the workload and return (engine, end offsets, state after all but the last record).
    fn written(dir: &Path) -> (Engine, Vec<u64>, Engine) {
        let (mut e, mut wal, report) = open(dir).unwrap();
        assert_eq!(report.records, 0);
        let reqs = workload();
        let (ends, records) = run_records(&mut e, &mut wal, &reqs);
        let mut before_last = engine();
        for rec in records.into_iter().take(ends.len() - 1) {
            before_last.apply_record(rec).unwrap();
        }
        (e, ends, before_last)
    }

    #[test]
    fn replay_rebuilds_identical_state() {
        let dir = tempfile::tempdir().unwrap();
        let (e, ends, _) = written(dir.path());
        assert_eq!(e.last_seq(), 9);
        let (replayed, _wal, report) = open(dir.path()).unwrap();
        let report = ReplayReport {
            snapshot_ms: 0,
            ..report
        };
        assert_eq!(report, expect_report(9, 0, *ends.last().unwrap()));
        assert_eq!(replayed, e);
    }

    #[test]
    fn a_second_process_cannot_open_the_same_log() {
        let dir = tempfile::tempdir().unwrap();
        let (_e, _wal, _) = open(dir.path()).unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("locked"), "{err:#}");
    }

    fn first_record(bytes: &[u8]) -> JournalRecord {
        let len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
        serde_json::from_slice(&bytes[HEADER_BYTES..HEADER_BYTES + len]).unwrap()
    }

    /// After damage to the last record: only it is dropped, the file is cut back to the end
    /// of the previous record, and new appends continue the sequence and survive a replay.
    fn check_tail_damage(dir: &Path, ends: &[u64], before_last: &Engine) {
        let prev_end = ends[ends.len() - 2];
        let (mut e, mut wal, report) = open(dir).unwrap();
        assert_eq!(report.records, ends.len() as u64 - 1);
        assert_eq!(report.valid_len, prev_end);
        assert_eq!(&e, before_last);
        assert_eq!(std::fs::metadata(seg(dir)).unwrap().len(), prev_end);
        let new = run(&mut e, &mut wal, &[mv("d", "after", 5, "ETH", "7")]);
        assert_eq!(e.last_seq(), ends.len() as u64);
        drop(wal);
        let (again, _wal, report) = open(dir).unwrap();
        assert_eq!(report.dropped_bytes, 0);
        assert_eq!(report.valid_len, new[0]);
        assert_eq!(again, e);
        assert_eq!(again.account(5, "ETH").map(|(b, _)| b), Some(7.into()));
    }

    #[test]
    fn truncation_anywhere_inside_the_last_record_drops_only_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, ends, before_last) = written(dir.path());
        let original = std::fs::read(seg(dir.path())).unwrap();
        let prev_end = ends[ends.len() - 2];
        for cut in prev_end..*ends.last().unwrap() {
            let case = tempfile::tempdir().unwrap();
            std::fs::write(seg(case.path()), &original[..cut as usize]).unwrap();
            let (_, _, report) = open(case.path()).unwrap();
            assert_eq!(report.dropped_bytes, cut - prev_end, "cut at {cut}");
            check_tail_damage(case.path(), &ends, &before_last);
        }
    }

    #[test]
    fn bit_flips_in_the_last_record_drop_only_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, ends, before_last) = written(dir.path());
        let original = std::fs::read(seg(dir.path())).unwrap();
        let prev_end = ends[ends.len() - 2] as usize;
        for byte in prev_end..original.len() {
            for bit in 0..8 {
                let case = tempfile::tempdir().unwrap();
                let mut damaged = original.clone();
                damaged[byte] ^= 1 << bit;
                std::fs::write(seg(case.path()), &damaged).unwrap();
                check_tail_damage(case.path(), &ends, &before_last);
            }
        }
    }

    #[test]
    fn garbage_and_absurd_lengths_after_the_last_record_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (e, ends, _) = written(dir.path());
        let original = std::fs::read(seg(dir.path())).unwrap();
        let tails: Vec<Vec<u8>> = vec![
            vec![0; 4096],            // preallocated zeros: length 0, parse fails
            vec![0xff; 3],            // short header
            vec![0xff; 64],           // absurd length
            b"not a record".to_vec(), // random text
        ];
        for tail in tails {
            let case = tempfile::tempdir().unwrap();
            let mut bytes = original.clone();
            bytes.extend_from_slice(&tail);
            std::fs::write(seg(case.path()), &bytes).unwrap();
            let (replayed, _, report) = open(case.path()).unwrap();
            assert_eq!(report.dropped_bytes, tail.len() as u64);
            assert_eq!(report.valid_len, *ends.last().unwrap());
            assert_eq!(replayed, e);
        }
    }

    #[test]
    fn a_well_formed_but_inconsistent_record_stops_startup_without_truncating() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path());
        let mut bytes = std::fs::read(seg(dir.path())).unwrap();
        // A valid frame whose seq does not follow.
        let mut rec = first_record(&bytes);
        if let JournalRecord::Deposit(m) = &mut rec {
            m.seq = 42;
        }
        encode_record(&rec, &mut bytes);
        std::fs::write(seg(dir.path()), &bytes).unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("seq 42"), "{err:#}");
        assert_eq!(std::fs::read(seg(dir.path())).unwrap(), bytes);
    }

    #[test]
    fn an_intact_but_unreadable_record_stops_startup_without_truncating() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path());
        let mut bytes = std::fs::read(seg(dir.path())).unwrap();
        let payload = br#"{"op":"snapshot","seq":10}"#;
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        std::fs::write(seg(dir.path()), &bytes).unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("cannot read"), "{err:#}");
        assert_eq!(std::fs::read(seg(dir.path())).unwrap(), bytes);
    }

    #[test]
    fn committer_answers_after_the_batch_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (e, wal, _) = open(dir.path()).unwrap();
        let (handle, thread) = spawn_committer(e, wal, FailPoints::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Submit many before awaiting any so they share batches.
            let mut pending = Vec::new();
            for i in 0..200 {
                pending.push(
                    handle
                        .submit(mv("d", &format!("d{i}"), 1, "USDT", "1"))
                        .await
                        .unwrap(),
                );
            }
            pending.push(
                handle
                    .submit(Request::Balances { user_id: 1 })
                    .await
                    .unwrap(),
            );
            let mut last = None;
            for rx in pending {
                last = Some(rx.await.unwrap());
            }
            let Some(Response::Ok {
                balances: Some(b), ..
            }) = last
            else {
                panic!("{last:?}")
            };
            assert_eq!(b[0].available, 200.into());
        });
        drop(handle);
        thread.join().unwrap();
        let (replayed, _, report) = open(dir.path()).unwrap();
        assert_eq!(report.records, 200);
        assert_eq!(
            replayed.account(1, "USDT").map(|(b, _)| b),
            Some(200.into())
        );
    }

    /// Damage to the frame of record `index` (0-based): flip one bit of its crc, of its
    /// payload, or zero the whole frame.
    fn damage(bytes: &mut [u8], ends: &[u64], index: usize, how: &str) {
        let start = if index == 0 {
            0
        } else {
            ends[index - 1] as usize
        };
        let end = ends[index] as usize;
        match how {
            "crc" => bytes[start + 5] ^= 0x10,
            "payload" => bytes[start + HEADER_BYTES + 3] ^= 0x01,
            "length" => bytes[start] ^= 0x04,
            _ => bytes[start..end].fill(0),
        }
    }

    #[test]
    fn damage_in_the_middle_stops_startup_without_truncating() {
        let dir = tempfile::tempdir().unwrap();
        let (_, ends, _) = written(dir.path());
        let original = std::fs::read(seg(dir.path())).unwrap();
        for index in [0, 3, ends.len() - 2] {
            for how in ["crc", "payload", "length", "zero"] {
                let case = tempfile::tempdir().unwrap();
                let mut bytes = original.clone();
                damage(&mut bytes, &ends, index, how);
                std::fs::write(seg(case.path()), &bytes).unwrap();
                let err = open(case.path()).unwrap_err();
                let text = format!("{err:#}");
                assert!(
                    text.contains("corruption in the middle")
                        && text.contains(&format!("seq {}", index + 2)),
                    "record {index} {how}: {text}"
                );
                assert_eq!(
                    std::fs::read(seg(case.path())).unwrap(),
                    bytes,
                    "record {index} {how}: the file must be left untouched"
                );
            }
        }
    }

    #[test]
    fn damage_to_the_last_record_is_still_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (_, ends, before_last) = written(dir.path());
        let original = std::fs::read(seg(dir.path())).unwrap();
        for how in ["crc", "payload", "length", "zero"] {
            let case = tempfile::tempdir().unwrap();
            let mut bytes = original.clone();
            damage(&mut bytes, &ends, ends.len() - 1, how);
            std::fs::write(seg(case.path()), &bytes).unwrap();
            check_tail_damage(case.path(), &ends, &before_last);
        }
    }

    #[test]
    fn a_stale_or_foreign_frame_after_the_damage_does_not_count() {
        // Only an intact frame carrying a later seq proves acknowledged records follow.
        let dir = tempfile::tempdir().unwrap();
        let (e, ends, _) = written(dir.path());
        let mut bytes = std::fs::read(seg(dir.path())).unwrap();
        bytes.extend_from_slice(&[0xff; 16]);
        let mut old = Vec::new();
        encode_record(&first_record(&bytes), &mut old);
        bytes.extend_from_slice(&old);
        let payload = br#"{"no_seq":true}"#;
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        std::fs::write(seg(dir.path()), &bytes).unwrap();
        let (replayed, _, report) = open(dir.path()).unwrap();
        assert_eq!(report.valid_len, *ends.last().unwrap());
        assert_eq!(replayed, e);
    }
}
