//! The storage layer in-process: many snapshots, segment rotations and compactions, then a
//! restart that must rebuild exactly the state of an engine that never snapshotted; `journal`
//! from the segments (compacted without an archive, whole with one).

use std::path::{Path, PathBuf};

use spot_core::assets::Assets;
use spot_core::engine::Engine;
use spot_core::protocol::{
    AccountStatus, CoreStatus, ErrorCode, JournalRecord, MovementOp, Request, Response,
};
use spot_core::storage::FailPoints;
use spot_core::ulid;
use spot_core::wal::{self, StorageOptions};

const T0: u64 = 1_700_000_000_000;

fn key(i: u64) -> String {
    ulid::format(ulid::from_parts(T0 + i, u128::from(i) * 7919))
}

/// A deterministic mix: deposits, withdraws (some refused), refunds, duplicates, cancels,
/// status changes, and every 250 operations a horizon forgetting keys older than 200
/// operations and a retain of half the history.
fn workload(n: u64) -> Vec<Request> {
    let assets = ["USDT", "BTC", "ETH"];
    let mut out = Vec::new();
    let mut x = 12345u64;
    for i in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let user = 1 + (x >> 33) % 40;
        let asset = assets[((x >> 20) % 3) as usize];
        let amount = format!("{}.{}", (x >> 40) % 50 + 1, (x >> 10) % 100);
        let body = |req_id: String| spot_core::protocol::MovementRequest {
            req_id,
            user_id: user,
            asset: asset.into(),
            amount: amount.clone(),
            trace: None,
        };
        let r = match (x >> 50) % 10 {
            0..=3 => Request::Deposit(body(key(i))),
            4..=6 => Request::Withdraw(body(key(i))),
            // A refund of the withdraw some operations ago (often not matching: refused).
            7 => Request::Refund(body(key(i.saturating_sub(3)))),
            // A duplicate of a recent deposit (or a conflict, or expired).
            8 => Request::Deposit(body(key(i.saturating_sub(1 + (x >> 7) % 300)))),
            _ if i % 3 == 0 => Request::Cancel {
                req_id: key(i),
                movement: MovementOp::Deposit,
                user_id: user,
                asset: asset.into(),
                amount: amount.clone(),
            },
            _ => Request::SetStatus {
                user_id: user,
                asset: asset.into(),
                status: if i % 2 == 0 {
                    AccountStatus::Frozen
                } else {
                    AccountStatus::Active
                },
            },
        };
        out.push(r);
        if i % 250 == 249 {
            out.push(Request::AdvanceHorizon {
                before_ms: T0 + i - 200,
            });
            out.push(Request::Retain { after_seq: i / 2 });
            out.push(Request::Lookup {
                req_id: key(i - 230),
            });
            out.push(Request::Lookup {
                req_id: key(i - 10),
            });
        }
    }
    out
}

fn options(snapshot_every: u64, archive: Option<PathBuf>) -> StorageOptions {
    StorageOptions {
        snapshot_every_records: snapshot_every,
        snapshot_every_bytes: 0,
        segment_bytes: 4096,
        archive_dir: archive,
    }
}

/// The storage fields of a status differ between a snapshotting engine and the reference.
fn without_storage(mut r: Response) -> Response {
    if let Response::Ok { core: Some(c), .. } = &mut r {
        *c = CoreStatus {
            last_seq: c.last_seq,
            horizon_ms: c.horizon_ms,
            retain_after: c.retain_after,
            remembered: c.remembered,
            accounts: c.accounts,
            ..CoreStatus::default()
        };
    }
    r
}

