//! A partition's move between two real `spot-core` processes (ADR 0023 §4, `SPOT_MOVED`): its
//! balances and records go from one to the other through the client, each side survives a
//! SIGKILL and answers a retry of its move the same, a move is applied once however often it is
//! sent, and the totals across both engines stay exactly what they were.

use std::path::Path;
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use rust_decimal::Decimal;
use spot_core::partition::partition_of;
use spot_core::protocol::{MoveKind, Request, Response, TotalEntry};
use spot_core::ulid::for_label as k;
use spot_core::{ClientError, SpotClient};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

const DEADLINE: Duration = Duration::from_secs(20);
const P: u8 = 42;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

struct Proc {
    child: Child,
    addr: String,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    /// spot-core on `dir`, a snapshot every 10 records.
    async fn start(dir: &Path) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spot-core"))
            .args(["--listen", "127.0.0.1:0", "--snapshot-every-records", "10"])
            .arg("--data-dir")
            .arg(dir)
            .env("RUST_LOG", "warn")
            .env_remove("SPOT_CORE_FAILPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn spot-core");
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

    /// SIGKILL, and wait until the process is gone.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

async fn call(c: &SpotClient, req: Request) -> Response {
    c.call(&req)
        .await
        .unwrap_or_else(|e| panic!("{req:?} failed: {e}"))
}

async fn totals(c: &SpotClient) -> Vec<TotalEntry> {
    match call(c, Request::Totals {}).await {
        Response::Ok {
            totals: Some(t), ..
        } => t,
        other => panic!("{other:?}"),
    }
}

fn sum(t: &[TotalEntry], asset: &str) -> Decimal {
    t.iter()
        .find(|e| e.asset == asset)
        .map_or(Decimal::ZERO, |e| e.sum)
}

async fn last_seq_and_snapshot(c: &SpotClient) -> (u64, u64) {
    match call(c, Request::Status {}).await {
        Response::Ok {
            core: Some(core), ..
        } => (core.last_seq, core.snapshot_seq),
        other => panic!("{other:?}"),
    }
}

fn users(in_p: bool, n: usize) -> Vec<u64> {
    (1u64..)
        .filter(|u| (partition_of(*u) == P) == in_p)
        .take(n)
        .collect()
}

/// Deposits 100.5 USDT and 0.5 BTC to each of `users`, withdraws 0.5 USDT from each, and asks
/// one withdraw too many (a refusal, recorded): labels `<tag>-<user>-<n>`.
async fn trade(c: &SpotClient, tag: &str, users: &[u64]) {
    for u in users {
        let l = |n: u32| k(format!("{tag}-{u}-{n}"));
        for r in [
            Request::deposit(l(1), *u, "USDT", d("100.5")),
            Request::deposit(l(2), *u, "BTC", d("0.5")),
            Request::withdraw(l(3), *u, "USDT", d("0.5")),
            Request::withdraw(l(4), *u, "ETH", d("1")),
        ] {
            let answer = call(c, r).await;
            assert!(
                matches!(answer, Response::Applied { .. } | Response::Refused { .. }),
                "{answer:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_partition_moves_between_two_processes_once_through_kills_and_retries() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (
        Proc::start(dir_a.path()).await,
        Proc::start(dir_b.path()).await,
    );
    let (ca, cb) = (a.client(), b.client());
    let (ours, others) = (users(true, 4), users(false, 3));
    trade(&ca, "a", &ours).await;
    trade(&ca, "a", &others[..2]).await;
    trade(&cb, "b", &others[2..]).await;
    let (ta, tb) = (totals(&ca).await, totals(&cb).await);
    let before: Vec<(String, Decimal)> = ta
        .iter()
        .map(|t| (t.asset.clone(), t.sum + sum(&tb, &t.asset)))
        .collect();

    let out = ca.move_out("move-1", P).await.unwrap();
    assert_eq!(
        (out.kind, out.partition, out.accounts, out.records),
        (MoveKind::Out, P, 8, 16)
    );
    assert_eq!(sum(&out.totals, "USDT"), d("400"));
    // The source dies right after; from its WAL it answers the same move the same.
    a.kill().await;
    let a = Proc::start(dir_a.path()).await;
    let ca = a.client();
    assert_eq!(ca.move_out("move-1", P).await.unwrap(), out);
    assert_eq!(ca.move_lookup("move-1").await.unwrap(), Some(out.clone()));
    assert_eq!(ca.move_lookup("move-0").await.unwrap(), None);
    let refused = ca.move_out("move-2", P).await.unwrap_err();
    assert!(
        matches!(refused, ClientError::MoveRefused(_)),
        "{refused:?}"
    );
    // The moved users are answered MOVED (never a refusal), the others served.
    let moved = ca
        .call(&Request::deposit(k("late"), ours[0], "USDT", d("1")))
        .await
        .unwrap_err();
    assert!(
        matches!(&moved, ClientError::Moved(m) if m.contains("move-1")),
        "{moved:?}"
    );
    assert!(moved.outcome_unknown());
    let lookup = Request::Lookup {
        req_id: k(format!("a-{}-1", ours[0])),
    };
    assert!(matches!(ca.call(&lookup).await, Err(ClientError::Moved(_))));
    let other = call(&ca, Request::deposit(k("other"), others[0], "USDT", d("1"))).await;
    assert!(matches!(other, Response::Applied { .. }));

    // The target takes it once, however often it is sent, also across its own SIGKILL.
    let payload = out.payload.clone().unwrap();
    let first = cb.move_in("move-1", P, &payload).await.unwrap();
    assert_eq!(
        (first.kind, first.accounts, first.records),
        (MoveKind::In, 8, 16)
    );
    assert_eq!(first.totals, out.totals);
    let (seq_after, _) = last_seq_and_snapshot(&cb).await;
    assert_eq!(cb.move_in("move-1", P, &payload).await.unwrap(), first);
    b.kill().await;
    let b = Proc::start(dir_b.path()).await;
    let cb = b.client();
    assert_eq!(cb.move_in("move-1", P, &payload).await.unwrap(), first);
    assert_eq!(last_seq_and_snapshot(&cb).await.0, seq_after);
    assert_eq!(cb.move_lookup("move-1").await.unwrap(), Some(first));

    // Across both engines, every asset's total is exactly what it was (plus the one deposit).
    let (ta, tb) = (totals(&ca).await, totals(&cb).await);
    for (asset, total) in &before {
        let plus = if asset == "USDT" {
            d("1")
        } else {
            Decimal::ZERO
        };
        assert_eq!(sum(&ta, asset) + sum(&tb, asset), *total + plus, "{asset}");
    }
    // The target answers the moved users' earlier req_ids, and serves them.
    let dup = call(
        &cb,
        Request::deposit(k(format!("a-{}-1", ours[1])), ours[1], "USDT", d("100.5")),
    );
    assert!(matches!(
        dup.await,
        Response::Applied {
            duplicate: true,
            ..
        }
    ));
    let refund = call(
        &cb,
        Request::refund(k(format!("a-{}-3", ours[1])), ours[1], "USDT", d("0.5")),
    );
    assert!(
        matches!(refund.await, Response::Applied { balance, duplicate: false, .. } if balance == d("100.5"))
    );

    // The source's moved-out mark survives a start from a snapshot taken after the move.
    for n in 0..12 {
        call(
            &ca,
            Request::deposit(k(format!("fill-{n}")), others[1], "BTC", d("1")),
        )
        .await;
    }
    let (last, _) = last_seq_and_snapshot(&ca).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while last_seq_and_snapshot(&ca).await.1 <= out.seq {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no snapshot after seq {}",
            out.seq
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.kill().await;
    let a = Proc::start(dir_a.path()).await;
    let ca = a.client();
    assert_eq!(last_seq_and_snapshot(&ca).await.0, last);
    let moved = ca
        .call(&Request::deposit(k("later"), ours[2], "BTC", d("1")))
        .await;
    assert!(matches!(moved, Err(ClientError::Moved(_))), "{moved:?}");
    assert_eq!(ca.move_out("move-1", P).await.unwrap(), out);
    a.kill().await;
    b.kill().await;
}
