//! Cells (ADR 0017, issue 34): the admin routes that name neither a user in a token nor a
//! req_id, and GraphQL's websocket, with real parts (three databases, three spot-cores, one
//! `ledger serve` under the map, as `cells.rs` starts them). An account's status is set in its
//! user's cell; a halted cell is cleared through the API by naming it (and a clear that names
//! none is refused, naming the halted cell); the check history merges every cell and a run's
//! report is its cell's; a user's subscription runs in the user's cell and an admin's sees every
//! cell; each cell's bulkhead is the `LEDGER_CELL_IN_FLIGHT_MAX` setting. Money is exact in every
//! cell wherever it moves.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::cells::{call, deposit, transfer, usdt, ThreeCells};
use crate::helpers::token;
use crate::procs::LedgerProcess;

/// No periodic check during a test: the history holds only the checks the test asks for.
const NO_PERIODIC_CHECK: [(&str, &str); 1] = [("LEDGER_INVARIANT_INTERVAL_SECS", "3600")];

fn admin() -> String {
    token(1, true)
}

/// `POST /api/v1/admin/invariant/clear` with `query` (`""` or `?cell=N`).
async fn clear(base: &str, query: &str) -> (u16, Value) {
    let path = format!("/api/v1/admin/invariant/clear{query}");
    call(base, Method::POST, &path, &admin(), None).await
}

async fn set_status(base: &str, user: u64, account: &str, status: &str) -> (u16, Value) {
    call(
        base,
        Method::PUT,
        &format!("/api/v1/admin/accounts/{user}/{account}/status"),
        &admin(),
        Some(json!({"status": status, "asset": "USDT"})),
    )
    .await
}

/// The status `cell_pool`'s database keeps for the user's USDT FUNDING account, if it has one.
async fn funding_status(cell_pool: &sqlx::PgPool, user: u64) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM funding_accounts WHERE user_id = $1 AND asset = 'USDT'")
        .bind(i64::try_from(user).unwrap())
        .fetch_optional(cell_pool)
        .await
        .unwrap()
}

fn committed(status: u16, body: &Value) {
    assert_eq!(
        (status, body["state"].clone()),
        (200, json!("COMMITTED")),
        "{body}"
    );
}

/// `PUT /api/v1/admin/accounts/{user_id}/{account_type}/status` goes to the user's cell: a
/// cell-2 user's frozen FUNDING account refuses its transfer there (ACCOUNT_FROZEN), nothing is
/// written in the other cells, cell 1 goes on committing, and once unfrozen it commits.
#[tokio::test]
async fn cells_admin_001_an_accounts_status_is_set_in_its_users_cell() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    for &user in &users {
        deposit(base, user, "100").await;
    }

    let (status, body) = set_status(base, users[1], "FUNDING", "FROZEN").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        funding_status(&three.cells[1].db.pool, users[1])
            .await
            .as_deref(),
        Some("FROZEN")
    );
    for other in [0, 2] {
        assert_eq!(
            funding_status(&three.cells[other].db.pool, users[1]).await,
            None,
            "cell {}: no account of a cell-2 user",
            other + 1
        );
    }
    let (status, refused) = transfer(base, users[1], "FUNDING", "SPOT", "10").await;
    assert_eq!(
        (status, refused["code"].clone(), refused["state"].clone()),
        (422, json!("ACCOUNT_FROZEN"), json!("FAILED")),
        "{refused}"
    );
    let (status, body) = transfer(base, users[0], "FUNDING", "SPOT", "10").await;
    committed(status, &body);

    let (status, body) = set_status(base, users[1], "FUNDING", "ACTIVE").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = transfer(base, users[1], "FUNDING", "SPOT", "10").await;
    committed(status, &body);

    assert_eq!(usdt(base, users[0]).await, ("90".into(), "10".into()));
    assert_eq!(usdt(base, users[1]).await, ("90".into(), "10".into()));
    assert_eq!(usdt(base, users[2]).await, ("100".into(), "0".into()));
    three.assert_every_cell_exact().await;
}

