//! The real `spot-core` binary: token authentication, the loopback-only rule without a token,
//! `cancel` over the wire and across a restart, and refusal to start on mid-log corruption.

use std::path::Path;
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use rust_decimal::Decimal;
use spot_core::protocol::{
    ErrorCode, LookupOp, MovementOp, Outcome, RefusalCode, Request, Response,
};
use spot_core::{ClientError, SpotClient};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

// A canonical ULID standing for a test label, as req_id.
use spot_core::ulid::for_label as k;

const DEADLINE: Duration = Duration::from_secs(20);
const TOKEN: &str = "s3cret-token-for-tests";

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

fn command(dir: &Path, listen: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spot-core"));
    cmd.arg("--listen")
        .arg(listen)
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("SPOT_CORE_FAILPOINT")
        .env_remove(spot_core::TOKEN_ENV)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

struct Proc {
    _child: Child,
    addr: String,
    _stdout: Lines<BufReader<ChildStdout>>,
}

async fn start(dir: &Path, listen: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut child = command(dir, listen, args, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
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
        _child: child,
        addr,
        _stdout: lines,
    }
}

/// Run a spot-core that must refuse to start; returns its stderr.
async fn refused_start(dir: &Path, listen: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = timeout(
        DEADLINE,
        command(dir, listen, args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output(),
    )
    .await
    .expect("spot-core exits")
    .unwrap();
    assert!(!out.status.success(), "spot-core started");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening on"),
        "it must not have listened"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Send raw lines, then read answers until the server closes the connection.
async fn raw_session(addr: &str, lines: &str) -> Vec<serde_json::Value> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(lines.as_bytes()).await.unwrap();
    s.shutdown().await.unwrap();
    let mut all = String::new();
    timeout(DEADLINE, s.read_to_string(&mut all))
        .await
        .expect("the server closes the connection")
        .unwrap();
    all.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn unauthorized(v: &serde_json::Value) -> bool {
    v["status"] == "error" && v["code"] == "UNAUTHORIZED"
}

fn token_file(dir: &Path, text: &str) -> String {
    let path = dir.join("spot.token");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn with_a_token_only_a_matching_hello_opens_the_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let file = token_file(tmp.path(), &format!("{TOKEN}\n"));
    let p = start(
        &tmp.path().join("data"),
        "127.0.0.1:0",
        &["--token-file", &file],
        &[],
    )
    .await;

    // Anything but hello first: refused and closed, nothing behind it is executed.
    let deposit = r#"{"op":"deposit","req_id":"x","user_id":1,"asset":"USDT","amount":"5"}"#;
    let got = raw_session(&p.addr, &format!("{deposit}\n{{\"op\":\"ping\"}}\n")).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(unauthorized(&got[0]), "{got:?}");
    // A wrong token, a malformed line, a hello without token: same.
    for first in [
        r#"{"op":"hello","token":"wrong"}"#.to_string(),
        format!(r#"{{"op":"hello","token":"{TOKEN}x"}}"#),
        "not json".to_string(),
        r#"{"op":"hello"}"#.to_string(),
    ] {
        let got = raw_session(&p.addr, &format!("{first}\n{deposit}\n")).await;
        assert_eq!(got.len(), 1, "{first}: {got:?}");
        assert!(unauthorized(&got[0]), "{first}: {got:?}");
    }
    // The right token, pipelined with requests; a wrong hello later closes the connection.
    let got = raw_session(
        &p.addr,
        &format!(
            "\n{{\"op\":\"hello\",\"token\":\"{TOKEN}\"}}\n{{\"op\":\"ping\"}}\n{{\"op\":\"hello\",\"token\":\"{TOKEN}\"}}\n{{\"op\":\"hello\",\"token\":\"no\"}}\n{{\"op\":\"ping\"}}\n"
        ),
    )
    .await;
    assert_eq!(got.len(), 4, "{got:?}");
    for v in &got[..3] {
        assert_eq!(v["status"], "ok", "{got:?}");
    }
    assert!(unauthorized(&got[3]));

    // Nothing was deposited by the refused sessions.
    let good = SpotClient::with_token(p.addr.clone(), DEADLINE, Some(TOKEN.into()));
    let Response::Ok {
        balances: Some(b), ..
    } = good.call(&Request::Balances { user_id: 1 }).await.unwrap()
    else {
        panic!()
    };
    assert!(b.is_empty(), "{b:?}");
    // The client authenticates every new connection, including concurrent ones.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let c = good.clone();
        tasks.push(tokio::spawn(async move {
            c.call(&Request::deposit(k(format!("d{i}")), 1, "USDT", d("1")))
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        assert!(matches!(t.await.unwrap(), Response::Applied { .. }));
    }
    // With another token the client never gets to send its request: Connect.
    let c = SpotClient::with_token(p.addr.clone(), DEADLINE, Some("wrong".into()));
    let err = c.call(&Request::Ping {}).await.unwrap_err();
    assert!(matches!(err, ClientError::Connect(_)), "{err:?}");
    assert!(!err.outcome_unknown());
    // Without one, its request is answered UNAUTHORIZED and not executed.
    let c = SpotClient::new(p.addr.clone(), DEADLINE);
    let answer = c
        .call(&Request::deposit(k("never"), 1, "USDT", d("1")))
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            Response::Error {
                code: ErrorCode::Unauthorized,
                ..
            }
        ),
        "{answer:?}"
    );
    let Response::Ok {
        balances: Some(b), ..
    } = good.call(&Request::Balances { user_id: 1 }).await.unwrap()
    else {
        panic!()
    };
    assert_eq!(b[0].available, d("8"));
}

#[tokio::test]
async fn the_token_may_come_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let p = start(
        tmp.path(),
        "127.0.0.1:0",
        &[],
        &[(spot_core::TOKEN_ENV, TOKEN)],
    )
    .await;
    let got = raw_session(&p.addr, "{\"op\":\"ping\"}\n").await;
    assert!(unauthorized(&got[0]), "{got:?}");
    let c = SpotClient::with_token(p.addr.clone(), DEADLINE, Some(TOKEN.into()));
    assert_eq!(c.call(&Request::Ping {}).await.unwrap(), Response::ok());
}

#[tokio::test]
async fn without_a_token_only_loopback_is_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let err = refused_start(tmp.path(), listen, &[], &[]).await;
        assert!(err.contains("without a token"), "{listen}: {err}");
    }
    // An empty token is an error, not "no authentication".
    let empty = token_file(tmp.path(), " \n");
    let err = refused_start(tmp.path(), "0.0.0.0:0", &["--token-file", &empty], &[]).await;
    assert!(err.contains("empty"), "{err}");
    let err = refused_start(
        tmp.path(),
        "127.0.0.1:0",
        &[],
        &[(spot_core::TOKEN_ENV, "")],
    )
    .await;
    assert!(err.contains("empty"), "{err}");
    // With a token, any address; on loopback without one, the protocol stays open (and a
    // client that has a token may still say hello).
    let file = token_file(tmp.path(), TOKEN);
    let p = start(
        &tmp.path().join("a"),
        "0.0.0.0:0",
        &["--token-file", &file],
        &[],
    )
    .await;
    let port = p.addr.rsplit_once(':').unwrap().1;
    let c = SpotClient::with_token(format!("127.0.0.1:{port}"), DEADLINE, Some(TOKEN.into()));
    assert_eq!(c.call(&Request::Ping {}).await.unwrap(), Response::ok());
    let open = start(&tmp.path().join("b"), "127.0.0.1:0", &[], &[]).await;
    for token in [None, Some("anything".to_string())] {
        let c = SpotClient::with_token(open.addr.clone(), DEADLINE, token);
        assert_eq!(c.call(&Request::Ping {}).await.unwrap(), Response::ok());
    }
}

fn cancel(req_id: &str, movement: MovementOp, amount: &str) -> Request {
    Request::Cancel {
        req_id: k(req_id),
        movement,
        user_id: 7,
        asset: "USDT".into(),
        amount: amount.into(),
    }
}

fn one_op(r: Response) -> LookupOp {
    match r {
        Response::Ok {
            ops: Some(mut ops), ..
        } if ops.len() == 1 => ops.remove(0),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn cancel_is_durable_and_refuses_every_later_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let p = start(tmp.path(), "127.0.0.1:0", &[], &[]).await;
    // The documented wire shape.
    let got = raw_session(
        &p.addr,
        &format!(
            "{{\"op\":\"cancel\",\"req_id\":\"{}\",\"movement\":\"deposit\",\"user_id\":7,\"asset\":\"USDT\",\"amount\":\"10.50\"}}\n",
            k("t1")
        ),
    )
    .await;
    assert_eq!(
        got[0],
        serde_json::json!({"status":"ok","ops":[{"op":"deposit","user_id":7,"asset":"USDT",
            "amount":"10.5","outcome":"refused","code":"CANCELLED","seq":1}]})
    );
    let c = SpotClient::new(p.addr.clone(), DEADLINE);
    c.call(&Request::deposit(k("seed"), 7, "USDT", d("100")))
        .await
        .unwrap();
    let applied = one_op(
        c.call(&cancel("seed", MovementOp::Deposit, "100"))
            .await
            .unwrap(),
    );
    assert_eq!((applied.outcome, applied.seq), (Outcome::Applied, 2));
    drop(p);

    // After a SIGKILL and restart the cancellation still stands.
    let p = start(tmp.path(), "127.0.0.1:0", &[], &[]).await;
    let c = SpotClient::new(p.addr.clone(), DEADLINE);
    let late = c
        .call(&Request::deposit(k("t1"), 7, "USDT", d("10.5")))
        .await
        .unwrap();
    assert_eq!(
        late,
        Response::refused(RefusalCode::Cancelled, true, Some(1))
    );
    let again = one_op(
        c.call(&cancel("t1", MovementOp::Deposit, "10.5"))
            .await
            .unwrap(),
    );
    assert_eq!(
        (again.outcome, again.code),
        (Outcome::Refused, Some(RefusalCode::Cancelled))
    );
    let Response::Ok {
        balances: Some(b), ..
    } = c.call(&Request::Balances { user_id: 7 }).await.unwrap()
    else {
        panic!()
    };
    assert_eq!(b[0].available, d("100"));
}

#[tokio::test]
async fn corruption_in_the_middle_of_the_wal_stops_startup() {
    let tmp = tempfile::tempdir().unwrap();
    let p = start(tmp.path(), "127.0.0.1:0", &[], &[]).await;
    let c = SpotClient::new(p.addr.clone(), DEADLINE);
    for i in 0..5 {
        c.call(&Request::deposit(k(format!("d{i}")), 1, "USDT", d("1")))
            .await
            .unwrap();
    }
    drop(p);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let wal = tmp.path().join("wal-00000000000000000001.seg");
    let mut bytes = std::fs::read(&wal).unwrap();
    // Flip a byte inside the second record's payload.
    let first_len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
    bytes[8 + first_len + 8 + 10] ^= 0x20;
    std::fs::write(&wal, &bytes).unwrap();
    let err = refused_start(tmp.path(), "127.0.0.1:0", &[], &[]).await;
    assert!(err.contains("corruption in the middle"), "{err}");
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        bytes,
        "the WAL must be untouched"
    );
}

/// ADR 0017: an engine started as a cell (`SPOT_CORE_CELL_ID`) refuses a client that expects
/// another cell, with or without a token, and still serves clients that name no cell.
#[tokio::test]
async fn an_engine_of_another_cell_is_refused_at_hello() {
    let dir = tempfile::tempdir().unwrap();
    let with_token = start(
        dir.path(),
        "127.0.0.1:0",
        &[],
        &[(spot_core::TOKEN_ENV, TOKEN), (spot_core::CELL_ID_ENV, "1")],
    )
    .await;
    let client = |cell: Option<u16>, token: Option<&str>, addr: &str| {
        SpotClient::for_cell(
            addr.to_owned(),
            DEADLINE,
            token.map(str::to_owned),
            liveness::TcpLiveness::DEFAULT,
            cell,
        )
    };
    let own = client(Some(1), Some(TOKEN), &with_token.addr);
    assert!(matches!(
        own.call(&Request::Ping {}).await,
        Ok(Response::Ok { .. })
    ));
    let old = client(None, Some(TOKEN), &with_token.addr);
    assert!(matches!(
        old.call(&Request::Ping {}).await,
        Ok(Response::Ok { .. })
    ));
    let other = client(Some(2), Some(TOKEN), &with_token.addr);
    let err = other.call(&Request::Ping {}).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Connect(m) if m.contains("this spot-core is cell 1; the client expected cell 2")),
        "{err:?}"
    );

    // On loopback without a token the client still says hello, so the check still runs.
    let dir = tempfile::tempdir().unwrap();
    let open = start(dir.path(), "127.0.0.1:0", &["--cell-id", "3"], &[]).await;
    assert!(matches!(
        client(Some(3), None, &open.addr)
            .call(&Request::Ping {})
            .await,
        Ok(Response::Ok { .. })
    ));
    let err = client(Some(1), None, &open.addr)
        .call(&Request::Ping {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Connect(m) if m.contains("cell 3")),
        "{err:?}"
    );
}
