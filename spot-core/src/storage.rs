//! The bottom of spot-core's storage: what the WAL (`wal.rs`), the journal reader
//! (`journal.rs`) and snapshots (`snapshot.rs`) share, importing none of them: record framing,
//! file names, directory sync and creation, and the crash-test fail points.
//!
//! Record framing: `u32 LE payload length | u32 LE crc32(payload) | payload (JSON JournalRecord)`.
//! Segments: `<data-dir>/wal-<first seq, 20 digits>.seg`; snapshots name themselves the same way
//! (`snapshot.rs`) through `parse_seq_name`.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use anyhow::Context;

use crate::invariant;
use crate::protocol::JournalRecord;

/// Held with `flock` while a process uses the data directory.
pub const LOCK_FILE: &str = "LOCK";
/// A length above this cannot have been written by us, so it marks a damaged header.
pub const MAX_RECORD_BYTES: u32 = 1 << 20;
/// Bytes of a record's frame header (length and crc32).
pub const HEADER_BYTES: usize = 8;

/// Append one framed record to `out`.
pub fn encode_record(record: &JournalRecord, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    serde_json::to_writer(&mut *out, record).expect("serializing a record to memory cannot fail");
    let payload = &out[start + HEADER_BYTES..];
    // A frame the readers would refuse (`wal/scan.rs` takes it for a torn tail and cuts it at
    // start-up, `journal::read_frame` reports damage) must never be written: an acknowledged
    // movement would be lost at the next start.
    invariant!(
        !payload.is_empty() && payload.len() <= MAX_RECORD_BYTES as usize,
        "record seq {} frames {} bytes, readers take 1..={MAX_RECORD_BYTES}",
        record.seq(),
        payload.len()
    );
    let len = u32::try_from(payload.len()).expect("record fits u32");
    let crc = crc32fast::hash(payload);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// A frame header's (payload length, crc32 of the payload).
pub fn frame_header(header: &[u8; HEADER_BYTES]) -> (u32, u32) {
    let [l0, l1, l2, l3, c0, c1, c2, c3] = *header;
    (
        u32::from_le_bytes([l0, l1, l2, l3]),
        u32::from_le_bytes([c0, c1, c2, c3]),
    )
}

pub fn segment_name(first_seq: u64) -> String {
    format!("wal-{first_seq:020}.seg")
}

pub fn parse_segment_name(name: &str) -> Option<u64> {
    parse_seq_name(name, "wal-", ".seg")
}

/// The seq of a file named `<prefix><seq as 20 digits><suffix>` (segments and snapshots).
pub(crate) fn parse_seq_name(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The first seqs of every segment in `dir`, sorted; none when `dir` does not exist.
pub fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let name = entry?.file_name();
                if let Some(first) = name.to_str().and_then(parse_segment_name) {
                    out.push(first);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    out.sort_unstable();
    Ok(out)
}

pub(crate) fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

/// Create `dir` (and its parents); a new directory's entry is synced in its parent.
pub(crate) fn create_dir(dir: &Path) -> anyhow::Result<()> {
    let existed = dir.is_dir();
    std::fs::create_dir_all(dir).with_context(|| format!("creating dir {}", dir.display()))?;
    if !existed {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Like `read_exact`, but reports how much was read instead of failing at end of file.
pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Crash-test hooks, chosen once at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailPoints {
    /// Abort right after the first sync of a batch containing a movement, before answering.
    pub abort_after_wal_sync: bool,
    /// Abort with the snapshot's `.tmp` written and fsynced, before the rename.
    pub snapshot_before_rename: bool,
    /// Abort right after the rename, before the directory is fsynced.
    pub snapshot_before_dir_sync: bool,
    /// Abort with the snapshot renamed and the directory fsynced, before compaction.
    pub snapshot_after_rename: bool,
}

impl FailPoints {
    /// The environment variable the binary's arguments read them from.
    pub const ENV: &'static str = "SPOT_CORE_FAILPOINT";

    /// The hooks named in `value` (comma-separated); unknown names are ignored.
    pub fn parse(value: &str) -> FailPoints {
        let has = |name: &str| value.split(',').any(|v| v.trim() == name);
        FailPoints {
            abort_after_wal_sync: has("abort_after_wal_sync"),
            snapshot_before_rename: has("snapshot_before_rename"),
            snapshot_before_dir_sync: has("snapshot_before_dir_sync"),
            snapshot_after_rename: has("snapshot_after_rename"),
        }
    }

    /// Abort the process when `armed`.
    pub(crate) fn hit(&self, armed: bool, name: &str) {
        if armed {
            eprintln!("spot-core: failpoint {name}");
            std::process::abort();
        }
    }
}
