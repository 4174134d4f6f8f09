//! The write-ahead log: framing, replay with torn-tail repair, and the group-commit thread
//! that owns the engine and the file.
//!
//! Record framing: `u32 LE payload length | u32 LE crc32(payload) | payload (JSON JournalRecord)`.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tokio::sync::{mpsc, oneshot};

use crate::engine::Engine;
use crate::protocol::{JournalRecord, Request, Response};

pub const WAL_FILE: &str = "wal.log";
/// A length above this cannot have been written by us, so it marks a damaged header.
pub const MAX_RECORD_BYTES: u32 = 1 << 20;
const HEADER_BYTES: usize = 8;
/// Most requests folded into one write + sync.
pub const MAX_BATCH: usize = 4096;

/// Append one framed record to `out`.
pub fn encode_record(record: &JournalRecord, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    serde_json::to_writer(&mut *out, record).expect("serializing a record to memory cannot fail");
    let payload = &out[start + HEADER_BYTES..];
    let len = u32::try_from(payload.len()).expect("record fits u32");
    let crc = crc32fast::hash(payload);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// What `Wal::open` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    pub records: u64,
    /// Bytes of a torn or damaged tail that were cut off.
    pub dropped_bytes: u64,
    /// Length of the file after repair.
    pub valid_len: u64,
}

#[derive(Debug)]
pub struct Wal {
    file: File,
    path: PathBuf,
}

