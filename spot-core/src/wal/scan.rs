//! Reading a segment's frames at start-up: every intact record from a position, stopping at the
//! first bad frame, and the search for an intact later record that tells a torn tail from damage
//! in the middle of the log.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context};

use crate::protocol::JournalRecord;
use crate::storage::{frame_header, read_full, HEADER_BYTES, MAX_RECORD_BYTES};

/// What `scan_segment` read.
pub(super) struct Scan {
    /// End of the last intact record.
    pub(super) valid_len: u64,
}

/// Feed every intact record of one segment from `start` to `apply`, stopping at the first bad
/// frame (short header or payload, absurd length, bad crc, empty payload). An error from
/// `apply`, or a record with a valid checksum that does not parse, aborts.
pub(super) fn scan_segment(
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
