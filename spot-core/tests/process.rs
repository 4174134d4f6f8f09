//! End-to-end tests of the real `spot-core` binary: crash (SIGKILL / abort) and restart on
//! the same data dir, idempotency across restarts, torn-tail repair, raw protocol behaviour.

use std::path::Path;
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use rust_decimal::Decimal;
use spot_core::protocol::{
    AccountStatus, BalanceEntry, JournalRecord, MovementOp, Outcome, RefusalCode, Request,
    Response, TotalEntry,
};
use spot_core::{ClientError, SpotClient};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

// A canonical ULID standing for a test label, as req_id.
use spot_core::ulid::for_label as k;

const DEADLINE: Duration = Duration::from_secs(20);

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

struct Proc {
    child: Child,
    addr: String,
    // Kept open so a later write to stdout cannot fail with EPIPE.
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    async fn start(dir: &Path, failpoint: Option<&str>) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_spot-core"));
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(dir)
            .env("RUST_LOG", "warn")
            .env_remove("SPOT_CORE_FAILPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(fp) = failpoint {
            cmd.env("SPOT_CORE_FAILPOINT", fp);
        }
        let mut child = cmd.spawn().expect("spawn spot-core");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = timeout(DEADLINE, lines.next_line())
            .await
            .expect("spot-core announced its address in time")
            .unwrap()
            .expect("spot-core printed a line");
        let addr = line
            .strip_prefix("spot-core listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Proc {
            child,
            addr,
            _stdout: lines,
        }
    }

    fn client(&self) -> SpotClient {
        SpotClient::new(self.addr.clone(), Duration::from_secs(10))
    }

    /// SIGKILL and wait until the process is gone (so the WAL lock is released).
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    async fn wait_exit(mut self) -> std::process::ExitStatus {
        timeout(DEADLINE, self.child.wait())
            .await
            .expect("process exits")
            .unwrap()
    }
}

async fn call(c: &SpotClient, req: Request) -> Response {
    c.call(&req)
        .await
        .unwrap_or_else(|e| panic!("{req:?} failed: {e}"))
}

fn applied(resp: &Response) -> (Decimal, bool, u64) {
    match resp {
        Response::Applied {
            balance,
            duplicate,
            seq,
        } => (*balance, *duplicate, *seq),
        other => panic!("expected applied, got {other:?}"),
    }
}

async fn balances(c: &SpotClient, user_id: u64) -> Vec<BalanceEntry> {
    match call(c, Request::Balances { user_id }).await {
        Response::Ok {
            balances: Some(b), ..
        } => b,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn state_and_idempotency_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), None).await;
    let c = p.client();
    assert_eq!(call(&c, Request::Ping {}).await, Response::ok());
    assert_eq!(
        applied(&call(&c, Request::deposit(k("dep-1"), 7, "USDT", d("100"))).await),
        (d("100"), false, 1)
    );
    assert_eq!(
        applied(&call(&c, Request::withdraw(k("tr-1"), 7, "USDT", d("30.5"))).await),
        (d("69.5"), false, 2)
    );
    let refused = call(&c, Request::withdraw(k("tr-2"), 7, "USDT", d("1000"))).await;
    assert_eq!(
        refused,
        Response::refused(RefusalCode::InsufficientBalance, false, Some(3))
    );
    assert_eq!(
        call(
            &c,
            Request::SetStatus {
                user_id: 7,
                asset: "BTC".into(),
                status: AccountStatus::Frozen
            }
        )
        .await,
        Response::ok()
    );
    p.kill().await;

    let p = Proc::start(dir.path(), None).await;
    let c = p.client();
    assert_eq!(
        balances(&c, 7).await,
        vec![
            BalanceEntry {
                asset: "BTC".into(),
                available: Decimal::ZERO,
                status: AccountStatus::Frozen
            },
            BalanceEntry {
                asset: "USDT".into(),
                available: d("69.5"),
                status: AccountStatus::Active
            },
        ]
    );
    // Duplicates return the first result and change nothing.
    assert_eq!(
        applied(&call(&c, Request::deposit(k("dep-1"), 7, "USDT", d("100"))).await),
        (d("100"), true, 1)
    );
    assert_eq!(
        applied(&call(&c, Request::withdraw(k("tr-1"), 7, "USDT", d("30.5"))).await),
        (d("69.5"), true, 2)
    );
    assert_eq!(
        call(&c, Request::withdraw(k("tr-2"), 7, "USDT", d("1000"))).await,
        Response::refused(RefusalCode::InsufficientBalance, true, Some(3))
    );
    assert_eq!(
        call(&c, Request::withdraw(k("tr-1"), 7, "USDT", d("1"))).await,
        Response::refused(RefusalCode::ReqIdConflict, false, None)
    );
    // Seq numbering continues after the replayed records.
    assert_eq!(
        applied(&call(&c, Request::refund(k("tr-1"), 7, "USDT", d("30.5"))).await),
        (d("100"), false, 5)
    );
    let Response::Ok { ops: Some(ops), .. } = call(&c, Request::Lookup { req_id: k("tr-1") }).await
    else {
        panic!()
    };
    assert_eq!(
        ops.iter()
            .map(|o| (o.op, o.outcome, o.seq))
            .collect::<Vec<_>>(),
        vec![
            (MovementOp::Withdraw, Outcome::Applied, 2),
            (MovementOp::Refund, Outcome::Applied, 5),
        ]
    );
    let Response::Ok {
        totals: Some(totals),
        ..
    } = call(&c, Request::Totals {}).await
    else {
        panic!()
    };
    assert!(totals.contains(&TotalEntry {
        asset: "USDT".into(),
        sum: d("100")
    }));
    let Response::Ok {
        records: Some(records),
        ..
    } = call(
        &c,
        Request::Journal {
            after_seq: 3,
            limit: 10,
        },
    )
    .await
    else {
        panic!()
    };
    assert_eq!(
        records.iter().map(JournalRecord::seq).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert!(
        matches!(&records[0], JournalRecord::SetStatus(s) if s.status == AccountStatus::Frozen)
    );
    p.kill().await;
}

