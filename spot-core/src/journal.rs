//! The catalog of files on disk (WAL segments, live and archived, and durable snapshots) and
//! the `journal` reader that serves records from the segments, off the engine thread.
//!
//! The engine keeps no records in RAM. A `journal` request goes through the engine thread only
//! to learn the seq it may serve up to (the engine's last seq when the request was decided,
//! synced with its batch before the job is handed over), then a reader thread reads the
//! segments: live directory first, then the archive. A small sparse index per segment (one
//! entry every `INDEX_EVERY` records, built as segments are read) and a cursor remembering where
//! the previous call stopped keep each call proportional to what it returns, not to the
//! segment's size.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::protocol::{CoreStatus, ErrorCode, JournalRecord, Response, MAX_JOURNAL_LIMIT};
use crate::storage::{frame_header, read_full, segment_name, HEADER_BYTES, MAX_RECORD_BYTES};

/// One sparse index entry per this many records of a segment.
pub const INDEX_EVERY: u64 = 1024;

/// What is on disk, shared by the engine thread (rotation, sizes), the snapshot thread
/// (snapshots, compaction) and the journal reader.
#[derive(Debug)]
pub struct Catalog {
    pub dir: PathBuf,
    pub archive: Option<PathBuf>,
    /// Segments in the data directory, by first seq; the last one is being appended to.
    pub live: Vec<LiveSegment>,
    /// First seqs of the segments in the archive directory that are not also live, sorted.
    pub archived: Vec<u64>,
    /// Durable snapshots in the data directory: (seq, bytes), sorted by seq.
    pub snapshots: Vec<(u64, u64)>,
    /// Sparse index per segment first seq: (seq, byte offset of its frame), increasing.
    index: HashMap<u64, Vec<(u64, u64)>>,
    /// Where the previous journal call stopped: (next seq, segment first seq, offset).
    cursor: Option<(u64, u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveSegment {
    pub first_seq: u64,
    pub bytes: u64,
}

pub type SharedCatalog = Arc<Mutex<Catalog>>;

/// The catalog's lock; a panic while holding it cannot leave it half-updated in a way that
/// matters more than aborting would, and the engine aborts on panics anyway.
pub fn lock(c: &SharedCatalog) -> MutexGuard<'_, Catalog> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

impl Catalog {
    pub fn new(dir: PathBuf, archive: Option<PathBuf>) -> Catalog {
        Catalog {
            dir,
            archive,
            live: Vec::new(),
            archived: Vec::new(),
            snapshots: Vec::new(),
            index: HashMap::new(),
            cursor: None,
        }
    }

    /// The oldest seq `journal` can serve.
    pub fn first_seq(&self) -> u64 {
        self.archived
            .first()
            .or(self.live.first().map(|s| &s.first_seq))
            .copied()
            .unwrap_or(1)
    }

    /// Fill the storage fields of a status answer.
    pub fn fill(&self, core: &mut CoreStatus) {
        core.first_seq = self.first_seq();
        let (seq, bytes) = self.snapshots.last().copied().unwrap_or((0, 0));
        core.snapshot_seq = seq;
        core.snapshot_bytes = bytes;
        core.wal_bytes = self.live.iter().map(|s| s.bytes).sum();
        core.wal_segments = self.live.len() as u64;
    }

    /// Forget the index of a segment that left (deleted).
    pub fn drop_index(&mut self, first_seq: u64) {
        self.index.remove(&first_seq);
        if self.cursor.is_some_and(|(_, seg, _)| seg == first_seq) {
            self.cursor = None;
        }
    }

    /// All segments journal can read, by first seq, with their path: archived ones before the
    /// live ones.
    fn segments(&self) -> Vec<(u64, PathBuf)> {
        let live_first = self.live.first().map_or(u64::MAX, |s| s.first_seq);
        let mut out: Vec<(u64, PathBuf)> = Vec::new();
        if let Some(archive) = &self.archive {
            for &f in self.archived.iter().filter(|f| **f < live_first) {
                out.push((f, archive.join(segment_name(f))));
            }
        }
        for s in &self.live {
            out.push((s.first_seq, self.dir.join(segment_name(s.first_seq))));
        }
        out
    }
}

/// A `journal` request waiting for the reader thread.
pub struct JournalJob {
    pub after_seq: u64,
    pub limit: u32,
    /// The newest seq that is synced and may be served.
    pub upto: u64,
    pub reply: oneshot::Sender<Response>,
}

/// Start the reader thread; it ends when the sender is dropped.
pub fn spawn_reader(catalog: SharedCatalog) -> io::Result<std::sync::mpsc::Sender<JournalJob>> {
    let (tx, rx) = std::sync::mpsc::channel::<JournalJob>();
    std::thread::Builder::new()
        .name("spot-journal".into())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                let response = read_journal(&catalog, job.after_seq, job.limit, job.upto);
                let _ = job.reply.send(response);
            }
        })?;
    Ok(tx)
}

