//! Faults injected for real into a running `spot-core` binary and its files: aborts at each
//! step of a snapshot write, a truncated / bit-flipped / deleted newest snapshot, a snapshot
//! beyond the WAL, gaps in the WAL, and the idempotency horizon repeated, reordered and
//! crossed by a retry, across restarts. Each is followed by a check of the exact outcome.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use rust_decimal::Decimal;
use spot_core::protocol::{
    CoreStatus, JournalRecord, LookupOp, MovementOp, Outcome, RefusalCode, Request, Response,
};
use spot_core::{ulid, SpotClient};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

const DEADLINE: Duration = Duration::from_secs(20);

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// Keys created an hour ago plus `n` ms: valid now, and ordered by `n`.
fn base_ms() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| ulid::now_ms() - 3_600_000)
}

fn key(n: u64) -> String {
    ulid::format(ulid::from_parts(base_ms() + n, u128::from(n) + 1))
}

struct Proc {
    child: Child,
    addr: String,
    stderr: PathBuf,
    _stdout: Lines<BufReader<ChildStdout>>,
}

fn command(dir: &Path, args: &[&str], failpoint: Option<&str>, stderr: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spot-core"));
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("SPOT_CORE_FAILPOINT")
        .env_remove("SPOT_CORE_SNAPSHOT_EVERY_RECORDS")
        .env_remove("SPOT_CORE_SNAPSHOT_EVERY_BYTES")
        .env_remove("SPOT_CORE_SEGMENT_BYTES")
        .env_remove("SPOT_CORE_ARCHIVE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr).unwrap())
        .kill_on_drop(true);
    if let Some(fp) = failpoint {
        cmd.env("SPOT_CORE_FAILPOINT", fp);
    }
    cmd
}

fn log_path(dir: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.parent()
        .unwrap()
        .join(format!("stderr-{}-{n}.log", std::process::id()))
}

impl Proc {
    async fn start(dir: &Path, args: &[&str], failpoint: Option<&str>) -> Proc {
        let stderr = log_path(dir);
        let mut child = command(dir, args, failpoint, &stderr)
            .spawn()
            .expect("spawn");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = timeout(DEADLINE, lines.next_line())
            .await
            .expect("spot-core announced its address in time")
            .unwrap()
            .unwrap_or_else(|| {
                panic!(
                    "spot-core did not start: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            });
        let addr = line
            .strip_prefix("spot-core listening on ")
            .unwrap()
            .to_string();
        Proc {
            child,
            addr,
            stderr,
            _stdout: lines,
        }
    }

    fn client(&self) -> SpotClient {
        SpotClient::new(self.addr.clone(), Duration::from_secs(10))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    async fn wait_exit(mut self) -> std::process::ExitStatus {
        timeout(DEADLINE, self.child.wait()).await.unwrap().unwrap()
    }
}

/// Start expecting a refusal; returns stderr.
async fn refused_start(dir: &Path, args: &[&str]) -> String {
    let stderr = log_path(dir);
    let status = timeout(DEADLINE, command(dir, args, None, &stderr).status())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success(), "spot-core must refuse to start");
    std::fs::read_to_string(&stderr).unwrap()
}

async fn call(c: &SpotClient, req: Request) -> Response {
    c.call(&req)
        .await
        .unwrap_or_else(|e| panic!("{req:?} failed: {e}"))
}

async fn status(c: &SpotClient) -> CoreStatus {
    match call(c, Request::Status {}).await {
        Response::Ok { core: Some(s), .. } => s,
        other => panic!("{other:?}"),
    }
}

async fn lookup(c: &SpotClient, req_id: &str) -> Response {
    call(
        c,
        Request::Lookup {
            req_id: req_id.into(),
        },
    )
    .await
}

fn ops(r: &Response) -> Vec<LookupOp> {
    match r {
        Response::Ok { ops: Some(o), .. } => o.clone(),
        other => panic!("expected ops, got {other:?}"),
    }
}

fn names(dir: &Path, prefix: &str, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix) && n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

fn deposit(i: u64) -> Request {
    Request::deposit(key(i), 1 + i % 5, "USDT", d("1.5"))
}

/// Everything a client can observe for the first `n` keys: balances, totals, lookups.
async fn observe(c: &SpotClient, n: u64) -> (Vec<Response>, Response, Vec<Response>) {
    let mut balances = Vec::new();
    for user in 1..=5 {
        balances.push(call(c, Request::Balances { user_id: user }).await);
    }
    let totals = call(c, Request::Totals {}).await;
    let mut lookups = Vec::new();
    for i in 0..n {
        lookups.push(lookup(c, &key(i)).await);
    }
    (balances, totals, lookups)
}

#[tokio::test]
async fn abort_at_each_step_of_a_snapshot_write_loses_and_doubles_nothing() {
    for fp in [
        "snapshot_before_rename",
        "snapshot_before_dir_sync",
        "snapshot_after_rename",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let args = ["--snapshot-every-records", "25", "--segment-bytes", "1024"];
        let p = Proc::start(&dir, &args, Some(fp)).await;
        let c = p.client();
        let mut acked = Vec::new();
        let mut attempted = 0;
        for i in 0..300 {
            attempted = i + 1;
            match c.call(&deposit(i)).await {
                Ok(r) => acked.push(r),
                Err(_) => break,
            }
        }
        assert!(acked.len() < 300, "{fp}: the fail point never fired");
        let log = p.log();
        assert!(log.contains(&format!("failpoint {fp}")), "{fp}: {log}");
        assert!(!p.wait_exit().await.success());
        let snap = "snapshot-00000000000000000025.snap";
        match fp {
            "snapshot_before_rename" => {
                assert_eq!(names(&dir, "snapshot-", ".snap"), Vec::<String>::new());
                assert_eq!(
                    names(&dir, "snapshot-", ".tmp"),
                    vec![format!("{snap}.tmp")]
                );
            }
            _ => assert_eq!(names(&dir, "snapshot-", ".snap"), vec![snap.to_string()]),
        }

        let p = Proc::start(&dir, &args, None).await;
        let c = p.client();
        let s = status(&c).await;
        let expected_snapshot = if fp == "snapshot_before_rename" {
            0
        } else {
            25
        };
        assert_eq!(s.snapshot_seq, expected_snapshot, "{fp}");
        // The 25 records replayed after the snapshot count towards the next one, which the
        // first batch after the restart starts in the background: wait for it to be written
        // before looking for a leftover of the aborted one.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut quiet = 0;
        while quiet < 5 && std::time::Instant::now() < deadline {
            status(&c).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            quiet = if names(&dir, "snapshot-", ".tmp").is_empty() {
                quiet + 1
            } else {
                0
            };
        }
        assert!(
            names(&dir, "snapshot-", ".tmp").is_empty(),
            "{fp}: leftover tmp removed"
        );
        // Every acknowledged deposit is there once, with its seq; a retry is a duplicate.
        for (i, answer) in acked.iter().enumerate() {
            let Response::Applied { balance, seq, .. } = answer else {
                panic!("{answer:?}")
            };
            let o = ops(&lookup(&c, &key(i as u64)).await);
            assert_eq!(o.len(), 1);
            assert_eq!((o[0].outcome, o[0].seq), (Outcome::Applied, *seq), "{fp}");
            assert_eq!(
                call(&c, deposit(i as u64)).await,
                Response::Applied {
                    balance: *balance,
                    duplicate: true,
                    seq: *seq
                },
                "{fp}"
            );
        }
        // The one in flight at the abort is applied or not, never twice: retry everything.
        for i in 0..attempted {
            assert!(matches!(
                call(&c, deposit(i)).await,
                Response::Applied { .. }
            ));
        }
        let total = match call(&c, Request::Totals {}).await {
            Response::Ok {
                totals: Some(t), ..
            } => t.into_iter().find(|t| t.asset == "USDT").unwrap().sum,
            other => panic!("{other:?}"),
        };
        assert_eq!(total, d("1.5") * Decimal::from(attempted), "{fp}");
        assert_eq!(
            status(&c).await.last_seq,
            attempted,
            "{fp}: nothing applied twice"
        );
        p.kill().await;
    }
}

/// What `prepared` left behind.
struct Prepared {
    /// What a client saw (balances, totals, lookups of every key).
    seen: (Vec<Response>, Response, Vec<Response>),
    /// Keys 0..keys were deposited.
    keys: u64,
    last_seq: u64,
    /// The two snapshots kept.
    older: u64,
    newer: u64,
}

fn snap_seqs(dir: &Path) -> Vec<u64> {
    names(dir, "snapshot-", ".snap")
        .iter()
        .map(|n| spot_core::snapshot::parse_name(n).unwrap())
        .collect()
}

/// A directory where at least three snapshots were taken (one every 20 records, so the oldest
/// was deleted and two are kept), the conservation check's retain at 45 so segments wholly before the older
/// kept snapshot were compacted away; killed.
async fn prepared(dir: &Path) -> Prepared {
    let p = Proc::start(dir, &ARGS, None).await;
    let c = p.client();
    for i in 0..45 {
        call(&c, deposit(i)).await;
    }
    assert!(matches!(
        call(&c, Request::Retain { after_seq: 45 }).await,
        Response::Ok { core: Some(_), .. }
    ));
    // Deposits go on until a third snapshot is durable and compaction has followed it (the
    // snapshots are written in the background, so their exact seqs depend on timing).
    let mut keys = 45;
    loop {
        call(&c, deposit(keys)).await;
        keys += 1;
        let seqs = snap_seqs(dir);
        if keys >= 69 && seqs.len() == 2 && seqs[1] >= 60 && status(&c).await.first_seq > 1 {
            break;
        }
        assert!(keys < 1000, "no third snapshot: {seqs:?}");
        if keys >= 69 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // A snapshot that came due while the previous one was being written is taken at the next
    // batch, even a read-only one: let the directory settle before looking at it.
    let mut seqs = snap_seqs(dir);
    let mut quiet = 0;
    while quiet < 3 {
        status(&c).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = snap_seqs(dir);
        quiet = if now == seqs && names(dir, "snapshot-", ".tmp").is_empty() {
            quiet + 1
        } else {
            0
        };
        seqs = now;
    }
    assert_eq!(seqs.len(), 2, "two snapshots kept: {seqs:?}");
    let (older, newer) = (seqs[0], seqs[1]);
    let s = status(&c).await;
    assert!(
        s.first_seq > 1 && s.first_seq <= older.min(45) + 1,
        "compacted up to the older snapshot: {s:?}"
    );
    let seen = observe(&c, keys).await;
    p.kill().await;
    Prepared {
        seen,
        keys,
        last_seq: s.last_seq,
        older,
        newer,
    }
}

const ARGS: [&str; 4] = ["--snapshot-every-records", "20", "--segment-bytes", "1024"];

#[tokio::test]
async fn a_damaged_or_missing_newest_snapshot_falls_back_to_the_previous_one() {
    for case in ["truncated", "flipped", "deleted"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let prep = prepared(&dir).await;
        let newest_name = spot_core::snapshot::file_name(prep.newer);
        let newest = dir.join(&newest_name);
        let mut bytes = std::fs::read(&newest).unwrap();
        match case {
            "truncated" => {
                bytes.truncate(bytes.len() - 7);
                std::fs::write(&newest, &bytes).unwrap();
            }
            "flipped" => {
                let at = bytes.len() / 2;
                bytes[at] ^= 0x04;
                std::fs::write(&newest, &bytes).unwrap();
            }
            _ => std::fs::remove_file(&newest).unwrap(),
        }
        let p = Proc::start(&dir, &ARGS, None).await;
        let c = p.client();
        let s = status(&c).await;
        assert_eq!(
            (s.snapshot_seq, s.last_seq),
            (prep.older, prep.last_seq),
            "{case}"
        );
        assert_eq!(
            observe(&c, prep.keys).await,
            prep.seen,
            "{case}: the same state"
        );
        if case != "deleted" {
            let log = p.log();
            assert!(
                log.contains(&newest_name) && log.contains("damaged"),
                "{case}: the warning names the file: {log}"
            );
            // The newest snapshot is at seq 60 or a little later (one that comes due while
            // the previous is written is taken at the next batch): name it by what it is.
            let kept = dir.join(format!("{newest_name}.damaged"));
            assert!(kept.exists(), "{case}: {} kept aside", kept.display());
        }
        // Duplicates are answered from what was rebuilt, and nothing is applied twice.
        for i in 0..prep.keys {
            let Response::Applied { duplicate, .. } = call(&c, deposit(i)).await else {
                panic!("{case}")
            };
            assert!(duplicate, "{case}");
        }
        assert_eq!(status(&c).await.last_seq, prep.last_seq, "{case}");
        p.kill().await;
    }
}

#[tokio::test]
async fn a_snapshot_beyond_the_wal_or_a_gap_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let prep = prepared(&a).await;
    let snap = spot_core::snapshot::file_name(prep.newer);
    let snap = snap.as_str();

    // Beyond: a directory whose WAL ends at seq 30 gets the newest snapshot (seq 60 or more).
    let b = tmp.path().join("b");
    let p = Proc::start(&b, &["--snapshot-every-records", "0"], None).await;
    let c = p.client();
    for i in 0..30 {
        call(&c, deposit(1000 + i)).await;
    }
    p.kill().await;
    std::fs::copy(a.join(snap), b.join(snap)).unwrap();
    let err = refused_start(&b, &ARGS).await;
    assert!(
        err.contains(snap)
            && err.contains(&format!("seq {}", prep.newer))
            && err.contains("behind the snapshot"),
        "{err}"
    );
    assert!(b.join(snap).exists(), "nothing is removed");

    // A gap between segments after the snapshot.
    let segs = names(&a, "wal-", ".seg");
    let first_of = |n: &str| n[4..24].parse::<u64>().unwrap();
    let holding_61 = segs
        .iter()
        .rposition(|n| first_of(n) <= prep.newer + 1)
        .unwrap();
    let g = tmp.path().join("g");
    copy_dir(&a, &g);
    std::fs::remove_file(g.join(&segs[holding_61])).unwrap();
    let err = refused_start(&g, &ARGS).await;
    assert!(err.contains("gap"), "{err}");

    // A gap between the snapshot and the first segment: every segment up to the one holding
    // the record after the snapshot is gone.
    let g2 = tmp.path().join("g2");
    copy_dir(&a, &g2);
    for n in &segs[..=holding_61] {
        std::fs::remove_file(g2.join(n)).unwrap();
    }
    let err = refused_start(&g2, &ARGS).await;
    assert!(
        err.contains("gap between snapshot")
            && err.contains(snap)
            && err.contains(&segs[holding_61 + 1]),
        "{err}"
    );

    // Segments that do not start at 1 and no usable snapshot.
    let g3 = tmp.path().join("g3");
    copy_dir(&a, &g3);
    for n in names(&g3, "snapshot-", ".snap") {
        std::fs::remove_file(g3.join(n)).unwrap();
    }
    let err = refused_start(&g3, &ARGS).await;
    assert!(
        err.contains("not at seq 1") && err.contains(&segs[0]),
        "{err}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[tokio::test]
async fn the_horizon_repeated_reordered_and_crossed_by_a_retry() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let p = Proc::start(&dir, &[], None).await;
    let c = p.client();
    let old = key(499);
    let edge = key(500);
    let h = base_ms() + 500;
    for k in [&old, &edge] {
        call(&c, Request::deposit(k.clone(), 1, "USDT", d("5"))).await;
    }
    assert_eq!(status(&c).await.remembered, 2);
    let advance = |before_ms| Request::AdvanceHorizon { before_ms };
    let Response::Ok { core: Some(s), .. } = call(&c, advance(h)).await else {
        panic!()
    };
    assert_eq!((s.horizon_ms, s.remembered, s.last_seq), (h, 1, 3));
    // Repeated, then an older one: nothing changes, nothing is recorded.
    for before in [h, h - 300, 0] {
        let Response::Ok { core: Some(s), .. } = call(&c, advance(before)).await else {
            panic!()
        };
        assert_eq!((s.horizon_ms, s.last_seq), (h, 3));
    }
    // Later than spot-core's clock: refused.
    assert!(matches!(
        call(&c, advance(ulid::now_ms() + 3_600_000)).await,
        Response::Error { .. }
    ));

    async fn check(c: &SpotClient, old: &str, edge: &str, h: u64) {
        let before = status(c).await;
        // Just older than the horizon: refused for good, not applied, not remembered.
        let retry = call(c, Request::deposit(old, 1, "USDT", d("5"))).await;
        assert_eq!(
            retry,
            Response::refused(RefusalCode::ReqIdExpired, false, None)
        );
        let cancel = call(
            c,
            Request::Cancel {
                req_id: old.into(),
                movement: MovementOp::Deposit,
                user_id: 1,
                asset: "USDT".into(),
                amount: "5".into(),
            },
        )
        .await;
        assert!(matches!(
            cancel,
            Response::Refused {
                code: RefusalCode::ReqIdExpired,
                ..
            }
        ));
        // lookup never says "not seen" for it.
        assert!(matches!(
            lookup(c, old).await,
            Response::Refused {
                code: RefusalCode::ReqIdExpired,
                ..
            }
        ));
        let after = status(c).await;
        assert_eq!(after, before, "nothing recorded, memory not grown");
        assert_eq!((after.horizon_ms, after.remembered), (h, 1));
        // At the horizon: still remembered, answered verbatim.
        assert_eq!(
            call(c, Request::deposit(edge, 1, "USDT", d("5"))).await,
            Response::Applied {
                balance: d("10"),
                duplicate: true,
                seq: 2
            }
        );
        let Response::Ok {
            balances: Some(b), ..
        } = call(c, Request::Balances { user_id: 1 }).await
        else {
            panic!()
        };
        assert_eq!(b[0].available, d("10"));
    }
    check(&c, &old, &edge, h).await;
    p.kill().await;

    // Across a restart the horizon is the same and an older one still changes nothing.
    let p = Proc::start(&dir, &[], None).await;
    let c = p.client();
    let Response::Ok { core: Some(s), .. } = call(&c, advance(h - 1)).await else {
        panic!()
    };
    assert_eq!((s.horizon_ms, s.last_seq), (h, 3));
    check(&c, &old, &edge, h).await;
    // The journal holds exactly one horizon record.
    let Response::Ok {
        records: Some(r), ..
    } = call(
        &c,
        Request::Journal {
            after_seq: 0,
            limit: 100,
        },
    )
    .await
    else {
        panic!()
    };
    assert_eq!(r.len(), 3);
    assert!(matches!(&r[2], JournalRecord::Horizon(x) if x.before_ms == h && x.seq == 3));
    p.kill().await;
}