#[tokio::test]
async fn crash_after_sync_before_ack_is_durable_and_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), Some("abort_after_wal_sync")).await;
    let c = p.client();
    // Reads do not trip the fail point.
    assert_eq!(call(&c, Request::Ping {}).await, Response::ok());
    let err = c
        .call(&Request::deposit(k("crash-1"), 9, "BTC", d("2")))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Io(_)), "{err:?}");
    assert!(err.outcome_unknown());
    let status = p.wait_exit().await;
    assert!(!status.success(), "{status:?}");

    let p = Proc::start(dir.path(), None).await;
    let c = p.client();
    let Response::Ok { ops: Some(ops), .. } = call(
        &c,
        Request::Lookup {
            req_id: k("crash-1"),
        },
    )
    .await
    else {
        panic!()
    };
    assert_eq!(ops.len(), 1);
    assert_eq!(
        (ops[0].op, ops[0].outcome, ops[0].amount),
        (MovementOp::Deposit, Outcome::Applied, d("2"))
    );
    // The coordinator's retry gets the durable first result instead of a second credit.
    assert_eq!(
        applied(&call(&c, Request::deposit(k("crash-1"), 9, "BTC", d("2"))).await),
        (d("2"), true, 1)
    );
    assert_eq!(balances(&c, 9).await[0].available, d("2"));
    p.kill().await;
}

#[tokio::test]
async fn torn_tail_left_by_a_crash_is_dropped_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), None).await;
    let c = p.client();
    call(&c, Request::deposit(k("a"), 1, "ETH", d("5"))).await;
    call(&c, Request::withdraw(k("b"), 1, "ETH", d("1"))).await;
    p.kill().await;
    let wal = dir.path().join("wal-00000000000000000001.seg");
    let good_len = std::fs::metadata(&wal).unwrap().len();
    // Half of a record header and payload, as a crash mid-write would leave.
    let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
    std::io::Write::write_all(&mut f, &[60, 0, 0, 0, 1, 2, 3, 4, b'{', b'"']).unwrap();
    drop(f);

    let p = Proc::start(dir.path(), None).await;
    let c = p.client();
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), good_len);
    assert_eq!(balances(&c, 1).await[0].available, d("4"));
    assert_eq!(
        applied(&call(&c, Request::deposit(k("c"), 1, "ETH", d("1"))).await),
        (d("5"), false, 3)
    );
    p.kill().await;
}

/// Read `n` response lines from a raw connection.
async fn read_responses(r: &mut BufReader<TcpStream>, n: usize) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut line = String::new();
        timeout(DEADLINE, r.read_line(&mut line))
            .await
            .unwrap()
            .unwrap();
        out.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}")));
    }
    out
}

