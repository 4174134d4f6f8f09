//! Cells (ADR 0017, issue 34) with real parts: three cells are three databases and three
//! spot-core processes, each started as its cell; one `ledger serve` under a cell map serves
//! them all. Each user's transfers, bulk items, balances and GraphQL history live in the user's
//! own cell (read from each cell's database directly); a map that disagrees with a cell's
//! database or a spot-core of another cell refuses start-up; an external_id retried under a user
//! of another cell credits once; a killed spot-core or a planted conservation mismatch stops only
//! its own cell while the others keep committing, the money exact in every cell; and
//! `ledger up --cells 3` runs three cells here.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use adapters::FundingLedger;
use cells::{CellId, CellMap, MapFormat, Placement};
use domain::UserId;
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{token, SpotProcess, TestDb};
use crate::procs::{LedgerProcess, RECOVER_NOW};
use tests::pg_solo::PgSolo;

/// One cell of a test: its database, its spot-core and the file with that engine's token. The
/// database is a test database on the shared server, or one on a private cluster the test can
/// stop ([`PgSolo`]).
pub(crate) struct Cell {
    pub(crate) id: u16,
    pub(crate) db: CellDb,
    pub(crate) spot: SpotProcess,
    token_file: PathBuf,
}

/// A cell's database: its URL and a pool of the test's own.
pub(crate) struct CellDb {
    pub(crate) url: String,
    pub(crate) pool: sqlx::PgPool,
    _shared: Option<TestDb>,
}

impl CellDb {
    async fn shared() -> Self {
        let db = TestDb::new().await;
        Self {
            url: db.url.clone(),
            pool: db.pool.clone(),
            _shared: Some(db),
        }
    }

    /// A database on `cluster`, which the test may stop.
    async fn private(cluster: &PgSolo) -> Self {
        let url = cluster.url("ledger_cell");
        let pool = schema::prepare(&url, 4)
            .await
            .expect("prepare the cell's database");
        Self {
            url,
            pool,
            _shared: None,
        }
    }
}

/// Three cells and the map naming them (partitions 0-84, 85-169, 170-255).
pub(crate) struct ThreeCells {
    pub(crate) cells: Vec<Cell>,
    pub(crate) map: PathBuf,
    pub(crate) placement: Placement,
    _dir: tempfile::TempDir,
}

const RANGES: [&str; 3] = ["0-84", "85-169", "170-255"];

impl ThreeCells {
    pub(crate) async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Three cells, cell 2's database on `private` when given.
    async fn start_with(private: Option<&PgSolo>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cells = Vec::new();
        for id in 1..=3u16 {
            let spot = SpotProcess::start_cell(id);
            let token_file = dir.path().join(format!("spot-{id}.token"));
            std::fs::write(&token_file, &spot.token).expect("token file");
            let db = match private {
                Some(cluster) if id == 2 => CellDb::private(cluster).await,
                _ => CellDb::shared().await,
            };
            cells.push(Cell {
                id,
                db,
                spot,
                token_file,
            });
        }
        let specs: Vec<Value> = cells
            .iter()
            .zip(RANGES)
            .map(|(c, range)| cell_json(c.id, &c.db.url, &c.spot.addr, &c.token_file, &[range]))
            .collect();
        let map = dir.path().join("cells.json");
        let text = json!({"partitions": 256, "cells": specs}).to_string();
        std::fs::write(&map, &text).expect("map file");
        let placement = Placement::of_map(&CellMap::parse(&text, MapFormat::Json).unwrap());
        Self {
            cells,
            map,
            placement,
            _dir: dir,
        }
    }

    /// The first user (by id) of each cell, in cell order.
    pub(crate) fn one_user_per_cell(&self) -> Vec<u64> {
        (1..=3u64)
            .map(|cell| {
                let cell = CellId::new(cell).unwrap();
                (1..)
                    .find(|&u| self.placement.cell_of(UserId::new(u).unwrap()) == cell)
                    .unwrap()
            })
            .collect()
    }

    /// Money in each cell is exact: the conservation check over that cell's database and
    /// spot-core alone.
    pub(crate) async fn assert_every_cell_exact(&self) {
        for cell in &self.cells {
            let funding = FundingLedger::new(cell.db.pool.clone());
            let report = adapters::pg::check_full(&funding, &cell.spot.adapter())
                .await
                .expect("the conservation check runs");
            assert!(report.ok, "cell {}: {report:#?}", cell.id);
        }
    }
}