impl Wal {
    /// Open `<dir>/wal.log` (creating dir and file if missing), feed every intact record to
    /// `apply` in order, and cut off a torn tail (short header or payload, absurd length, bad
    /// crc, empty payload) when nothing intact follows it. An error from `apply`, a record with
    /// a valid checksum that does not parse, or a damaged frame followed by an intact record
    /// with a higher seq (corruption in the middle, not a torn write) aborts the open and
    /// leaves the file untouched: dropping such records could lose acknowledged money.
    pub fn open(
        dir: &Path,
        mut apply: impl FnMut(JournalRecord) -> anyhow::Result<()>,
    ) -> anyhow::Result<(Wal, ReplayReport)> {
        let dir_existed = dir.is_dir();
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating data dir {}", dir.display()))?;
        if !dir_existed {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
        }
        let path = dir.join(WAL_FILE);
        let file_existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // Two engines appending to one log would interleave records and double-spend.
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                bail!("{} is locked by another spot-core process", path.display())
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()))
            }
        }
        if !file_existed {
            // Make the new directory entry itself durable, not just the file's contents.
            sync_dir(dir)?;
        }

        let total_len = file.metadata()?.len();
        let mut reader = BufReader::with_capacity(1 << 20, &file);
        let mut valid_len = 0u64;
        let mut records = 0u64;
        let mut last_seq = 0u64;
        let mut payload = Vec::new();
        loop {
            let mut header = [0u8; HEADER_BYTES];
            if read_full(&mut reader, &mut header)? < HEADER_BYTES {
                break;
            }
            let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
            let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
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
            records += 1;
            last_seq = seq;
        }
        drop(reader);

        let dropped_bytes = total_len - valid_len;
        if dropped_bytes > 0 {
            // A torn write leaves nothing valid behind it. A damaged frame followed by an
            // intact later record is corruption of synced (acknowledged) data: cutting there
            // would silently forget everything after it, so stop and let an operator decide.
            let mut rest = vec![0u8; usize::try_from(dropped_bytes).context("WAL tail too large")?];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut rest, valid_len)
                .with_context(|| format!("reading {}", path.display()))?;
            if let Some((at, seq)) = later_valid_frame(&rest, last_seq) {
                bail!(
                    "{} is damaged at byte {valid_len} (after seq {last_seq}), but an intact record \
                     (seq {seq}) follows at byte {}: this is not a torn tail but corruption in the \
                     middle of the log; refusing to start and leaving the file untouched",
                    path.display(),
                    valid_len + at as u64
                );
            }
            tracing::warn!(
                path = %path.display(),
                dropped_bytes,
                valid_len,
                "WAL ends with a torn or damaged record; dropping it (it was never acknowledged)"
            );
            file.set_len(valid_len)
                .with_context(|| format!("truncating {}", path.display()))?;
            file.sync_all()
                .with_context(|| format!("syncing {}", path.display()))?;
        }
        Ok((
            Wal { file, path },
            ReplayReport {
                records,
                dropped_bytes,
                valid_len,
            },
        ))
    }

    /// Write already-framed records and make them durable.
    pub fn append(&mut self, framed: &[u8]) -> io::Result<()> {
        self.file.write_all(framed)?;
        self.file.sync_data()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The first position after the start of `rest` (which begins with a damaged frame) where an
/// intact frame starts: length within bounds, whole frame inside `rest`, crc matching, and a
/// payload that is a JSON object with a `seq` above `last_seq`. Only `seq` is read, so a record
/// of a newer version counts too. Returns (offset in `rest`, seq).
fn later_valid_frame(rest: &[u8], last_seq: u64) -> Option<(usize, u64)> {
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    let mut at = 1;
    while at + HEADER_BYTES <= rest.len() {
        let header = &rest[at..at + HEADER_BYTES];
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
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

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

/// Like `read_exact`, but reports how much was read instead of failing at end of file.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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
}

impl FailPoints {
    /// The environment variable the binary's arguments read them from.
    pub const ENV: &'static str = "SPOT_CORE_FAILPOINT";

    /// The hooks named in `value` (comma-separated); unknown names are ignored.
    pub fn parse(value: &str) -> FailPoints {
        FailPoints {
            abort_after_wal_sync: value.split(',').any(|v| v.trim() == "abort_after_wal_sync"),
        }
    }
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

/// Start the single thread that owns `engine` and `wal`. It exits when every handle is dropped.
pub fn spawn_committer(
    engine: Engine,
    wal: Wal,
    fail: FailPoints,
) -> io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
    let thread = std::thread::Builder::new()
        .name("spot-engine".into())
        .spawn(move || commit_loop(engine, wal, rx, fail))?;
    Ok((EngineHandle { tx }, thread))
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

fn commit_loop(mut engine: Engine, mut wal: Wal, mut rx: mpsc::Receiver<Job>, fail: FailPoints) {
    let _guard = AbortOnPanic;
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    let mut answers: Vec<(oneshot::Sender<Response>, Response)> = Vec::with_capacity(MAX_BATCH);
    let mut framed = Vec::with_capacity(1 << 16);
    loop {
        if rx.blocking_recv_many(&mut batch, MAX_BATCH) == 0 {
            return;
        }
        let mut has_movement = false;
        for job in batch.drain(..) {
            let effect = engine.apply(&job.request);
            if let Some(record) = &effect.record {
                has_movement |= record.as_movement().is_some();
                encode_record(record, &mut framed);
            }
            answers.push((job.reply, effect.response));
        }
        if !framed.is_empty() {
            if let Err(e) = wal.append(&framed) {
                // Memory is now ahead of the disk; answering or continuing could acknowledge
                // something a restart would forget.
                tracing::error!(path = %wal.path().display(), error = %e, "WAL write or sync failed; aborting");
                eprintln!("spot-core: WAL write/sync failed: {e}; aborting");
                std::process::abort();
            }
            framed.clear();
            if fail.abort_after_wal_sync && has_movement {
                eprintln!("spot-core: failpoint abort_after_wal_sync");
                std::process::abort();
            }
        }
        for (reply, response) in answers.drain(..) {
            // The asker may have hung up; the result is durable and visible through lookup.
            let _ = reply.send(response);
        }
    }
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
        let mut e = engine();
        let (wal, report) = Wal::open(dir, |r| Ok(e.apply_record(r)?))?;
        Ok((e, wal, report))
    }

    fn mv(kind: &str, req_id: &str, user_id: u64, asset: &str, amount: &str) -> Request {
        let body = MovementRequest {
            req_id: req_id.into(),
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
        let mut ends = Vec::new();
        let mut offset = std::fs::metadata(wal.path()).unwrap().len();
        for req in requests {
            if let Some(rec) = engine.apply(req).record {
                let mut buf = Vec::new();
                encode_record(&rec, &mut buf);
                wal.append(&buf).unwrap();
                offset += buf.len() as u64;
                ends.push(offset);
            }
        }
        ends
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
        let ends = run(&mut e, &mut wal, &reqs);
        let mut before_last = engine();
        for rec in e.journal(0, 1000).into_iter().take(ends.len() - 1) {
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
        assert_eq!(
            report,
            ReplayReport {
                records: 9,
                dropped_bytes: 0,
                valid_len: *ends.last().unwrap()
            }
        );
        assert_eq!(replayed, e);
    }

    #[test]
    fn a_second_process_cannot_open_the_same_log() {
        let dir = tempfile::tempdir().unwrap();
        let (_e, _wal, _) = open(dir.path()).unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("locked"), "{err:#}");
    }

    /// After damage to the last record: only it is dropped, the file is cut back to the end
    /// of the previous record, and new appends continue the sequence and survive a replay.
    fn check_tail_damage(dir: &Path, ends: &[u64], before_last: &Engine) {
        let prev_end = ends[ends.len() - 2];
        let (mut e, mut wal, report) = open(dir).unwrap();
        assert_eq!(report.records, ends.len() as u64 - 1);
        assert_eq!(report.valid_len, prev_end);
        assert_eq!(&e, before_last);
        assert_eq!(
            std::fs::metadata(dir.join(WAL_FILE)).unwrap().len(),
            prev_end
        );
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
        let original = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
        let prev_end = ends[ends.len() - 2];
        for cut in prev_end..*ends.last().unwrap() {
            let case = tempfile::tempdir().unwrap();
            std::fs::write(case.path().join(WAL_FILE), &original[..cut as usize]).unwrap();
            let (_, _, report) = open(case.path()).unwrap();
            assert_eq!(report.dropped_bytes, cut - prev_end, "cut at {cut}");
            check_tail_damage(case.path(), &ends, &before_last);
        }
    }

    #[test]
    fn bit_flips_in_the_last_record_drop_only_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, ends, before_last) = written(dir.path());
        let original = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
        let prev_end = ends[ends.len() - 2] as usize;
        for byte in prev_end..original.len() {
            for bit in 0..8 {
                let case = tempfile::tempdir().unwrap();
                let mut damaged = original.clone();
                damaged[byte] ^= 1 << bit;
                std::fs::write(case.path().join(WAL_FILE), &damaged).unwrap();
                check_tail_damage(case.path(), &ends, &before_last);
            }
        }
    }

    #[test]
    fn garbage_and_absurd_lengths_after_the_last_record_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (e, ends, _) = written(dir.path());
        let original = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
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
            std::fs::write(case.path().join(WAL_FILE), &bytes).unwrap();
            let (replayed, _, report) = open(case.path()).unwrap();
            assert_eq!(report.dropped_bytes, tail.len() as u64);
            assert_eq!(report.valid_len, *ends.last().unwrap());
            assert_eq!(replayed, e);
        }
    }

    #[test]
    fn a_well_formed_but_inconsistent_record_stops_startup_without_truncating() {
        let dir = tempfile::tempdir().unwrap();
        let (e, _, _) = written(dir.path());
        let mut bytes = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
        // A valid frame whose seq does not follow.
        let mut rec = e.journal(0, 1).remove(0);
        if let JournalRecord::Deposit(m) = &mut rec {
            m.seq = 42;
        }
        encode_record(&rec, &mut bytes);
        std::fs::write(dir.path().join(WAL_FILE), &bytes).unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("seq 42"), "{err:#}");
        assert_eq!(std::fs::read(dir.path().join(WAL_FILE)).unwrap(), bytes);
    }

    #[test]
    fn an_intact_but_unreadable_record_stops_startup_without_truncating() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path());
        let mut bytes = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
        let payload = br#"{"op":"snapshot","seq":10}"#;
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        std::fs::write(dir.path().join(WAL_FILE), &bytes).unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("cannot read"), "{err:#}");
        assert_eq!(std::fs::read(dir.path().join(WAL_FILE)).unwrap(), bytes);
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
        let original = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
        for index in [0, 3, ends.len() - 2] {
            for how in ["crc", "payload", "length", "zero"] {
                let case = tempfile::tempdir().unwrap();
                let mut bytes = original.clone();
                damage(&mut bytes, &ends, index, how);
                std::fs::write(case.path().join(WAL_FILE), &bytes).unwrap();
                let err = open(case.path()).unwrap_err();
                let text = format!("{err:#}");
                assert!(
                    text.contains("corruption in the middle")
                        && text.contains(&format!("seq {}", index + 2)),
                    "record {index} {how}: {text}"
                );
                assert_eq!(
                    std::fs::read(case.path().join(WAL_FILE)).unwrap(),
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
        let original = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
        for how in ["crc", "payload", "length", "zero"] {
            let case = tempfile::tempdir().unwrap();
            let mut bytes = original.clone();
            damage(&mut bytes, &ends, ends.len() - 1, how);
            std::fs::write(case.path().join(WAL_FILE), &bytes).unwrap();
            check_tail_damage(case.path(), &ends, &before_last);
        }
    }

    #[test]
    fn a_stale_or_foreign_frame_after_the_damage_does_not_count() {
        // Only an intact frame carrying a later seq proves acknowledged records follow.
        let dir = tempfile::tempdir().unwrap();
        let (e, ends, _) = written(dir.path());
        let mut bytes = std::fs::read(dir.path().join(WAL_FILE)).unwrap();
        bytes.extend_from_slice(&[0xff; 16]);
        let mut old = Vec::new();
        encode_record(&e.journal(0, 1).remove(0), &mut old);
        bytes.extend_from_slice(&old);
        let payload = br#"{"no_seq":true}"#;
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        std::fs::write(dir.path().join(WAL_FILE), &bytes).unwrap();
        let (replayed, _, report) = open(dir.path()).unwrap();
        assert_eq!(report.valid_len, *ends.last().unwrap());
        assert_eq!(replayed, e);
    }
}