/// A mismatch planted in cell 2 halts cell 2 only; once its cause is repaired, the halt is
/// cleared through the API by naming the cell. A clear that names no cell is refused, naming
/// the halted one; a cell the map does not have is 404.
#[tokio::test]
async fn cells_admin_002_a_halted_cell_is_cleared_through_the_api_by_naming_it() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &NO_PERIODIC_CHECK);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    for &user in &users {
        deposit(base, user, "100").await;
    }
    // Money appears in cell 2's FUNDING with no journal row: a real violation there.
    let plant = |delta: i32| {
        sqlx::query("UPDATE funding_accounts SET balance = balance + $2 WHERE user_id = $1")
            .bind(i64::try_from(users[1]).unwrap())
            .bind(rust_decimal::Decimal::from(delta))
            .execute(&three.cells[1].db.pool)
    };
    plant(1).await.unwrap();
    let (status, report) = call(base, Method::GET, "/api/v1/admin/invariant", &admin(), None).await;
    assert_eq!(status, 200, "{report}");
    let halted: Vec<Value> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["halted"].clone())
        .collect();
    assert_eq!(
        halted,
        [json!(false), json!(true), json!(false)],
        "{report}"
    );

    let (status, refused) = transfer(base, users[1], "FUNDING", "SPOT", "10").await;
    assert_eq!(
        (status, refused["code"].clone()),
        (503, json!("SERVICE_HALTED")),
        "{refused}"
    );
    for user in [users[0], users[2]] {
        let (status, body) = transfer(base, user, "FUNDING", "SPOT", "10").await;
        committed(status, &body);
    }

    // The cause is repaired; the halt stays until an admin clears it, naming the cell.
    plant(-1).await.unwrap();
    let (status, refused) = clear(base, "").await;
    assert_eq!(
        (
            status,
            refused["code"].clone(),
            refused["halted_cells"].clone()
        ),
        (400, json!("BAD_REQUEST"), json!([2])),
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("halted: cell 2"),
        "{refused}"
    );
    let (status, refused) = clear(base, "?cell=9").await;
    assert_eq!((status, refused["code"].clone()), (404, json!("NOT_FOUND")));
    let (status, refused) = clear(base, "?cell=two").await;
    assert_eq!(
        (status, refused["code"].clone()),
        (400, json!("BAD_REQUEST"))
    );
    let (status, still) = transfer(base, users[1], "FUNDING", "SPOT", "10").await;
    assert_eq!(
        (status, still["code"].clone()),
        (503, json!("SERVICE_HALTED"))
    );

    let (status, cleared) = clear(base, "?cell=2").await;
    assert_eq!((status, cleared), (200, json!({"halted": false})));
    let (status, body) = transfer(base, users[1], "FUNDING", "SPOT", "10").await;
    committed(status, &body);
    let (status, report) = call(base, Method::GET, "/api/v1/admin/invariant", &admin(), None).await;
    assert_eq!(
        (status, report["ok"].clone(), report["halted"].clone()),
        (200, json!(true), json!(false)),
        "{report}"
    );
    for &user in &users {
        assert_eq!(usdt(base, user).await, ("90".into(), "10".into()));
    }
    three.assert_every_cell_exact().await;
}