fn cell_json(id: u16, db: &str, spot: &str, token_file: &Path, parts: &[&str]) -> Value {
    json!({
        "id": id,
        "database_url": db,
        "spot": spot,
        "spot_token_file": token_file,
        "partitions": parts,
    })
}

/// The req_ids of the transfers created in one cell's database.
async fn transfers_in(db: &CellDb) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT aggregate_id FROM events WHERE event_type = 'TransferCreated' ORDER BY aggregate_id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("list transfers")
}

/// `(status, JSON body)` of one request to the process.
pub(crate) async fn call(
    base: &str,
    method: Method,
    path: &str,
    as_: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(as_);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub(crate) async fn deposit(base: &str, user: u64, amount: &str) {
    let body = json!({"user_id": user, "asset": "USDT", "amount": amount,
                      "external_id": format!("cells-{user}-{}", ulid::Ulid::new())});
    let (status, answer) = call(
        base,
        Method::POST,
        "/api/v1/admin/deposits",
        &token(1, true),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "deposit for user {user}: {answer}");
}

pub(crate) async fn transfer(
    base: &str,
    user: u64,
    from: &str,
    to: &str,
    amount: &str,
) -> (u16, Value) {
    let body = json!({"from": from, "to": to, "asset": "USDT", "amount": amount});
    call(
        base,
        Method::POST,
        "/api/v1/internal_transfer",
        &token(user, false),
        Some(body),
    )
    .await
}

/// `(funding, spot)` of a user's USDT, as the API reports them.
pub(crate) async fn usdt(base: &str, user: u64) -> (String, String) {
    let (status, body) = call(
        base,
        Method::GET,
        "/api/v1/balances",
        &token(user, false),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let usdt = body["balances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["asset"] == "USDT")
        .cloned()
        .unwrap_or_else(|| panic!("user {user} has no USDT: {body}"));
    (
        usdt["funding"].as_str().unwrap().to_owned(),
        usdt["spot"].as_str().unwrap().to_owned(),
    )
}

/// The req_ids of a user's history through GraphQL, waiting (bounded) for at least one.
async fn graphql_history(base: &str, user: u64) -> Vec<String> {
    let query = json!({"query": "{ transfers(first: 10) { nodes { reqId } } }"});
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = call(
            base,
            Method::POST,
            "/graphql",
            &token(user, false),
            Some(query.clone()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let ids: Vec<String> = body["data"]["transfers"]["nodes"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"))
            .iter()
            .map(|n| n["reqId"].as_str().unwrap().to_owned())
            .collect();
        if !ids.is_empty() {
            return ids;
        }
        assert!(
            Instant::now() < deadline,
            "user {user}'s history stayed empty"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn cells_001_each_users_transfers_commit_in_its_own_cell() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    let mut created = Vec::new();
    for &user in &users {
        deposit(base, user, "100").await;
        let (status, body) = transfer(base, user, "FUNDING", "SPOT", "25").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["state"], "COMMITTED", "{body}");
        created.push(body["req_id"].as_str().unwrap().to_owned());
    }
    // Each cell's own database holds its user's transfer and no other.
    for (cell, req_id) in three.cells.iter().zip(&created) {
        assert_eq!(
            transfers_in(&cell.db).await,
            vec![req_id.clone()],
            "cell {}",
            cell.id
        );
    }
    for &user in &users {
        assert_eq!(usdt(base, user).await, ("75".to_owned(), "25".to_owned()));
    }
    // GraphQL history and balances come from the user's cell (the history once that cell's
    // projector has read its feed).
    for (&user, req_id) in users.iter().zip(&created) {
        assert_eq!(
            graphql_history(base, user).await,
            vec![req_id.clone()],
            "user {user}"
        );
        let query = json!({"query": "{ balances { asset funding spot } }"});
        let (status, body) = call(
            base,
            Method::POST,
            "/graphql",
            &token(user, false),
            Some(query),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["data"]["balances"][0]["funding"], "75", "{body}");
    }
    // A user reads its own transfer in its cell; another cell's user does not find it; an
    // admin finds it in whichever cell holds it.
    let path = format!("/api/v1/internal_transfer/{}", created[2]);
    let (status, body) = call(base, Method::GET, &path, &token(users[2], false), None).await;
    assert_eq!(
        (status, body["state"].clone()),
        (200, json!("COMMITTED")),
        "{body}"
    );
    let (status, _) = call(base, Method::GET, &path, &token(users[0], false), None).await;
    assert_eq!(status, 404);
    let (status, body) = call(base, Method::GET, &path, &token(1, true), None).await;
    assert_eq!(status, 200, "{body}");

    // An admin's bulk request naming users of every cell: split per cell, answered in order.
    let order = [users[2], users[0], users[1]];
    let items: Vec<Value> = order
        .iter()
        .map(|u| json!({"from": "SPOT", "to": "FUNDING", "asset": "USDT", "amount": "5", "user_id": u}))
        .collect();
    let (status, body) = call(
        base,
        Method::POST,
        "/api/v1/internal_transfers",
        &token(1, true),
        Some(json!({"transfers": items})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (user, result) in order.iter().zip(results) {
        assert_eq!(result["state"], "COMMITTED", "{result}");
        let cell = three.placement.cell_of(UserId::new(*user).unwrap()).get();
        let held = transfers_in(&three.cells[usize::from(cell) - 1].db).await;
        assert!(
            held.contains(&result["req_id"].as_str().unwrap().to_owned()),
            "user {user}"
        );
    }
    for &user in &users {
        assert_eq!(usdt(base, user).await, ("80".to_owned(), "20".to_owned()));
    }
    three.assert_every_cell_exact().await;
}

#[tokio::test]
async fn cells_002_a_map_that_disagrees_with_a_cells_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (TestDb::new().await, TestDb::new().await);
    let token_file = dir.path().join("t");
    std::fs::write(&token_file, "unused-token").unwrap();
    let write_map = |name: &str, cells: Vec<Value>| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            json!({"partitions": 256, "cells": cells}).to_string(),
        )
        .unwrap();
        path
    };
    let stored = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        Placement::of_map(&CellMap::parse(&text, MapFormat::Json).unwrap())
    };
    // Both databases know themselves under the first map.
    let first = write_map(
        "first.json",
        vec![
            cell_json(1, &one.url, "127.0.0.1:1", &token_file, &["0-127"]),
            cell_json(2, &two.url, "127.0.0.1:2", &token_file, &["128-255"]),
        ],
    );
    for (db, id) in [(&one, 1), (&two, 2)] {
        schema::cell_identity::establish(
            &db.pool,
            "test",
            CellId::new(id).unwrap(),
            &stored(&first),
        )
        .await
        .unwrap();
    }
    // Partition 17 moved on paper only: refused, naming it.
    let moved = write_map(
        "moved.json",
        vec![
            cell_json(1, &one.url, "127.0.0.1:1", &token_file, &["0-16", "18-127"]),
            cell_json(2, &two.url, "127.0.0.1:2", &token_file, &["17", "128-255"]),
        ],
    );
    let log = LedgerProcess::try_start_cells(&moved, &[])
        .err()
        .expect("refused");
    assert!(
        log.contains("partition 17: the cell's database says cell 1, the cell map says cell 2"),
        "{log}"
    );
    // Cell 1 pointed at cell 2's database (and the other way round): refused.
    let swapped = write_map(
        "swapped.json",
        vec![
            cell_json(1, &two.url, "127.0.0.1:1", &token_file, &["0-127"]),
            cell_json(2, &one.url, "127.0.0.1:2", &token_file, &["128-255"]),
        ],
    );
    let log = LedgerProcess::try_start_cells(&swapped, &[])
        .err()
        .expect("refused");
    assert!(
        log.contains("for cell 1, but it is cell 2's database"),
        "{log}"
    );
    // Without any map, a database that is a cell is not served as the whole ledger.
    let spot = SpotProcess::start();
    let log = LedgerProcess::try_start(&one.url, &spot, &[])
        .err()
        .expect("refused");
    assert!(
        log.contains("this database is cell 1 of a cell map"),
        "{log}"
    );
}

#[tokio::test]
async fn cells_003_a_spot_core_of_another_cell_is_refused_at_hello() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new().await;
    let other = SpotProcess::start_cell(2);
    let token_file = dir.path().join("t");
    std::fs::write(&token_file, &other.token).unwrap();
    let map = dir.path().join("cells.json");
    let cells = vec![cell_json(1, &db.url, &other.addr, &token_file, &["0-255"])];
    std::fs::write(&map, json!({"partitions": 256, "cells": cells}).to_string()).unwrap();
    let log = LedgerProcess::try_start_cells(&map, &[])
        .err()
        .expect("refused");
    assert!(
        log.contains("this spot-core is cell 2; the client expected cell 1"),
        "{log}"
    );
}

/// SIGKILL one cell's spot-core: the other cells keep committing, the killed cell's transfer
/// waits, and once its engine is back recovery finishes it; money is exact in every cell.
#[tokio::test]
async fn cells_004_a_killed_spot_core_stops_only_its_cell() {
    let mut three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &RECOVER_NOW);
    let base = ledger.base.clone();
    let users = three.one_user_per_cell();
    for &user in &users {
        deposit(&base, user, "100").await;
    }
    three.cells[1].spot.kill();
    let (_, stuck) = transfer(&base, users[1], "FUNDING", "SPOT", "10").await;
    assert_ne!(
        stuck["state"], "COMMITTED",
        "cell 2's spot-core is dead: {stuck}"
    );
    for _ in 0..5 {
        for user in [users[0], users[2]] {
            let (status, body) = transfer(&base, user, "FUNDING", "SPOT", "10").await;
            assert_eq!(
                (status, body["state"].clone()),
                (200, json!("COMMITTED")),
                "{body}"
            );
        }
    }
    for user in [users[0], users[2]] {
        assert_eq!(usdt(&base, user).await, ("50".to_owned(), "50".to_owned()));
    }
    three.cells[1].spot.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (funding, spot) = usdt(&base, users[1]).await;
        if (funding.as_str(), spot.as_str()) == ("90", "10") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cell 2 never finished: {funding} / {spot}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    three.assert_every_cell_exact().await;
}

/// `external_id` credits once, whichever user a retry names (ADR 0017 §6): a retry under a user
/// of another cell is refused as one database refuses a reused external_id, and nothing is
/// credited there; the claim lives in the external_id's own claim cell.
#[tokio::test]
async fn cells_005_an_external_id_retried_under_a_user_of_another_cell_credits_once() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    let external_id = format!("cells-claim-{}", ulid::Ulid::new());
    let body = |user: u64| json!({"user_id": user, "asset": "USDT", "amount": "40", "external_id": external_id});
    let admin = token(1, true);
    let (status, first) = call(
        base,
        Method::POST,
        "/api/v1/admin/deposits",
        &admin,
        Some(body(users[0])),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    // The same request again is the same deposit, credited once.
    let (status, again) = call(
        base,
        Method::POST,
        "/api/v1/admin/deposits",
        &admin,
        Some(body(users[0])),
    )
    .await;
    assert_eq!(
        (status, again["applied"].clone()),
        (200, json!(false)),
        "{again}"
    );
    for other in [users[1], users[2]] {
        let (status, refused) = call(
            base,
            Method::POST,
            "/api/v1/admin/deposits",
            &admin,
            Some(body(other)),
        )
        .await;
        assert_eq!(status, 409, "{refused}");
        assert_eq!(refused["code"], "IDEMPOTENCY_KEY_REUSED", "{refused}");
    }
    assert_eq!(
        usdt(base, users[0]).await,
        ("40".to_owned(), "0".to_owned())
    );
    for cell in &three.cells {
        let deposits: i64 =
            sqlx::query_scalar("SELECT count(*) FROM external_deposits WHERE external_id = $1")
                .bind(&external_id)
                .fetch_one(&cell.db.pool)
                .await
                .unwrap();
        assert_eq!(deposits, i64::from(cell.id == 1), "cell {}", cell.id);
        // Its one entry is in the log of the cell that credited it (ADR 0016), owned by its user;
        // neither the retry nor the refusals appended one anywhere.
        let entries: Vec<(i64, String, i64)> = sqlx::query_as(
            "SELECT user_id, event_type, sequence FROM events
             WHERE aggregate_type = 'Deposit' AND aggregate_id = $1",
        )
        .bind(&external_id)
        .fetch_all(&cell.db.pool)
        .await
        .unwrap();
        let expected = if cell.id == 1 {
            vec![(users[0] as i64, "ExternalDeposited".to_owned(), 1)]
        } else {
            Vec::new()
        };
        assert_eq!(entries, expected, "cell {}", cell.id);
        let claims: i64 =
            sqlx::query_scalar("SELECT count(*) FROM external_claims WHERE external_id = $1")
                .bind(&external_id)
                .fetch_one(&cell.db.pool)
                .await
                .unwrap();
        let claim_cell = three
            .placement
            .owner(cells::partition_of_bytes(external_id.as_bytes()));
        assert_eq!(
            claims,
            i64::from(cell.id == claim_cell.get()),
            "cell {}",
            cell.id
        );
    }
    three.assert_every_cell_exact().await;
}

/// A conservation mismatch planted in one cell with SQL halts that cell only (ADR 0017 §11): its
/// users are refused with the contract's code while the other cells keep committing, their money
/// exact. `/admin/invariant` runs the check in every cell: cell 1's is the one that fails.
#[tokio::test]
async fn cells_006_a_halt_in_one_cell_refuses_only_its_users() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    for &user in &users {
        deposit(base, user, "100").await;
    }
    // Money appears in cell 1's FUNDING with no journal row: a real violation there.
    sqlx::query("UPDATE funding_accounts SET balance = balance + 1 WHERE user_id = $1")
        .bind(i64::try_from(users[0]).unwrap())
        .execute(&three.cells[0].db.pool)
        .await
        .unwrap();
    let (status, report) = call(
        base,
        Method::GET,
        "/api/v1/admin/invariant",
        &token(1, true),
        None,
    )
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        (report["ok"].clone(), report["halted"].clone()),
        (json!(false), json!(true)),
        "{report}"
    );
    let per_cell: Vec<(Value, Value)> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["ok"].clone(), c["halted"].clone()))
        .collect();
    assert_eq!(
        per_cell,
        [
            (json!(false), json!(true)),
            (json!(true), json!(false)),
            (json!(true), json!(false))
        ],
        "{report}"
    );

    let (status, refused) = transfer(base, users[0], "FUNDING", "SPOT", "10").await;
    assert_eq!(
        (status, refused["code"].clone()),
        (503, json!("SERVICE_HALTED")),
        "{refused}"
    );
    for _ in 0..3 {
        for user in [users[1], users[2]] {
            let (status, body) = transfer(base, user, "FUNDING", "SPOT", "10").await;
            assert_eq!(
                (status, body["state"].clone()),
                (200, json!("COMMITTED")),
                "{body}"
            );
        }
    }
    for user in [users[1], users[2]] {
        assert_eq!(usdt(base, user).await, ("70".to_owned(), "30".to_owned()));
    }
    for cell in &three.cells[1..] {
        let funding = FundingLedger::new(cell.db.pool.clone());
        let report = adapters::pg::check_full(&funding, &cell.spot.adapter())
            .await
            .unwrap();
        assert!(report.ok, "cell {}: {report:#?}", cell.id);
    }
}

