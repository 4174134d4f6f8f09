//! The front reloads the cell map at run time (ADR 0023 §1) over three real cells (databases and
//! spot-cores) and one `ledger serve`: a partition is switched from cell 1 to cell 2 by SQL in
//! every cell (what a move's switch writes: the row names cell 2, `map_version` 2), and without
//! a restart a write of that partition's users reaches cell 2: through the fenced refusal in
//! cell 1 (the periodic reload off), or through the probe that reads the version. No write of
//! the partition lands in cell 1 after the switch, and a lower version is never installed.

use std::time::Duration;

use cells::partition_of;
use domain::UserId;
use reqwest::Method;
use serde_json::Value;

use crate::cells::{call, deposit, transfer, Cell, ThreeCells};
use crate::helpers::token;
use crate::procs::LedgerProcess;

/// A user of cell 1's first partition with history (`a`), and a fresh user of the same
/// partition (`b`).
fn users(three: &ThreeCells) -> (u64, u64, u8) {
    let a = three.one_user_per_cell()[0];
    let p = partition_of(UserId::new(a).unwrap());
    let b = (a + 1..)
        .find(|u| partition_of(UserId::new(*u).unwrap()) == p)
        .unwrap();
    (a, b, p.get())
}

/// Writes map `version` into every cell: partition `p` is `owner`'s.
async fn switch(three: &ThreeCells, p: u8, owner: u16, version: i64) {
    for cell in &three.cells {
        sqlx::query("UPDATE cell_partitions SET cell_id = $2 WHERE partition = $1")
            .bind(i16::from(p))
            .bind(i32::from(owner))
            .execute(&cell.db.pool)
            .await
            .unwrap();
        sqlx::query("UPDATE cell_identity SET map_version = $1")
            .bind(version)
            .execute(&cell.db.pool)
            .await
            .unwrap();
    }
}

/// Rows of partition `p`'s users in `table` of `cell`'s database.
async fn rows_of_partition(cell: &Cell, table: &str, p: u8) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table} WHERE user_partition(user_id) = $1"
    ))
    .bind(i32::from(p))
    .fetch_one(&cell.db.pool)
    .await
    .unwrap()
}

/// Every row of partition `p`'s users in cell 1's event and money tables.
async fn written_in(cell: &Cell, p: u8) -> [i64; 3] {
    [
        rows_of_partition(cell, "events", p).await,
        rows_of_partition(cell, "funding_journal", p).await,
        rows_of_partition(cell, "external_deposits", p).await,
    ]
}

/// Events of `user` in `cell`'s database.
async fn events_of(cell: &Cell, user: u64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events WHERE user_id = $1")
        .bind(i64::try_from(user).unwrap())
        .fetch_one(&cell.db.pool)
        .await
        .unwrap()
}

/// `b` deposits and moves money to SPOT: both in cell 2.
async fn b_trades_in_cell_two(three: &ThreeCells, base: &str, b: u64) {
    deposit(base, b, "50").await;
    let (status, body) = transfer(base, b, "FUNDING", "SPOT", "20").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "COMMITTED", "{body}");
    assert!(events_of(&three.cells[1], b).await > 0);
    assert_eq!(events_of(&three.cells[0], b).await, 0);
}

#[tokio::test]
async fn cells_map_003_a_write_fenced_in_the_old_cell_reloads_the_map_and_reaches_the_new_one() {
    let three = ThreeCells::start().await;
    // No periodic reload: only the fenced refusal can reload the map.
    let ledger = LedgerProcess::start_cells(&three.map, &[("LEDGER_MAP_RELOAD_PROBES", "0")]);
    let base = &ledger.base;
    let (a, b, p) = users(&three);
    deposit(base, a, "100").await;
    let (status, body) = transfer(base, a, "FUNDING", "SPOT", "10").await;
    assert_eq!(status, 200, "{body}");
    let one = &three.cells[0];
    let before = written_in(one, p).await;
    assert!(before[0] > 0, "a's transfer is in cell 1");

    switch(&three, p, 2, 2).await;
    // b's first write goes to cell 1 under the map held (version 1), is refused at its fence,
    // and is sent to cell 2 under the reloaded map: cell 2 answers it (b has no money there).
    let (status, body) = transfer(base, b, "FUNDING", "SPOT", "5").await;
    assert_ne!(status, 503, "{body}");
    ledger
        .wait_log("map version 1 -> 2 reloaded", Duration::from_secs(5))
        .await;
    assert!(ledger.log().contains("sent to its new one"));
    b_trades_in_cell_two(&three, base, b).await;
    assert_eq!(written_in(one, p).await, before, "nothing of P in cell 1");

    // Every cell now says version 1 and P is cell 1's again: lower than the version held, so
    // never installed. b's write still goes to cell 2, whose fence refuses it (its row names
    // cell 1 now): the 503 to retry, and nothing is written in cell 1.
    switch(&three, p, 1, 1).await;
    let answer = reqwest::Client::new()
        .post(format!("{base}/api/v1/internal_transfer"))
        .bearer_auth(token(b, false))
        .json(&serde_json::json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["retry-after"], "1");
    assert_eq!(answer.headers()[edge::error::ROUTE_AGAIN], "map");
    assert_eq!(
        written_in(one, p).await,
        before,
        "the older map was not installed"
    );
    assert!(!ledger.log().contains("map version 2 -> 1"));
    let (status, balances) = call(
        base,
        Method::GET,
        "/api/v1/balances",
        &token(b, false),
        None,
    )
    .await;
    assert_eq!(status, 200, "{balances}");
    assert_eq!(
        usdt_funding(&balances),
        "30",
        "b's balance is read from cell 2"
    );
}

#[tokio::test]
async fn cells_map_004_a_probe_that_reads_a_higher_version_reloads_the_map() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = &ledger.base;
    let (_, b, p) = users(&three);
    let one = &three.cells[0];
    let before = written_in(one, p).await;
    switch(&three, p, 2, 2).await;
    ledger
        .wait_log("map version 1 -> 2 reloaded", Duration::from_secs(10))
        .await;
    b_trades_in_cell_two(&three, base, b).await;
    assert!(
        !ledger.log().contains("sent to its new one"),
        "no write went to cell 1 first"
    );
    assert_eq!(written_in(one, p).await, before);
}

fn usdt_funding(balances: &Value) -> String {
    balances["balances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["asset"] == "USDT")
        .and_then(|b| b["funding"].as_str())
        .unwrap_or_else(|| panic!("{balances}"))
        .to_owned()
}