/// The check history merges every cell, newest first, each check naming its cell; a run's id
/// is its cell's own, so its report is asked with `?cell=N` (400 without, 404 for a cell the
/// map does not have), and the same id in two cells is two different reports.
#[tokio::test]
async fn cells_admin_003_the_check_history_merges_every_cell_and_a_run_names_its_cell() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &NO_PERIODIC_CHECK);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    // Each cell holds a different sum, so each cell's report says whose it is.
    for (i, &user) in users.iter().enumerate() {
        deposit(base, user, &format!("{}", 100 * (i + 1))).await;
    }
    for _ in 0..2 {
        let (status, report) =
            call(base, Method::GET, "/api/v1/admin/invariant", &admin(), None).await;
        assert_eq!(
            (status, report["ok"].clone()),
            (200, json!(true)),
            "{report}"
        );
    }

    let (status, history) = call(
        base,
        Method::GET,
        "/api/v1/admin/invariant/history?limit=100",
        &admin(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{history}");
    assert_eq!(
        (history["partial"].clone(), history["down_cells"].clone()),
        (json!(false), json!([])),
        "{history}"
    );
    let checks = history["checks"].as_array().unwrap();
    let mut merged: BTreeSet<(u16, i64)> = BTreeSet::new();
    for check in checks {
        let cell = u16::try_from(check["cell"].as_u64().unwrap()).unwrap();
        let id = check["id"].as_i64().unwrap();
        assert!(merged.insert((cell, id)), "{check} twice");
        assert_eq!(
            check["report"],
            format!("/api/v1/admin/invariant/runs/{id}?cell={cell}"),
            "{check}"
        );
    }
    let mut stored: BTreeSet<(u16, i64)> = BTreeSet::new();
    for cell in &three.cells {
        let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM invariant_runs")
            .fetch_all(&cell.db.pool)
            .await
            .unwrap();
        assert!(ids.len() >= 2, "cell {}: {ids:?}", cell.id);
        stored.extend(ids.into_iter().map(|id| (cell.id, id)));
    }
    assert_eq!(merged, stored, "every cell's checks, once each");
    let times: Vec<&str> = checks.iter().map(|c| c["at"].as_str().unwrap()).collect();
    let mut newest_first = times.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(times, newest_first, "newest first across cells");

    // Each cell's report of the same id is its own: its deposits are that cell's.
    let id = checks[0]["id"].as_i64().unwrap();
    for (cell, want) in [(1, "100"), (2, "200"), (3, "300")] {
        if !merged.contains(&(cell, id)) {
            continue;
        }
        let (status, report) = call(
            base,
            Method::GET,
            &format!("/api/v1/admin/invariant/runs/{id}?cell={cell}"),
            &admin(),
            None,
        )
        .await;
        assert_eq!(status, 200, "{report}");
        let usdt = report["assets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["asset"] == "USDT")
            .unwrap_or_else(|| panic!("{report}"));
        assert_eq!(usdt["deposits"], want, "cell {cell}: {report}");
    }
    let (status, refused) = call(
        base,
        Method::GET,
        &format!("/api/v1/admin/invariant/runs/{id}"),
        &admin(),
        None,
    )
    .await;
    assert_eq!(
        (status, refused["code"].clone()),
        (400, json!("BAD_REQUEST")),
        "{refused}"
    );
    let (status, _) = call(
        base,
        Method::GET,
        &format!("/api/v1/admin/invariant/runs/{id}?cell=9"),
        &admin(),
        None,
    )
    .await;
    assert_eq!(status, 404);

    // One cell's history alone.
    let (status, only) = call(
        base,
        Method::GET,
        "/api/v1/admin/invariant/history?cell=2",
        &admin(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{only}");
    let cells: BTreeSet<u64> = only["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cell"].as_u64().unwrap())
        .collect();
    assert_eq!(cells, BTreeSet::from([2]), "{only}");
    three.assert_every_cell_exact().await;
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A GraphQL websocket (graphql-transport-ws) whose token is only in `connection_init`, as a
/// browser sends it (no `Authorization` on the upgrade); returns it and the ack's payload.
async fn subscribed(base: &str, query: &str, as_: &str, path: &str) -> (Ws, Value) {
    let url = format!("{}{path}", base.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws.send(Message::text(
        json!({"type": "connection_init", "payload": {"token": as_}}).to_string(),
    ))
    .await
    .unwrap();
    let ack = next_json(&mut ws).await;
    assert_eq!(ack["type"], "connection_ack", "{ack}");
    ws.send(Message::text(
        json!({"id": "1", "type": "subscribe", "payload": {"query": query}}).to_string(),
    ))
    .await
    .unwrap();
    (ws, ack["payload"].clone())
}

async fn next_json(ws: &mut Ws) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a message in time")
            .expect("still open")
            .expect("a frame");
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

/// The next `transferUpdates` item.
async fn next_update(ws: &mut Ws) -> Value {
    loop {
        let message = next_json(ws).await;
        assert_ne!(message["type"], "error", "{message}");
        assert_ne!(message["type"], "complete", "{message}");
        if message["type"] == "next" {
            assert!(message["payload"]["errors"].is_null(), "{message}");
            return message["payload"]["data"]["transferUpdates"].clone();
        }
    }
}

const UPDATES: &str =
    "subscription { transferUpdates(after: 0) { reqId userId state cell position } }";

/// GraphQL subscriptions under a map: a cell-2 user's runs in cell 2 and sees its own
/// transfer's updates, never a cell-1 user's; an admin's sees every cell's updates, each naming
/// its cell, and completes once; an admin's `?cell=N` subscribes to cell N alone.
#[tokio::test]
async fn cells_admin_004_a_subscription_runs_in_the_callers_cell_and_an_admins_sees_every_cell() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    for &user in &users[..2] {
        deposit(base, user, "100").await;
    }
    let (status, first) = transfer(base, users[0], "FUNDING", "SPOT", "5").await;
    committed(status, &first);
    let (status, mine) = transfer(base, users[1], "FUNDING", "SPOT", "7").await;
    committed(status, &mine);
    let mine = mine["req_id"].as_str().unwrap().to_owned();
    let first = first["req_id"].as_str().unwrap().to_owned();

    // The cell-2 user: its own transfer, from its own cell's feed, and nothing else.
    let (mut user_ws, _) = subscribed(base, UPDATES, &token(users[1], false), "/graphql/ws").await;
    let mut states = Vec::new();
    while states.last().map(String::as_str) != Some("COMMITTED") {
        let update = next_update(&mut user_ws).await;
        assert_eq!(
            (
                update["userId"].clone(),
                update["reqId"].clone(),
                update["cell"].clone()
            ),
            (json!(users[1]), json!(mine), json!(2)),
            "only the caller's transfers: {update}"
        );
        states.push(update["state"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        states,
        [
            "INIT",
            "SOURCE_PENDING",
            "SOURCE_DONE",
            "TARGET_PENDING",
            "COMMITTED"
        ]
    );
    // A cell-1 user's new transfer is not delivered; the caller's next one is.
    let (status, later_other) = transfer(base, users[0], "FUNDING", "SPOT", "1").await;
    committed(status, &later_other);
    let (status, later) = transfer(base, users[1], "FUNDING", "SPOT", "1").await;
    committed(status, &later);
    let update = next_update(&mut user_ws).await;
    assert_eq!(update["reqId"], later["req_id"], "{update}");

    // The admin: every cell's updates, each naming its cell.
    let (mut admin_ws, ack) = subscribed(base, UPDATES, &admin(), "/graphql/ws").await;
    assert_eq!(ack, json!({"cells": [1, 2, 3], "down_cells": []}));
    let want: BTreeSet<(String, u64)> = [
        (first.clone(), 1),
        (later_other["req_id"].as_str().unwrap().to_owned(), 1),
        (mine.clone(), 2),
        (later["req_id"].as_str().unwrap().to_owned(), 2),
    ]
    .into();
    let mut seen: BTreeSet<(String, u64)> = BTreeSet::new();
    while seen != want {
        let update = next_update(&mut admin_ws).await;
        let key = (
            update["reqId"].as_str().unwrap().to_owned(),
            update["cell"].as_u64().unwrap(),
        );
        assert!(want.contains(&key), "{update}");
        if update["state"] == "COMMITTED" {
            seen.insert(key);
        }
    }
    // Stopping it: one `complete`, once every cell completed it.
    admin_ws
        .send(Message::text(
            json!({"id": "1", "type": "complete"}).to_string(),
        ))
        .await
        .unwrap();
    loop {
        let message = next_json(&mut admin_ws).await;
        if message["type"] == "complete" {
            assert_eq!(message["id"], "1");
            break;
        }
        assert_eq!(message["type"], "next", "{message}");
    }

    // The admin asking cell 2 alone: cell 2's updates only.
    let (mut cell_ws, ack) = subscribed(base, UPDATES, &admin(), "/graphql/ws?cell=2").await;
    assert_eq!(ack, Value::Null, "one cell's socket is that cell's own");
    let mut committed_seen = 0;
    while committed_seen < 2 {
        let update = next_update(&mut cell_ws).await;
        assert_eq!(update["cell"], 2, "{update}");
        assert_eq!(update["userId"], json!(users[1]), "{update}");
        committed_seen += usize::from(update["state"] == "COMMITTED");
    }
    assert_eq!(usdt(base, users[0]).await, ("94".into(), "6".into()));
    assert_eq!(usdt(base, users[1]).await, ("92".into(), "8".into()));
    three.assert_every_cell_exact().await;
}

/// Each cell's bulkhead is `LEDGER_CELL_IN_FLIGHT_MAX`: with 1, a cell-2 request held open (its
/// body not yet sent) fills cell 2, whose next request is refused at once (503 naming it) while
/// cell 1 commits; once the held request ends, cell 2 takes requests again. 0 is refused at
/// start-up, naming the variable.
#[tokio::test]
async fn cells_admin_005_each_cells_bulkhead_is_a_setting() {
    let three = ThreeCells::start().await;
    let log = LedgerProcess::try_start_cells(&three.map, &[("LEDGER_CELL_IN_FLIGHT_MAX", "0")])
        .err()
        .expect("refused");
    assert!(log.contains("LEDGER_CELL_IN_FLIGHT_MAX"), "{log}");

    let ledger = LedgerProcess::start_cells(&three.map, &[("LEDGER_CELL_IN_FLIGHT_MAX", "1")]);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    for &user in &users[..2] {
        deposit(base, user, "100").await;
    }
    let body =
        json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "10"}).to_string();
    let addr = base.strip_prefix("http://").unwrap();
    let mut held = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/internal_transfer HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        token(users[1], false),
        body.len()
    );
    held.write_all(head.as_bytes()).await.unwrap();
    held.write_all(&body.as_bytes()[..5]).await.unwrap();
    held.flush().await.unwrap();

    // Nothing else asks cell 2 meanwhile: the held request takes its one slot as soon as the
    // front has its head, well within this pause.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, refused) = transfer(base, users[1], "FUNDING", "SPOT", "10").await;
    assert_eq!(status, 503, "{refused}");
    assert_eq!(
        (refused["code"].clone(), refused["cell"].clone()),
        (json!("SYSTEM_ERROR"), json!(2)),
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("too many requests in flight"),
        "{refused}"
    );
    let (status, body_1) = transfer(base, users[0], "FUNDING", "SPOT", "10").await;
    committed(status, &body_1);

    // The held request completes: cell 2 takes requests again.
    held.write_all(&body.as_bytes()[5..]).await.unwrap();
    held.flush().await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        use tokio::io::AsyncReadExt;
        let n = tokio::time::timeout(Duration::from_secs(20), held.read(&mut buf))
            .await
            .expect("the held request is answered")
            .unwrap();
        answer.extend_from_slice(&buf[..n]);
        if n == 0 || String::from_utf8_lossy(&answer).contains("\"state\"") {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("COMMITTED"), "{answer}");
    drop(held);
    let (status, after) = transfer(base, users[1], "FUNDING", "SPOT", "10").await;
    committed(status, &after);

    // The held transfer and the one after it moved 10 each; the refused one nothing.
    assert_eq!(usdt(base, users[1]).await, ("80".into(), "20".into()));
    assert_eq!(usdt(base, users[0]).await, ("90".into(), "10".into()));
    three.assert_every_cell_exact().await;
}
