//! Start-up, torn-tail repair and group commit over real files in a temporary directory.

use std::path::{Path, PathBuf};

use super::*;
use crate::assets::Assets;
use crate::engine::Engine;
use crate::protocol::{AccountStatus, MovementRequest};
use crate::protocol::{JournalRecord, Request, Response};
use crate::storage::{encode_record, segment_name, FailPoints, HEADER_BYTES};

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
        trace: None,
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
