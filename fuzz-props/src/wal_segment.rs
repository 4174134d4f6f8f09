//! A WAL segment's bytes through start-up's scan (`wal::scan_frames`, the loop of
//! `scan_segment`), the `journal` reader's `journal::read_frame`, start-up's torn-tail test
//! `wal::later_valid_frame`, and the engine's replay. Properties: every record the scan yields
//! sits in a whole frame whose checksum holds and whose payload decodes to it, frames back to
//! back from byte 0 up to the reported valid length; the journal reader reads exactly the same
//! records and nothing after them; a segment cut anywhere yields exactly the records that end
//! before the cut (never a half record); a frame `later_valid_frame` reports is intact and
//! later; replaying the records never panics, and the state replayed survives a snapshot round
//! trip unchanged.
//!
//! Input: byte 0 the mode, bytes 1..3 a cut position. Mode 0: the rest is the segment. Mode 1:
//! the rest is payloads separated by newlines, framed with correct lengths and checksums (so
//! the fuzzer reaches the record decoder and the replay), then cut.

use std::io::Cursor;
use std::path::Path;

use spot_core::engine::Engine;
use spot_core::journal::read_frame;
use spot_core::protocol::JournalRecord;
use spot_core::snapshot::{self, WalPosition};
use spot_core::storage::{encode_record, HEADER_BYTES};
use spot_core::wal::{later_valid_frame, scan_frames};

use crate::assets::assets;

fn segment() -> &'static Path {
    Path::new("wal-00000000000000000001.seg")
}

pub fn check(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let cut = usize::from(u16::from_le_bytes([data[1], data[2]]));
    let rest = &data[3..];
    let bytes = if data[0] & 1 == 0 {
        rest.to_vec()
    } else {
        let mut out = Vec::new();
        for payload in rest.split(|b| *b == b'\n').filter(|p| !p.is_empty()) {
            frame(payload, &mut out);
        }
        out
    };
    let full = scan(&bytes);
    holds(&bytes, &full);
    let cut = cut % (bytes.len() + 1);
    let short = scan(&bytes[..cut]);
    holds(&bytes[..cut], &short);
    prefix_of(&full, &short, cut);
    replay(&full.records);
}

/// One frame as the WAL writes it: length, crc32, payload.
fn frame(payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// A record as the WAL frames it and start-up reads it back: must be the same record.
pub fn framed_back(record: &JournalRecord) -> JournalRecord {
    let mut bytes = Vec::new();
    encode_record(record, &mut bytes);
    let scanned = scan(&bytes);
    assert_eq!(scanned.valid_len, Some(bytes.len() as u64), "a whole frame");
    assert_eq!(scanned.records.as_slice(), std::slice::from_ref(record));
    scanned.records.into_iter().next().expect("one record")
}

struct Scanned {
    /// The records yielded, with the byte each frame ends at.
    records: Vec<JournalRecord>,
    /// `None` when the scan refused the segment (an intact record it cannot read).
    valid_len: Option<u64>,
}

fn scan(bytes: &[u8]) -> Scanned {
    let mut records = Vec::new();
    let result = scan_frames(Cursor::new(bytes), segment(), 0, |r| {
        records.push(r);
        Ok(())
    });
    Scanned {
        records,
        valid_len: result.ok(),
    }
}

/// Frame by frame from byte 0: each yielded record is a whole, checksummed frame decoding to
/// it; the journal reader agrees; past the valid length nothing more is read.
fn holds(bytes: &[u8], scanned: &Scanned) {
    let mut at = 0usize;
    let mut reader = Cursor::new(bytes);
    for record in &scanned.records {
        let header = &bytes[at..at + HEADER_BYTES];
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4")) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4"));
        let payload = &bytes[at + HEADER_BYTES..at + HEADER_BYTES + len];
        assert_eq!(
            crc32fast::hash(payload),
            crc,
            "checksum of the frame at {at}"
        );
        let decoded: JournalRecord = serde_json::from_slice(payload).expect("decodes");
        assert_eq!(&decoded, record);
        let read = read_frame(&mut reader).expect("the journal reads it");
        assert_eq!(read, Some((record.clone(), (HEADER_BYTES + len) as u64)));
        at += HEADER_BYTES + len;
    }
    if let Some(valid_len) = scanned.valid_len {
        assert_eq!(valid_len, at as u64, "valid length ends the last record");
        let last = scanned.records.last().map_or(0, JournalRecord::seq);
        if let Some((offset, seq)) = later_valid_frame(&bytes[at..], last) {
            assert!(offset >= 1 && seq > last, "{offset} {seq} after {last}");
        }
    }
    let after = read_frame(&mut reader);
    assert!(
        matches!(after, Ok(None) | Err(_)),
        "the journal reads past the scan's end at {at}: {after:?}"
    );
    if matches!(after, Ok(None)) {
        assert_eq!(at, bytes.len(), "the journal stops only at the end");
    }
}

/// The scan of a segment cut at `cut`: exactly the records whose frames end by then.
fn prefix_of(full: &Scanned, short: &Scanned, cut: usize) {
    assert!(short.records.len() <= full.records.len());
    assert_eq!(short.records[..], full.records[..short.records.len()]);
    if let (Some(full_len), Some(short_len)) = (full.valid_len, short.valid_len) {
        assert!(short_len <= cut as u64 && short_len <= full_len);
        if full_len <= cut as u64 {
            assert_eq!(
                short.records.len(),
                full.records.len(),
                "nothing lost before the cut"
            );
        }
    }
}

/// Replays the records as start-up does (stopping at the first it refuses); what was replayed
/// survives a snapshot round trip.
fn replay(records: &[JournalRecord]) {
    let mut engine = Engine::new(assets());
    for record in records {
        if engine.apply_record(record.clone()).is_err() {
            break;
        }
    }
    let pos = WalPosition {
        segment: 1,
        offset: 0,
    };
    let bytes = snapshot::encode(&engine, pos);
    let (back, back_pos) = snapshot::decode(&bytes, assets()).expect("its own snapshot decodes");
    assert_eq!(back, engine, "snapshot round trip of the replayed state");
    assert_eq!(back_pos, pos);
}