/// `ledger up --cells 3` starts three cells here: three databases named after `DATABASE_URL`'s,
/// three spot-core children, the placement of the first users printed, and the README's walk
/// (a deposit, a transfer, the balances) works against it in the user's cell.
#[tokio::test]
async fn cells_007_ledger_up_cells_3_runs_three_cells_here() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let name = format!("it_up_{}", ulid::Ulid::new().to_string().to_lowercase());
    let data = tempfile::tempdir().expect("tempdir");
    let mut up = Command::new(crate::helpers::bin("ledger"))
        .args([
            "up",
            "--cells",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data.path())
        .env(
            "DATABASE_URL",
            format!("{}/{name}", crate::helpers::server_url()),
        )
        .env(
            "LEDGER_JWT_SECRET",
            std::str::from_utf8(crate::helpers::JWT_SECRET).unwrap(),
        )
        .env("LEDGER_METRICS_LISTEN", "127.0.0.1:0")
        .env("LEDGER_RATE_PER_SECOND", "off")
        .env_remove("LEDGER_CELL_MAP")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ledger up --cells 3");
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(line)) => {
                let done = line.starts_with("  user 10 ");
                printed.push(line);
                if done {
                    break;
                }
            }
            _ => panic!("ledger up --cells 3 exited early:\n{}", printed.join("\n")),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let text = printed.join("\n");
    let base = printed
        .iter()
        .find_map(|l| l.strip_prefix("  API:"))
        .map(|rest| rest.trim().to_owned())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(text.contains("user 1 → cell 3 (partition 225)"), "{text}");
    assert!(text.contains(&format!("/{name}_cell3")), "{text}");

    deposit(&base, 1, "100").await;
    let (status, body) = transfer(&base, 1, "FUNDING", "SPOT", "25").await;
    assert_eq!(
        (status, body["state"].clone()),
        (200, json!("COMMITTED")),
        "{body}"
    );
    assert_eq!(usdt(&base, 1).await, ("75".to_owned(), "25".to_owned()));

    up.kill().expect("SIGKILL ledger up");
    up.wait().expect("reap ledger up");
    let server = crate::helpers::server_url();
    let user_one_cell = sqlx::PgPool::connect(&format!("{server}/{name}_cell3"))
        .await
        .unwrap();
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE event_type = 'TransferCreated'")
            .fetch_one(&user_one_cell)
            .await
            .unwrap();
    assert_eq!(held, 1, "user 1's transfer is in cell 3");
    user_one_cell.close().await;
    for cell in 1..=3 {
        tests::pg_ctl::drop_database(&server, &format!("{name}_cell{cell}"))
            .await
            .unwrap();
    }
}