#[tokio::test]
async fn raw_protocol_pipelining_and_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), None).await;
    let mut conn = BufReader::new(TcpStream::connect(&p.addr).await.unwrap());
    let batch = concat!(
        "this is not json\n",
        "{\"op\":\"ping\"}\n",
        "\n",
        "{\"op\":\"explode\"}\n",
        "{\"op\":\"deposit\",\"req_id\":\"01HF7YAT0000000000000000R1\",\"user_id\":7,\"asset\":\"USDT\",\"amount\":\"10.5\"}\n",
        "{\"op\":\"deposit\",\"req_id\":\"01HF7YAT0000000000000000R2\",\"user_id\":7,\"asset\":\"USDT\",\"amount\":\"1\",\"extra\":true}\n",
        "{\"op\":\"withdraw\",\"req_id\":\"01HF7YAT0000000000000000R3\",\"user_id\":7,\"asset\":\"USDT\",\"amount\":\"1e1\"}\n",
        "{\"op\":\"withdraw\",\"req_id\":\"01HF7YAT0000000000000000R4\",\"user_id\":7,\"asset\":\"USDT\",\"amount\":\"0.5\"}\r\n",
        "{\"op\":\"balances\",\"user_id\":7}\n",
        "{\"op\":\"lookup\",\"req_id\":\"01HF7YAT0000000000000000R1\"}\n",
    );
    conn.get_mut().write_all(batch.as_bytes()).await.unwrap();
    let got = read_responses(&mut conn, 9).await;
    let expected: Vec<serde_json::Value> = [
        r#"{"status":"error","code":"BAD_REQUEST"}"#,
        r#"{"status":"ok"}"#,
        r#"{"status":"error","code":"BAD_REQUEST"}"#,
        r#"{"status":"applied","balance":"10.5","duplicate":false,"seq":1}"#,
        r#"{"status":"error","code":"BAD_REQUEST"}"#,
        r#"{"status":"refused","code":"INVALID_AMOUNT","duplicate":false}"#,
        r#"{"status":"applied","balance":"10","duplicate":false,"seq":2}"#,
        r#"{"status":"ok","balances":[{"asset":"USDT","available":"10","status":"ACTIVE"}]}"#,
        r#"{"status":"ok","ops":[{"op":"deposit","user_id":7,"asset":"USDT","amount":"10.5","outcome":"applied","code":null,"seq":1}]}"#,
    ]
    .iter()
    .map(|s| serde_json::from_str(s).unwrap())
    .collect();
    for (got, want) in got.iter().zip(&expected) {
        // Compare the fields we pin down; messages are free text.
        let mut got = got.clone();
        got.as_object_mut().unwrap().remove("message");
        assert_eq!(&got, want);
    }

    // An oversized line gets one error and the connection is closed.
    let mut big = vec![b'x'; 70 * 1024];
    big.push(b'\n');
    conn.get_mut().write_all(&big).await.unwrap();
    let mut rest = String::new();
    let _ = timeout(DEADLINE, conn.read_to_string(&mut rest))
        .await
        .expect("connection closed");
    assert!(rest.is_empty() || rest.contains("BAD_REQUEST"), "{rest:?}");

    // The server itself is fine.
    assert_eq!(call(&p.client(), Request::Ping {}).await, Response::ok());
    p.kill().await;
}

#[tokio::test]
async fn concurrent_clients_never_create_or_lose_money() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), None).await;
    let c = p.client();
    call(&c, Request::deposit(k("seed"), 1, "USDT", d("1000"))).await;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut applied = 0u32;
            for i in 0..50 {
                // Every request is sent twice; only one may count.
                let req = Request::withdraw(k(format!("w-{t}-{i}")), 1, "USDT", d("1.5"));
                let (first, second) = tokio::join!(c.call(&req), c.call(&req));
                let (first, second) = (first.unwrap(), second.unwrap());
                if let (Response::Applied { seq: a, .. }, Response::Applied { seq: b, .. }) =
                    (&first, &second)
                {
                    assert_eq!(a, b);
                    applied += 1;
                } else {
                    assert!(
                        matches!(
                            first,
                            Response::Refused {
                                code: RefusalCode::InsufficientBalance,
                                ..
                            }
                        ),
                        "{first:?}"
                    );
                }
            }
            applied
        }));
    }
    let mut total_applied = 0u32;
    for t in tasks {
        total_applied += t.await.unwrap();
    }
    // 1000 / 1.5 = 666 withdrawals fit; 800 were attempted.
    assert_eq!(total_applied, 666);
    let expected = d("1000") - Decimal::from(total_applied) * d("1.5");
    assert_eq!(balances(&c, 1).await[0].available, expected);
    p.kill().await;

    let p = Proc::start(dir.path(), None).await;
    let Response::Ok {
        totals: Some(totals),
        ..
    } = call(&p.client(), Request::Totals {}).await
    else {
        panic!()
    };
    assert!(totals.contains(&TotalEntry {
        asset: "USDT".into(),
        sum: expected
    }));
    p.kill().await;
}
