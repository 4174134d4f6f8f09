//! `ledger cells add` (ADR 0023 §1): on `ledger up --cells 3`, a fourth cell joins the running
//! deployment (its own database beside the others' and a spot-core child of its own), every
//! cell stores the map's next version naming it with a `CellAdded` entry, partitions move to it
//! from the command line while the README's walk runs, its users trade there, and a restart of
//! `ledger up --cells 3` from the same data dir serves the fourth cell again: the cells' stored
//! map is the truth once a cell was added, the `--cells 3` is only the seed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use reqwest::Method;
use serde_json::{json, Value};

use crate::cells::{call, deposit, transfer, usdt};
use crate::cells_move_api::cells_cli;
use crate::helpers::{bin, server_url, token, JWT_SECRET};

/// A running `ledger up --cells 3` and the API it printed.
struct Up {
    child: Child,
    base: String,
}

impl Up {
    /// `ledger up --cells 3` over databases named after `name`, its data in `data`.
    fn start(name: &str, data: &Path) -> Self {
        Self::start_with(name, data, &[])
    }

    /// [`Up::start`] with `env` added (a fail point).
    fn start_with(name: &str, data: &Path, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(bin("ledger"));
        command.envs(env.iter().copied());
        let mut child = command
            .args([
                "up",
                "--cells",
                "3",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(data)
            .env("DATABASE_URL", format!("{}/{name}", server_url()))
            .env(
                "LEDGER_JWT_SECRET",
                std::str::from_utf8(JWT_SECRET).unwrap(),
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
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut printed = Vec::new();
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let base = line.strip_prefix("  API:").map(|b| b.trim().to_owned());
                    printed.push(line);
                    if let Some(base) = base {
                        break base;
                    }
                }
                _ => panic!("ledger up --cells 3 exited early:\n{}", printed.join("\n")),
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self { child, base }
    }

    /// Waits (bounded) until `/healthz` says every cell serves: on a busy machine a cell may
    /// be reached in the background after the banner.
    async fn all_up(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let health: Value = reqwest::get(format!("{}/healthz", self.base))
                .await
                .expect("healthz")
                .json()
                .await
                .expect("healthz JSON");
            if health["status"] == "ok" {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "cells not up: {health}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL and reap (as `Drop` does; named for the reader).
    fn stop(self) {
        drop(self);
    }
}

impl Drop for Up {
    /// SIGKILL, also when the test failed: a process left behind would hold its connections.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn admin(base: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    call(base, method, path, &token(1, true), body).await
}

/// Every cell of `base` conserved, by the process's own check of each (from the start).
async fn assert_exact(base: &str) {
    let (status, report) =
        admin(base, Method::GET, "/api/v1/admin/invariant?full=true", None).await;
    assert_eq!((status, &report["ok"]), (200, &json!(true)), "{report}");
}

async fn cell_pool(name: &str, cell: u16) -> sqlx::PgPool {
    sqlx::PgPool::connect(&format!("{}/{name}_cell{cell}", server_url()))
        .await
        .unwrap()
}

#[tokio::test]
async fn cells_add_001_a_fourth_cell_joins_ledger_up_takes_a_partition_and_survives_a_restart() {
    let name = format!("it_add_{}", ulid::Ulid::new().to_string().to_lowercase());
    let data = tempfile::tempdir().expect("tempdir");
    let up = Up::start(&name, data.path());
    up.all_up().await;
    let base = up.base.clone();
    // User 1 lives in cell 3 (partition 225); their walk runs before, during and after.
    deposit(&base, 1, "100").await;
    let (status, body) = transfer(&base, 1, "FUNDING", "SPOT", "25").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &json!("COMMITTED")),
        "{body}"
    );

    // A bad request is refused with the contract's code and adds nothing.
    let (status, body) = admin(
        &base,
        Method::POST,
        "/api/v1/admin/cells",
        Some(json!({"spot": "start", "colour": "red"})),
    )
    .await;
    assert_eq!(
        (status, &body["code"]),
        (400, &json!("BAD_REQUEST")),
        "{body}"
    );

    let (ok, out) = cells_cli(&base, &["add"]);
    assert!(ok && out.contains("cell 4 added"), "{out}");
    let (status, health) = admin(&base, Method::GET, "/healthz", None).await;
    assert_eq!(status, 200);
    let four = health["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cell"] == 4);
    assert_eq!(four.map(|c| &c["state"]), Some(&json!("up")), "{health}");
    for cell in 1..=4u16 {
        let pool = cell_pool(&name, cell).await;
        let (version, added): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT map_version FROM cell_identity),
                    (SELECT count(*) FROM events WHERE event_type = 'CellAdded')",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            (version, added),
            (2, 1),
            "cell {cell}: version and CellAdded"
        );
        pool.close().await;
    }

    // User 1's partition moves to the new cell; the walk goes on there.
    let (ok, out) = cells_cli(&base, &["move", "--partition", "225", "--to", "4"]);
    assert!(ok && out.contains("DONE"), "{out}");
    let (status, body) = transfer(&base, 1, "SPOT", "FUNDING", "5").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &json!("COMMITTED")),
        "{body}"
    );
    deposit(&base, 1, "10").await;
    assert_eq!(usdt(&base, 1).await, ("90".to_owned(), "20".to_owned()));
    let four = cell_pool(&name, 4).await;
    let own: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE user_id = 1 AND metadata::jsonb ->> 'origin_move' IS NULL",
    )
    .fetch_one(&four)
    .await
    .unwrap();
    assert!(
        own >= 3,
        "user 1's new transfer is cell 4's own ({own} events)"
    );
    four.close().await;
    assert_exact(&base).await;

    // A second addition gets the next id; a restart from `--cells 3` serves all five.
    let (ok, out) = cells_cli(&base, &["add"]);
    assert!(ok && out.contains("cell 5 added"), "{out}");
    up.stop();
    let up = Up::start(&name, data.path());
    up.all_up().await;
    let (_, health) = admin(&up.base, Method::GET, "/healthz", None).await;
    let cells: Vec<u64> = health["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["cell"].as_u64())
        .collect();
    assert_eq!(cells, [1, 2, 3, 4, 5], "{health}");
    assert_eq!(usdt(&up.base, 1).await, ("90".to_owned(), "20".to_owned()));
    let (status, body) = transfer(&up.base, 1, "FUNDING", "SPOT", "1").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &json!("COMMITTED")),
        "{body}"
    );
    assert_exact(&up.base).await;
    // `ledger cells plan` plans over the added cells too, user 1 in cell 4.
    let plan = Command::new(bin("ledger"))
        .args(["cells", "plan", "--up-cells", "3"])
        .env("DATABASE_URL", format!("{}/{name}", server_url()))
        .output()
        .expect("ledger cells plan runs");
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(
        plan.status.success()
            && text.contains("cell 4: 1 user")
            && text.contains("cell 5: 0 users"),
        "{text}{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    up.stop();
    for cell in 1..=5 {
        tests::pg_ctl::drop_database(&server_url(), &format!("{name}_cell{cell}"))
            .await
            .unwrap();
    }
}