/// Run `requests` through a real commit thread on `dir` in batches of 20; returns the answers.
fn run(dir: &Path, opts: &StorageOptions, requests: &[Request]) -> Vec<Response> {
    let (engine, w) = spot_core::open_engine_with(Assets::builtin(), dir, opts).unwrap();
    let (handle, thread) = wal::spawn_committer(engine, w, FailPoints::default()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answers = rt.block_on(async {
        let mut answers = Vec::new();
        for chunk in requests.chunks(20) {
            let mut pending = Vec::new();
            for r in chunk {
                pending.push(handle.submit(r.clone()).await.unwrap());
            }
            for p in pending {
                answers.push(p.await.unwrap());
            }
        }
        answers
    });
    drop(handle);
    thread.join().unwrap();
    answers
}

/// The same requests applied to an engine that never snapshots: (engine, answers, records).
fn reference(requests: &[Request]) -> (Engine, Vec<Response>, Vec<JournalRecord>) {
    let mut e = Engine::new(Assets::builtin());
    let mut answers = Vec::new();
    let mut records = Vec::new();
    for r in requests {
        let effect = e.apply(r);
        answers.push(effect.response);
        records.extend(effect.record);
    }
    (e, answers, records)
}

/// Ask one request of a fresh commit thread on `dir`.
fn ask(dir: &Path, opts: &StorageOptions, requests: Vec<Request>) -> Vec<Response> {
    run(dir, opts, &requests)
}

fn names(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

fn journal_all(
    dir: &Path,
    opts: &StorageOptions,
    after: u64,
) -> Result<Vec<JournalRecord>, Box<Response>> {
    let mut out = Vec::new();
    let mut after = after;
    loop {
        let got = ask(
            dir,
            opts,
            vec![Request::Journal {
                after_seq: after,
                limit: 777,
            }],
        )
        .remove(0);
        match got {
            Response::Ok {
                records: Some(r), ..
            } => {
                if r.is_empty() {
                    return Ok(out);
                }
                after = r.last().unwrap().seq();
                out.extend(r);
            }
            other => return Err(Box::new(other)),
        }
    }
}

#[test]
fn restart_after_many_snapshots_and_rotations_rebuilds_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let opts = options(50, None);
    let requests = workload(2000);
    let (want, want_answers, want_records) = reference(&requests);
    // Two runs with a restart in the middle, so the second starts from a snapshot.
    let (first, second) = requests.split_at(requests.len() / 2);
    let mut answers = run(&dir, &opts, first);
    answers.extend(run(&dir, &opts, second));
    let got: Vec<Response> = answers.into_iter().map(without_storage).collect();
    let expected: Vec<Response> = want_answers.into_iter().map(without_storage).collect();
    assert_eq!(got.len(), expected.len());
    for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, w, "answer {i} to {:?}", requests[i]);
    }
    assert!(want.remembered() < 1000, "the horizon keeps memory bounded");

    let (engine, _w) = spot_core::open_engine_with(Assets::builtin(), &dir, &opts).unwrap();
    assert_eq!(engine, want);
    drop(_w);

    // A snapshot that came due while the previous one was being written is taken at the next
    // batch, even a read-only one, and its compaction then removes segments: one `status` lets
    // it happen (the run joins the snapshot thread before it returns), so the directory listed
    // below is the one the next `status` describes. Listing first once raced that compaction.
    ask(&dir, &opts, vec![Request::Status {}]);
    let snaps = names(&dir, "snapshot-");
    assert_eq!(snaps.len(), 2, "two snapshots are kept: {snaps:?}");
    let segs = names(&dir, "wal-");
    let status = match ask(&dir, &opts, vec![Request::Status {}]).remove(0) {
        Response::Ok { core: Some(c), .. } => c,
        other => panic!("{other:?}"),
    };
    assert_eq!(status.wal_segments, segs.len() as u64);
    assert_eq!(status.remembered, want.remembered() as u64);
    assert_eq!(status.last_seq, want.last_seq());
    assert!(status.snapshot_seq > 0 && status.snapshot_bytes > 0);
    assert!(
        status.first_seq > 1,
        "compaction removed the oldest segments: {status:?}"
    );
    let on_disk: u64 = segs
        .iter()
        .map(|n| std::fs::metadata(dir.join(n)).unwrap().len())
        .sum();
    assert_eq!(status.wal_bytes, on_disk);

    // Without an archive, what was compacted is gone: journal says so, naming first_seq.
    match journal_all(&dir, &opts, 0).map_err(|e| *e) {
        Err(Response::Error { code, message }) => {
            assert_eq!(code, ErrorCode::JournalCompacted);
            assert!(message.contains(&status.first_seq.to_string()), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // From first_seq on, the journal is exactly the reference's records.
    let tail = journal_all(&dir, &opts, status.first_seq - 1).unwrap();
    assert_eq!(tail, want_records[(status.first_seq - 1) as usize..]);
}

#[test]
fn with_an_archive_the_journal_is_served_from_seq_1() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let archive = tmp.path().join("archive");
    let opts = options(40, Some(archive.clone()));
    let requests = workload(1200);
    let (want, _, want_records) = reference(&requests);
    run(&dir, &opts, &requests);
    assert!(
        !names(&archive, "wal-").is_empty(),
        "segments were archived"
    );
    assert!(names(&dir, "wal-").len() < names(&archive, "wal-").len() + names(&dir, "wal-").len());
    let all = journal_all(&dir, &opts, 0).unwrap();
    assert_eq!(all, want_records);
    // A page from the middle, served through the sparse index / cursor.
    let mid = journal_all(&dir, &opts, 333).unwrap();
    assert_eq!(mid, want_records[333..]);
    let (engine, _w) = spot_core::open_engine_with(Assets::builtin(), &dir, &opts).unwrap();
    assert_eq!(engine, want);
}

/// A spot-core that dies more often than every N records still takes snapshots: the records
/// replayed after the last snapshot count towards the next one, so the WAL to replay at start
/// stays bounded however often the process is restarted (found by the chaos run, which kills
/// spot-core every 60-90 records with snapshots every 300).
#[test]
fn records_replayed_at_start_count_towards_the_next_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(50, None);
    let requests = workload(400);
    // Eight lives of 30 requests each (each life alone is below the 50-record interval).
    for life in requests.chunks(30).take(8) {
        run(dir.path(), &opts, life);
    }
    let snapshots = names(dir.path(), "snapshot-");
    assert!(
        !snapshots.is_empty(),
        "no snapshot after 8 short lives of 30 requests with a 50-record interval"
    );
}