/// `/healthz`'s state of `cell` (`up` or `down`).
async fn cell_state(base: &str, cell: u16) -> String {
    let body: Value = reqwest::get(format!("{base}/healthz"))
        .await
        .expect("healthz")
        .json()
        .await
        .expect("healthz JSON");
    body["cells"]
        .as_array()
        .and_then(|cells| cells.iter().find(|c| c["cell"] == cell))
        .and_then(|c| c["state"].as_str())
        .unwrap_or_else(|| panic!("no cell {cell} in {body}"))
        .to_owned()
}

/// Waits (bounded) until `/healthz` says `cell` is `state`.
async fn wait_cell(base: &str, cell: u16, state: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = cell_state(base, cell).await;
        if now == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "cell {cell} stayed {now}, not {state}, for {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (bounded) until the overview counts `committed` transfers (the read models are
/// projected from each cell's feed a moment after the commit), and returns it.
async fn overview_once_projected(base: &str, committed: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let overview = admin_get(base, "/api/v1/admin/overview").await;
        if overview["by_state"]["COMMITTED"] == committed {
            return overview;
        }
        assert!(
            Instant::now() < deadline,
            "never {committed} committed: {overview}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An external_id whose claim is kept by a cell other than `not`.
fn external_id_not_in(three: &ThreeCells, not: u16) -> String {
    (0..)
        .map(|i| format!("cells-{}-{i}", ulid::Ulid::new()))
        .find(|id| {
            three
                .placement
                .owner(cells::partition_of_bytes(id.as_bytes()))
                .get()
                != not
        })
        .unwrap()
}

async fn admin_get(base: &str, path: &str) -> Value {
    let (status, body) = call(base, Method::GET, path, &token(1, true), None).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// USDT's settings with `max_transfer_amount` set, as `PUT /api/v1/admin/assets/USDT` takes them.
fn usdt_with_max(max: &str) -> Value {
    json!({"precision": 8, "min_transfer_amount": "0.00000001", "max_transfer_amount": max,
           "status": "ACTIVE", "internal_transfer_enabled": true})
}

/// A user of the cell whose database is down is refused at once, 503 naming the cell.
async fn assert_refused_fast(base: &str, user: u64, cell: u16) {
    let asked = Instant::now();
    let (status, body) = transfer(base, user, "FUNDING", "SPOT", "10").await;
    assert_eq!(
        (status, body["code"].clone(), body["cell"].clone()),
        (503, json!("SYSTEM_ERROR"), json!(cell)),
        "{body}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "refused after {:?}, not at once",
        asked.elapsed()
    );
}

/// Stop one cell's PostgreSQL for real (its own private cluster, `-m immediate`): that cell's
/// users are refused at once (503 naming the cell) while the other cells keep committing; the
/// admin views say which cell is missing; an asset change made meanwhile reaches the cells up
/// and, once the database is back, the stopped cell catches it up before it serves again; then
/// it commits again with nothing lost, and money is exact in every cell.
#[tokio::test]
async fn cells_008_a_stopped_postgresql_stops_only_its_cell() {
    let cluster = PgSolo::start().expect("a private PostgreSQL cluster");
    let three = ThreeCells::start_with(Some(&cluster)).await;
    let ledger = LedgerProcess::start_cells(&three.map, &RECOVER_NOW);
    let base = ledger.base.clone();
    let users = three.one_user_per_cell();
    for &user in &users {
        deposit(&base, user, "100").await;
    }
    let (status, before) = transfer(&base, users[1], "FUNDING", "SPOT", "10").await;
    assert_eq!(
        (status, before["state"].clone()),
        (200, json!("COMMITTED")),
        "{before}"
    );

    cluster.stop_immediate().expect("stop cell 2's PostgreSQL");
    wait_cell(&base, 2, "down", Duration::from_secs(15)).await;
    assert_refused_fast(&base, users[1], 2).await;
    for _ in 0..5 {
        for user in [users[0], users[2]] {
            let (status, body) = transfer(&base, user, "FUNDING", "SPOT", "10").await;
            assert_eq!(
                (status, body["state"].clone()),
                (200, json!("COMMITTED")),
                "{body}"
            );
        }
    }
    // The admin views show the other cells and name the missing one.
    let overview = overview_once_projected(&base, 10).await;
    assert_eq!(
        (overview["partial"].clone(), overview["down_cells"].clone()),
        (json!(true), json!([2])),
        "{overview}"
    );
    assert_eq!(overview["cells"][1]["state"], "down", "{overview}");
    let page = admin_get(&base, "/api/v1/admin/transfers?limit=500").await;
    assert_eq!(
        (page["partial"].clone(), page["down_cells"].clone()),
        (json!(true), json!([2])),
        "{page}"
    );
    assert_eq!(page["transfers"].as_array().unwrap().len(), 10, "{page}");
    let stuck = admin_get(&base, "/api/v1/admin/transfers/stuck?older_than_ms=0").await;
    assert_eq!(
        (stuck["partial"].clone(), stuck["down_cells"].clone()),
        (json!(true), json!([2])),
        "{stuck}"
    );
    let metrics = reqwest::get(&ledger.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ledger_cell_up{cell=\"2\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ledger_cell_up{cell=\"1\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("ledger_halted{cell=\"3\"} 0"), "{metrics}");
    // Each cell's own rounds of single requests (its own coordinator's), under its label.
    assert!(
        metrics.contains("ledger_rounds_total{cell=\"3\"} "),
        "{metrics}"
    );

    // An asset change while cell 2 is down: the cells up apply it at once.
    let (status, body) = call(
        &base,
        Method::PUT,
        "/api/v1/admin/assets/USDT",
        &token(1, true),
        Some(usdt_with_max("5")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for user in [users[0], users[2]] {
        let (status, body) = transfer(&base, user, "SPOT", "FUNDING", "6").await;
        assert_eq!(
            (status, body["code"].clone()),
            (422, json!("AMOUNT_TOO_LARGE")),
            "{body}"
        );
    }

    cluster
        .start_again()
        .expect("start cell 2's PostgreSQL again");
    wait_cell(&base, 2, "up", Duration::from_secs(60)).await;
    // Caught up before it served again: its own database holds the change, and it refuses.
    let max: rust_decimal::Decimal =
        sqlx::query_scalar("SELECT max_transfer_amount FROM assets WHERE symbol = 'USDT'")
            .fetch_one(&three.cells[1].db.pool)
            .await
            .unwrap();
    assert_eq!(max.normalize().to_string(), "5");
    let (status, body) = transfer(&base, users[1], "FUNDING", "SPOT", "6").await;
    assert_eq!(
        (status, body["code"].clone()),
        (422, json!("AMOUNT_TOO_LARGE")),
        "{body}"
    );
    let (status, after) = transfer(&base, users[1], "FUNDING", "SPOT", "5").await;
    assert_eq!(
        (status, after["state"].clone()),
        (200, json!("COMMITTED")),
        "{after}"
    );

    // Nothing lost in the stopped cell: both its transfers, and its user's money.
    assert_eq!(
        usdt(&base, users[1]).await,
        ("85".to_owned(), "15".to_owned())
    );
    let mut held = transfers_in(&three.cells[1].db).await;
    held.sort();
    let mut want = vec![
        before["req_id"].as_str().unwrap().to_owned(),
        after["req_id"].as_str().unwrap().to_owned(),
    ];
    want.sort();
    assert_eq!(held, want);
    for user in [users[0], users[2]] {
        assert_eq!(usdt(&base, user).await, ("50".to_owned(), "50".to_owned()));
    }
    three.assert_every_cell_exact().await;
}

/// A ledger started while one cell's database is down serves the other cells, says which cell
/// is down, refuses a deposit whose external_id that cell keeps, and serves the cell once its
/// database is back; money exact in every cell.
#[tokio::test]
async fn cells_009_a_ledger_started_while_a_cells_database_is_down_serves_the_others() {
    let cluster = PgSolo::start().expect("a private PostgreSQL cluster");
    let three = ThreeCells::start_with(Some(&cluster)).await;
    let users = three.one_user_per_cell();
    cluster.stop_immediate().expect("stop cell 2's PostgreSQL");
    let ledger = LedgerProcess::start_cells(&three.map, &RECOVER_NOW);
    let base = ledger.base.clone();
    let health: Value = reqwest::get(format!("{base}/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(cell_state(&base, 2).await, "down");
    for user in [users[0], users[2]] {
        let body = json!({"user_id": user, "asset": "USDT", "amount": "100",
                          "external_id": external_id_not_in(&three, 2)});
        let (status, answer) = call(
            &base,
            Method::POST,
            "/api/v1/admin/deposits",
            &token(1, true),
            Some(body),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let (status, body) = transfer(&base, user, "FUNDING", "SPOT", "30").await;
        assert_eq!(
            (status, body["state"].clone()),
            (200, json!("COMMITTED")),
            "{body}"
        );
    }
    assert_refused_fast(&base, users[1], 2).await;
    // An external_id whose claim cell is cell 2 cannot be claimed: refused, nothing credited.
    let external_id = (0..)
        .map(|i| format!("cells-009-{i}"))
        .find(|id| {
            three
                .placement
                .owner(cells::partition_of_bytes(id.as_bytes()))
                .get()
                == 2
        })
        .unwrap();
    let body =
        json!({"user_id": users[0], "asset": "USDT", "amount": "7", "external_id": external_id});
    let (status, refused) = call(
        &base,
        Method::POST,
        "/api/v1/admin/deposits",
        &token(1, true),
        Some(body),
    )
    .await;
    assert_eq!(
        (status, refused["cell"].clone()),
        (503, json!(2)),
        "{refused}"
    );
    assert_eq!(
        usdt(&base, users[0]).await,
        ("70".to_owned(), "30".to_owned())
    );

    cluster.start_again().expect("start cell 2's PostgreSQL");
    wait_cell(&base, 2, "up", Duration::from_secs(60)).await;
    deposit(&base, users[1], "100").await;
    let (status, body) = transfer(&base, users[1], "FUNDING", "SPOT", "30").await;
    assert_eq!(
        (status, body["state"].clone()),
        (200, json!("COMMITTED")),
        "{body}"
    );
    for &user in &users {
        assert_eq!(usdt(&base, user).await, ("70".to_owned(), "30".to_owned()));
    }
    three.assert_every_cell_exact().await;
}

/// The admin views across cells: the transfers list walked page by page with its cursor shows
/// every cell's transfers once each, newest first; the overview and the conservation check add
/// up every cell; an asset change reaches every cell.
#[tokio::test]
async fn cells_010_the_admin_views_merge_every_cell() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.as_str();
    let users = three.one_user_per_cell();
    for &user in &users {
        deposit(base, user, "100").await;
        for _ in 0..4 {
            let (status, body) = transfer(base, user, "FUNDING", "SPOT", "1").await;
            assert_eq!(
                (status, body["state"].clone()),
                (200, json!("COMMITTED")),
                "{body}"
            );
        }
    }
    overview_once_projected(base, 12).await;
    let mut every = Vec::new();
    for cell in &three.cells {
        every.extend(transfers_in(&cell.db).await);
    }
    every.sort();
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut path = "/api/v1/admin/transfers?limit=5".to_owned();
    for _ in 0..10 {
        let page = admin_get(base, &path).await;
        assert_eq!(page["partial"], false, "{page}");
        for row in page["transfers"].as_array().unwrap() {
            seen.push((
                row["created_at"].as_str().unwrap().to_owned(),
                row["req_id"].as_str().unwrap().to_owned(),
            ));
        }
        match page["next"].as_str() {
            Some(next) => {
                path = format!(
                    "/api/v1/admin/transfers?limit=5&after={}",
                    next.replace(':', "%3A").replace(',', "%2C")
                )
            }
            None => break,
        }
    }
    let mut newest_first = seen.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, newest_first, "pages are newest first across cells");
    let mut ids: Vec<String> = seen.into_iter().map(|(_, id)| id).collect();
    ids.sort();
    assert_eq!(ids, every, "every transfer of every cell once");

    let overview = overview_once_projected(base, 12).await;
    assert_eq!(overview["cells"].as_array().unwrap().len(), 3, "{overview}");
    let invariant = admin_get(base, "/api/v1/admin/invariant").await;
    assert_eq!(
        (invariant["ok"].clone(), invariant["partial"].clone()),
        (json!(true), json!(false)),
        "{invariant}"
    );
    assert_eq!(invariant["total"]["USDT"]["deposits"], "300", "{invariant}");
    assert_eq!(invariant["total"]["USDT"]["spot"], "12", "{invariant}");

    // An asset suspended by an admin is suspended in every cell at once.
    let mut suspended = usdt_with_max("100000000");
    suspended["status"] = json!("SUSPENDED");
    let (status, body) = call(
        base,
        Method::PUT,
        "/api/v1/admin/assets/USDT",
        &token(1, true),
        Some(suspended),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for (cell, &user) in three.cells.iter().zip(&users) {
        let (status, body) = transfer(base, user, "FUNDING", "SPOT", "1").await;
        assert_eq!(
            (status, body["code"].clone()),
            (422, json!("ASSET_SUSPENDED")),
            "cell {}: {body}",
            cell.id
        );
        let stored: String = sqlx::query_scalar("SELECT status FROM assets WHERE symbol = 'USDT'")
            .fetch_one(&cell.db.pool)
            .await
            .unwrap();
        assert_eq!(stored, "SUSPENDED", "cell {}", cell.id);
    }
    three.assert_every_cell_exact().await;
}