/// Records with `after_seq < seq <= upto`, at most `limit` (capped), from the segments.
pub fn read_journal(catalog: &SharedCatalog, after_seq: u64, limit: u32, upto: u64) -> Response {
    match read_records(
        catalog,
        after_seq,
        limit.min(MAX_JOURNAL_LIMIT) as usize,
        upto,
    ) {
        Ok(records) => Response::Ok {
            ops: None,
            balances: None,
            totals: None,
            records: Some(records),
            core: None,
            protocol: None,
            moves: None,
        },
        Err(ReadError::Compacted(first)) => Response::Error {
            code: ErrorCode::JournalCompacted,
            message: format!(
                "records up to seq {} were compacted; the oldest seq still served is {first} \
                 (configure --archive-dir to keep them)",
                first - 1
            ),
        },
        Err(ReadError::Io(e)) => {
            tracing::error!(error = %e, "journal read failed");
            Response::bad_request(format!("journal read failed: {e}"))
        }
    }
}

enum ReadError {
    Compacted(u64),
    Io(String),
}

fn read_records(
    catalog: &SharedCatalog,
    after_seq: u64,
    limit: usize,
    upto: u64,
) -> Result<Vec<JournalRecord>, ReadError> {
    let mut out = Vec::new();
    let mut want = after_seq.saturating_add(1);
    while out.len() < limit && want <= upto {
        let chosen = choose_segment(catalog, want)?;
        let seg_first = chosen.first_seq;
        let (offset, new_index) = read_segment(&chosen, &mut want, upto, limit, &mut out)?;
        {
            let mut c = lock(catalog);
            let ix = c.index.entry(seg_first).or_default();
            for e in new_index {
                if ix.last().is_none_or(|l| l.0 < e.0) {
                    ix.push(e);
                }
            }
            c.cursor = Some((want, seg_first, offset));
        }
        if out.len() >= limit || want > upto {
            break;
        }
        // This segment is exhausted: go on with the next one, if it starts where we are.
        match chosen.next_first {
            Some(n) if n == want => {}
            Some(n) => {
                return Err(ReadError::Io(format!(
                    "segment {} ends before seq {want} but the next starts at {n}",
                    segment_name(seg_first)
                )))
            }
            None => break,
        }
    }
    Ok(out)
}

/// The segment holding `want`, opened, and where to start reading it.
struct Chosen {
    first_seq: u64,
    file: File,
    /// (seq, byte offset) of a frame at or before `want`: the cursor, an index entry, or 0.
    start: (u64, u64),
    /// The next segment's first seq, if any.
    next_first: Option<u64>,
}

/// Choose the segment and open it under the lock, so compaction cannot remove it between the
/// choice and the open (an open file survives a later rename or unlink).
fn choose_segment(catalog: &SharedCatalog, want: u64) -> Result<Chosen, ReadError> {
    let c = lock(catalog);
    let first = c.first_seq();
    if want < first {
        return Err(ReadError::Compacted(first));
    }
    let segs = c.segments();
    let Some(i) = segs.iter().rposition(|(f, _)| *f <= want) else {
        return Err(ReadError::Compacted(first));
    };
    let (seg_first, path) = &segs[i];
    let file =
        File::open(path).map_err(|e| ReadError::Io(format!("opening {}: {e}", path.display())))?;
    let start = match c.cursor {
        Some((next, seg, off)) if next == want && seg == *seg_first => (want, off),
        _ => c
            .index
            .get(seg_first)
            .and_then(|ix| {
                let k = ix.partition_point(|(s, _)| *s <= want);
                k.checked_sub(1).map(|k| ix[k])
            })
            .unwrap_or((*seg_first, 0)),
    };
    Ok(Chosen {
        first_seq: *seg_first,
        file,
        start,
        next_first: segs.get(i + 1).map(|(f, _)| *f),
    })
}

