//! The tamper-evident log per cell (issue 36, ADR 0017): one `ledger serve` under a map of two
//! cells (two databases, two spot-cores) keeps one tree per cell, each signed as
//! `<origin>/cell/<N>` with its own key derived from the one key file; every log route takes
//! `?cell=N` (a cell not in the map: NOT_FOUND; none: the caller's own cell), transfer answers
//! and receipts name their cell, and `ledger verify --cell N` checks each cell's log in its own
//! database.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cells::{CellId, CellMap, MapFormat, Placement};
use domain::UserId;
use reqwest::Method;
use serde_json::json;

use crate::cells::call;
use crate::helpers::{bin, token, SpotProcess, TestDb};
use crate::procs::LedgerProcess;
use crate::tlog::{key_file, signer, ORIGIN};

/// Waits until cell `db`'s newest checkpoint covers its whole feed; that size.
pub(crate) async fn checkpointed(db: &TestDb) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (head, size): (i64, Option<i64>) = sqlx::query_as(
            "SELECT (SELECT position FROM feed_head), (SELECT max(size) FROM tlog_checkpoints)",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if head > 0 && size == Some(head) {
            return head;
        }
        assert!(Instant::now() < deadline, "{size:?} of {head}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two cells, each a database and a spot-core of its own, and the map naming them (partitions
/// 0-127 in cell 1, 128-255 in cell 2) in a temporary directory.
pub(crate) struct TwoCells {
    pub dir: tempfile::TempDir,
    pub cells: Vec<(TestDb, SpotProcess)>,
    pub map: PathBuf,
    pub placement: Placement,
}

impl TwoCells {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut cells = Vec::new();
        let mut specs = Vec::new();
        for (id, range) in [(1u16, "0-127"), (2, "128-255")] {
            let spot = SpotProcess::start_cell(id);
            let token_file = dir.path().join(format!("spot-{id}.token"));
            std::fs::write(&token_file, &spot.token).unwrap();
            let db = TestDb::new().await;
            specs.push(json!({"id": id, "database_url": db.url, "spot": spot.addr,
                              "spot_token_file": token_file, "partitions": [range]}));
            cells.push((db, spot));
        }
        let text = json!({"partitions": 256, "cells": specs}).to_string();
        let map = dir.path().join("cells.json");
        std::fs::write(&map, &text).unwrap();
        let placement = Placement::of_map(&CellMap::parse(&text, MapFormat::Json).unwrap());
        Self {
            dir,
            cells,
            map,
            placement,
        }
    }
}

/// `ledger verify --cell N` (and `args`) under `map` with the key file `key`: success, output.
pub(crate) fn verify_cell(map: &Path, key: &Path, cell: u16, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("ledger"))
        .args(["verify", "--cell", &cell.to_string()])
        .args(args)
        .env_remove("DATABASE_URL")
        .env("LEDGER_CELL_MAP", map)
        .env("LEDGER_LOG_SIGNING_KEY_FILE", key)
        .output()
        .expect("run ledger verify");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn tlog_each_cell_keeps_its_own_log_named_by_its_cell() {
    let TwoCells {
        dir,
        cells,
        map,
        placement,
    } = TwoCells::start().await;
    let key = key_file(dir.path());
    let key_text = key.to_str().unwrap().to_owned();
    let env = [
        ("LEDGER_LOG_SIGNING_KEY_FILE", key_text.as_str()),
        ("LEDGER_LOG_CHECKPOINT_EVENTS", "1"),
        ("LEDGER_LOG_CHECKPOINT_MS", "100"),
    ];
    let ledger = LedgerProcess::start_cells(&map, &env);
    let base = ledger.base.clone();
    let admin = token(1, true);

    // One user per cell, a deposit and a transfer each: the answer names the user's cell.
    let mut receipts = Vec::new();
    for cell in 1..=2u16 {
        let id = CellId::new(cell.into()).unwrap();
        let user = (1..)
            .find(|&u| placement.cell_of(UserId::new(u).unwrap()) == id)
            .unwrap();
        let deposit = json!({"user_id": user, "asset": "USDT", "amount": "10",
                             "external_id": format!("tlog-cells-{user}")});
        let (status, body) = call(
            &base,
            Method::POST,
            "/api/v1/admin/deposits",
            &admin,
            Some(deposit),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"});
        let (status, answer) = call(
            &base,
            Method::POST,
            "/api/v1/internal_transfer",
            &token(user, false),
            Some(body),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["log_cell"], json!(cell), "{answer}");
        let req_id = answer["req_id"].as_str().unwrap().to_owned();
        let stored: Vec<i64> = sqlx::query_scalar(
            "SELECT feed_position FROM events WHERE aggregate_id = $1 ORDER BY sequence",
        )
        .bind(&req_id)
        .fetch_all(&cells[usize::from(cell) - 1].0.pool)
        .await
        .unwrap();
        assert_eq!(answer["log_positions"], json!(stored), "{answer}");
        receipts.push((cell, user, req_id, stored));
    }

    for (cell, user, req_id, positions) in &receipts {
        let size = checkpointed(&cells[usize::from(*cell) - 1].0).await;
        let identity = signer().for_cell(*cell).unwrap();
        let origin = format!("{ORIGIN}/cell/{cell}");
        assert_eq!(identity.name(), origin);
        // The cell's checkpoint and key, asked by cell; a user's own cell without one.
        let user_token = token(*user, false);
        for path in [
            format!("/api/v1/log/checkpoint?cell={cell}"),
            "/api/v1/log/checkpoint".into(),
        ] {
            let (status, note) = call(&base, Method::GET, &path, &user_token, None).await;
            assert_eq!(status, 200, "{path}: {note}");
            let note = note.as_str().unwrap();
            let body = identity
                .verifier()
                .open(note)
                .expect("signed by the cell's key");
            assert!(body.starts_with(&format!("{origin}\n{size}\n")), "{body}");
        }
        let (_, vkey) = call(
            &base,
            Method::GET,
            &format!("/api/v1/log/key?cell={cell}"),
            &admin,
            None,
        )
        .await;
        assert_eq!(vkey.as_str().unwrap().trim(), identity.verifier().to_vkey());
        // An inclusion proof in its cell; the receipt found across cells names the cell.
        let path = format!(
            "/api/v1/log/proof/inclusion?position={}&size={size}&cell={cell}",
            positions[0]
        );
        let (status, proof) = call(&base, Method::GET, &path, &user_token, None).await;
        assert_eq!(status, 200, "{proof}");
        let (status, receipt) = call(
            &base,
            Method::GET,
            &format!("/api/v1/log/receipts/{req_id}"),
            &admin,
            None,
        )
        .await;
        assert_eq!(status, 200, "{receipt}");
        assert_eq!(receipt["cell"], json!(cell), "{receipt}");
        let (ok, out) = verify_cell(&map, &key, *cell, &[]);
        assert!(ok && out.contains("the log verifies"), "cell {cell}: {out}");
        // The cell's one deposit is in its own log, held to its row there.
        assert!(
            out.contains("deposits held to their entries: 1;"),
            "cell {cell}: {out}"
        );
    }
    let (status, body) = call(
        &base,
        Method::GET,
        "/api/v1/log/checkpoint?cell=3",
        &admin,
        None,
    )
    .await;
    assert_eq!((status, body["code"].clone()), (404, json!("NOT_FOUND")));
}