/// Each of cells `1..=cells`: (map version, CellAdded entries, cell_cells rows).
async fn stored_additions(name: &str, cells: u16) -> Vec<(i64, i64, i64)> {
    let mut out = Vec::new();
    for cell in 1..=cells {
        let pool = cell_pool(name, cell).await;
        out.push(
            sqlx::query_as(
                "SELECT (SELECT map_version FROM cell_identity),
                        (SELECT count(*) FROM events WHERE event_type = 'CellAdded'),
                        (SELECT count(*) FROM cell_cells)",
            )
            .fetch_one(&pool)
            .await
            .unwrap(),
        );
        pool.close().await;
    }
    out
}

/// An addition cut short by a crash, before any cell stored the map naming the new cell and
/// then after only the first did: the first leaves nothing routed to it and is asked again
/// over the database it left; the second is found at the next start (from the one cell that
/// stored it) and finished in every other cell, and the new cell serves.
#[tokio::test]
async fn cells_add_002_an_addition_cut_short_by_a_crash_is_asked_again_or_finished_at_start() {
    let name = format!("it_add_{}", ulid::Ulid::new().to_string().to_lowercase());
    let data = tempfile::tempdir().expect("tempdir");
    let crash = |point: &'static str| {
        [
            ("LEDGER_FAILPOINT", point),
            ("LEDGER_ALLOW_FAILPOINTS", "1"),
        ]
    };
    for point in ["cell_add_reached", "cell_add_one_stored"] {
        let mut up = Up::start_with(&name, data.path(), &crash(point));
        up.all_up().await;
        deposit(&up.base, 1, "10").await;
        let (ok, out) = cells_cli(&up.base, &["add"]);
        assert!(!ok, "the addition crashed at {point}: {out}");
        let status = up.child.wait().expect("the ledger ended");
        assert!(!status.success(), "{point}: aborted, {status}");
        let found = stored_additions(&name, 3).await;
        let expected = if point == "cell_add_reached" {
            vec![(1, 0, 0); 3]
        } else {
            vec![(2, 1, 1), (1, 0, 0), (1, 0, 0)]
        };
        assert_eq!(found, expected, "after the crash at {point}");
    }
    let up = Up::start(&name, data.path());
    up.all_up().await;
    let (_, health) = admin(&up.base, Method::GET, "/healthz", None).await;
    assert_eq!(
        health["cells"].as_array().map(Vec::len),
        Some(4),
        "{health}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while stored_additions(&name, 4).await != vec![(2, 1, 1); 4] {
        assert!(
            std::time::Instant::now() < deadline,
            "not finished: {:?}",
            stored_additions(&name, 4).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (ok, out) = cells_cli(&up.base, &["move", "--partition", "225", "--to", "4"]);
    assert!(ok && out.contains("DONE"), "{out}");
    let (status, body) = transfer(&up.base, 1, "FUNDING", "SPOT", "4").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &json!("COMMITTED")),
        "{body}"
    );
    assert_eq!(usdt(&up.base, 1).await, ("16".to_owned(), "4".to_owned()));
    assert_exact(&up.base).await;
    up.stop();
    for cell in 1..=4 {
        tests::pg_ctl::drop_database(&server_url(), &format!("{name}_cell{cell}"))
            .await
            .unwrap();
    }
}