/// Read the chosen segment's records from `want` on into `out`, up to `upto` and `limit`;
/// returns where reading stopped and the index entries passed on the way.
fn read_segment(
    chosen: &Chosen,
    want: &mut u64,
    upto: u64,
    limit: usize,
    out: &mut Vec<JournalRecord>,
) -> Result<(u64, Vec<(u64, u64)>), ReadError> {
    let seg_first = chosen.first_seq;
    let path_note = segment_name(seg_first);
    let mut reader = BufReader::with_capacity(64 * 1024, &chosen.file);
    reader
        .seek(SeekFrom::Start(chosen.start.1))
        .map_err(|e| ReadError::Io(format!("seeking {path_note}: {e}")))?;
    let mut offset = chosen.start.1;
    let mut new_index = Vec::new();
    while out.len() < limit && *want <= upto {
        let Some((record, len)) = read_frame(&mut reader)
            .map_err(|e| ReadError::Io(format!("reading {path_note} at byte {offset}: {e}")))?
        else {
            break;
        };
        let seq = record.seq();
        // A record before its segment's first seq is a damaged or misplaced file: its checksum
        // holds, but it cannot belong here.
        let Some(into) = seq.checked_sub(seg_first) else {
            return Err(ReadError::Io(format!(
                "{path_note}: seq {seq} at byte {offset} is before the segment's first seq"
            )));
        };
        if into.is_multiple_of(INDEX_EVERY) {
            new_index.push((seq, offset));
        }
        offset += len;
        if seq < *want {
            continue;
        }
        if seq != *want {
            return Err(ReadError::Io(format!(
                "{path_note}: expected seq {want} at byte {}, found {seq}",
                offset - len
            )));
        }
        out.push(record);
        *want += 1;
    }
    Ok((offset, new_index))
}

/// One frame, checked (length bound, crc, parse); `None` at the end of the segment. Public for
/// the fuzz targets, which hold it to the same records as start-up's scan.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(JournalRecord, u64)>> {
    let mut header = [0u8; HEADER_BYTES];
    let n = read_full(r, &mut header)?;
    if n == 0 {
        return Ok(None);
    }
    if n < HEADER_BYTES {
        return Err(io::Error::other("short frame header"));
    }
    let (len, crc) = frame_header(&header);
    if len == 0 || len > MAX_RECORD_BYTES {
        return Err(io::Error::other(format!("bad frame length {len}")));
    }
    let mut payload = vec![0u8; len as usize];
    if read_full(r, &mut payload)? < payload.len() {
        return Err(io::Error::other("short frame payload"));
    }
    if crc32fast::hash(&payload) != crc {
        return Err(io::Error::other("frame checksum mismatch"));
    }
    let record = serde_json::from_slice(&payload).map_err(io::Error::other)?;
    Ok(Some((record, (HEADER_BYTES + payload.len()) as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::HorizonRecord;
    use crate::storage::encode_record;

    /// A segment whose first frame's seq is below the segment's own first seq (a misnamed or
    /// misplaced file with valid checksums) is reported as damaged, never read (nor, in a build
    /// without overflow checks, indexed at a wrapped offset).
    #[test]
    fn cra_a_record_before_its_segments_first_seq_is_an_error_not_an_underflow() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        encode_record(
            &JournalRecord::Horizon(HorizonRecord {
                seq: 3,
                before_ms: 1,
            }),
            &mut bytes,
        );
        let path = dir.path().join(segment_name(10));
        std::fs::write(&path, &bytes).unwrap();
        let chosen = Chosen {
            first_seq: 10,
            file: File::open(&path).unwrap(),
            start: (10, 0),
            next_first: None,
        };
        let (mut want, mut out) = (10, Vec::new());
        match read_segment(&chosen, &mut want, 20, 10, &mut out) {
            Err(ReadError::Io(e)) => assert!(e.contains("before the segment's first seq"), "{e}"),
            Err(ReadError::Compacted(_)) => panic!("compacted"),
            Ok(_) => panic!("a record before the segment's first seq was read"),
        }
        assert!(out.is_empty());
    }
}
