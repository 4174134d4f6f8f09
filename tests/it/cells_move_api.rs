//! A partition move asked of a running `ledger serve` over three real cells (ADR 0023 §4):
//! `ledger cells move` starts it through the admin route, the process's move worker drives it,
//! the front routes the moved user to their new cell, `ledger cells moves` lists it, every cell
//! stays exact, and a restarted process (its map file now older than the cells' stored map)
//! serves the moved user from the new cell.

use std::process::Command;

use cells::partition_of;
use domain::UserId;
use reqwest::Method;

use crate::cells::{call, deposit, transfer, ThreeCells};
use crate::helpers::{bin, token, JWT_SECRET};
use crate::procs::LedgerProcess;

/// `ledger cells <args>` against the ledger at `base`; its exit status and stdout.
pub(crate) fn cells_cli(base: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("ledger"))
        .arg("cells")
        .args(args)
        .args(["--api", base])
        .env(
            "LEDGER_JWT_SECRET",
            std::str::from_utf8(JWT_SECRET).unwrap(),
        )
        .output()
        .expect("ledger cells runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.success(), format!("{stdout}{stderr}"))
}

async fn events_of(three: &ThreeCells, cell: usize, user: u64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events WHERE user_id = $1")
        .bind(i64::try_from(user).unwrap())
        .fetch_one(&three.cells[cell].db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn cells_move_013_the_command_line_moves_a_partition_of_a_running_ledger_and_users_follow() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.clone();
    let a = three.one_user_per_cell()[0];
    let p = partition_of(UserId::new(a).unwrap()).get();
    deposit(&base, a, "100").await;
    let (status, body) = transfer(&base, a, "FUNDING", "SPOT", "30").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &"COMMITTED".into()),
        "{body}"
    );
    assert!(events_of(&three, 0, a).await > 0 && events_of(&three, 2, a).await == 0);

    let (ok, out) = cells_cli(&base, &["move", "--partition", &p.to_string(), "--to", "3"]);
    assert!(ok, "{out}\n{}", ledger.log());
    assert!(
        out.contains(&format!("partition {p} from cell 1 to cell 3")) && out.contains("DONE"),
        "{out}"
    );
    let (ok, out) = cells_cli(&base, &["moves"]);
    assert!(
        ok && out.contains("DONE") && out.contains("cell 1 → 3"),
        "{out}"
    );

    // The moved user trades on, in cell 3, and reads their balances from there.
    let (status, body) = transfer(&base, a, "SPOT", "FUNDING", "10").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &"COMMITTED".into()),
        "{body}"
    );
    let in_three = events_of(&three, 2, a).await;
    assert!(
        in_three > events_of(&three, 0, a).await,
        "history and the new transfer in cell 3"
    );
    let (status, balances) = call(
        &base,
        Method::GET,
        "/api/v1/balances",
        &token(a, false),
        None,
    )
    .await;
    assert_eq!(status, 200, "{balances}");
    let usdt = balances["balances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["asset"] == "USDT")
        .cloned()
        .unwrap();
    assert_eq!(
        (usdt["funding"].as_str(), usdt["spot"].as_str()),
        (Some("80"), Some("20")),
        "{balances}"
    );
    for cell in &three.cells {
        let version: i64 = sqlx::query_scalar("SELECT map_version FROM cell_identity")
            .fetch_one(&cell.db.pool)
            .await
            .unwrap();
        assert_eq!(version, 2, "cell {}", cell.id);
    }
    three.assert_every_cell_exact().await;

    // The merged feed gives each event once: the copies in cell 3 are passed over.
    let (status, feed) = call(
        &base,
        Method::GET,
        "/api/v1/events?limit=1000",
        &token(1, true),
        None,
    )
    .await;
    assert_eq!(status, 200, "{feed}");
    let events = feed["events"].as_array().unwrap();
    // (`PartitionMoved` stands in both cells' feeds: one fact, one event id, named twice.)
    let mut ids: Vec<&str> = events
        .iter()
        .filter(|e| e["aggregate_type"] != "Partition")
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    let all = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all, "no event twice: {feed}");
    assert!(events.iter().all(|e| e.get("origin").is_none()), "{feed}");
    let copies: i64 = sqlx::query_scalar("SELECT count(*) FROM feed WHERE origin_cell = 1")
        .fetch_one(&three.cells[2].db.pool)
        .await
        .unwrap();
    assert!(
        copies > 0,
        "cell 3's own feed shows the copies with their origin"
    );

    // A second move of the same partition from the wrong cell, or to its own cell, is refused.
    let (ok, out) = cells_cli(&base, &["move", "--partition", &p.to_string(), "--to", "3"]);
    assert!(!ok && out.contains("400"), "{out}");

    // Restarted with the same (now older) map file: the stored map is routed by.
    drop(ledger);
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let (status, body) = transfer(&ledger.base, a, "FUNDING", "SPOT", "5").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &"COMMITTED".into()),
        "{body}\n{}",
        ledger.log()
    );
    assert!(events_of(&three, 2, a).await > in_three, "{}", ledger.log());
    three.assert_every_cell_exact().await;
}

/// The move routes' answer for move `id`.
async fn move_of(base: &str, id: &str) -> serde_json::Value {
    let (status, body) = call(
        base,
        Method::GET,
        &format!("/api/v1/admin/cells/moves/{id}"),
        &token(1, true),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Move `id` once it has ended, or as it stands after 30 s.
async fn move_ended(base: &str, id: &str) -> serde_json::Value {
    let mut end = move_of(base, id).await;
    for _ in 0..300 {
        if end["step"] == "DONE" || end["step"] == "CANCELLED" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        end = move_of(base, id).await;
    }
    end
}

#[tokio::test]
async fn cells_move_014_the_ledger_killed_after_every_steps_work_resumes_the_move_and_money_stays_exact(
) {
    let three = ThreeCells::start().await;
    let points = [
        "move_planned_done",
        "move_copying_done",
        "move_catching_up_done",
        "move_pausing_done",
        "move_moving_spot_done",
        "move_verifying_done",
        "move_switching_done",
    ];
    // Partitions of cell 1 with a user each, one per fail point, moved to cell 2 in turn.
    let mut users = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for u in 1.. {
        let p = partition_of(UserId::new(u).unwrap()).get();
        if p < 85 && seen.insert(p) {
            users.push((u, p));
        }
        if users.len() == points.len() {
            break;
        }
    }
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    for (u, _) in &users {
        deposit(&ledger.base, *u, "50").await;
        let (status, body) = transfer(&ledger.base, *u, "FUNDING", "SPOT", "20").await;
        assert_eq!(status, 200, "{body}");
    }
    drop(ledger);
    for (point, (u, p)) in points.iter().zip(&users) {
        let env = [
            ("LEDGER_FAILPOINT", *point),
            ("LEDGER_ALLOW_FAILPOINTS", "1"),
        ];
        let mut doomed = LedgerProcess::start_cells(&three.map, &env);
        let (status, started) = call(
            &doomed.base,
            Method::POST,
            "/api/v1/admin/cells/moves",
            &token(1, true),
            Some(serde_json::json!({"partition": p, "to": 2})),
        )
        .await;
        assert_eq!(status, 202, "{started}");
        let id = started["id"].as_str().unwrap().to_owned();
        let exit = doomed.wait_exit(std::time::Duration::from_secs(30));
        assert!(
            !exit.success(),
            "{point}: the process aborted: {}",
            doomed.log()
        );
        assert!(
            doomed.log().contains(&format!("fail point {point}")),
            "{}",
            doomed.log()
        );
        drop(doomed);

        // A new process resumes the move from its record.
        let ledger = LedgerProcess::start_cells(&three.map, &[]);
        let end = move_ended(&ledger.base, &id).await;
        assert_eq!(end["step"], "DONE", "{point}: {end}\n{}", ledger.log());
        three.assert_every_cell_exact().await;
        let (status, body) = transfer(&ledger.base, *u, "SPOT", "FUNDING", "5").await;
        assert_eq!(
            (status, &body["state"]),
            (200, &"COMMITTED".into()),
            "{point}: {body}"
        );
        assert!(
            events_of(&three, 1, *u).await > 0,
            "{point}: user {u} trades in cell 2"
        );
        let (_, balances) = call(
            &ledger.base,
            Method::GET,
            "/api/v1/balances",
            &token(*u, false),
            None,
        )
        .await;
        let usdt = &balances["balances"][0];
        assert_eq!(
            (usdt["funding"].as_str(), usdt["spot"].as_str()),
            (Some("35"), Some("15")),
            "{point}: nothing created, lost or applied twice: {balances}"
        );
        three.assert_every_cell_exact().await;
    }
}

#[tokio::test]
async fn cells_move_016_after_a_move_ledger_verify_passes_in_both_cells_and_names_the_sources_checkpoint(
) {
    use crate::tlog::key_file;
    use crate::tlog_cells::{checkpointed, verify_cell, TwoCells};
    let two = TwoCells::start().await;
    let key = key_file(two.dir.path());
    let key_text = key.to_str().unwrap().to_owned();
    let env = [
        ("LEDGER_LOG_SIGNING_KEY_FILE", key_text.as_str()),
        ("LEDGER_LOG_CHECKPOINT_EVENTS", "1"),
        ("LEDGER_LOG_CHECKPOINT_MS", "100"),
    ];
    let ledger = LedgerProcess::start_cells(&two.map, &env);
    let base = ledger.base.clone();
    let u = (1..)
        .find(|&u| partition_of(UserId::new(u).unwrap()).get() < 128)
        .unwrap();
    let p = partition_of(UserId::new(u).unwrap()).get();
    deposit(&base, u, "40").await;
    let (status, body) = transfer(&base, u, "FUNDING", "SPOT", "15").await;
    assert_eq!(status, 200, "{body}");
    checkpointed(&two.cells[0].0).await;
    let (ok, out) = cells_cli(&base, &["move", "--partition", &p.to_string(), "--to", "2"]);
    assert!(ok, "{out}");
    let (status, body) = transfer(&base, u, "SPOT", "FUNDING", "5").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &"COMMITTED".into()),
        "{body}"
    );
    for (cell, (db, _)) in two.cells.iter().enumerate() {
        checkpointed(db).await;
        let moved: serde_json::Value = sqlx::query_scalar(
            "SELECT payload::jsonb FROM events WHERE event_type = 'PartitionMoved'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert!(
            moved["PartitionMoved"]["source_checkpoint"]["size"].as_i64() > Some(0),
            "cell {}: {moved}",
            cell + 1
        );
        let (ok, out) = verify_cell(&two.map, &key, u16::try_from(cell + 1).unwrap(), &[]);
        assert!(ok, "cell {}: {out}", cell + 1);
        assert!(
            out.contains("moves and added cells held to their entries: 1"),
            "cell {}: {out}",
            cell + 1
        );
    }
    // FUNDING moved in with no move's entry (a forged switch total, which the conservation
    // check would count as moved money) is named by `ledger verify`.
    sqlx::query(
        "INSERT INTO partition_switches (move_id, direction, asset, partition, funding)
         VALUES ('forged', 'IN', 'USDT', 9, 1000)",
    )
    .execute(&two.cells[1].0.pool)
    .await
    .unwrap();
    let (ok, out) = verify_cell(&two.map, &key, 2, &[]);
    assert!(
        !ok && out.contains("move forged") && out.contains("behind the log's back"),
        "{out}"
    );
}

#[tokio::test]
async fn cells_move_017_two_moves_planned_on_one_map_both_reach_their_users() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.clone();
    // Two users of two partitions of cell 1, moved at once to cells 2 and 3.
    let mut users: Vec<(u64, u8)> = Vec::new();
    for u in 1.. {
        let p = partition_of(UserId::new(u).unwrap()).get();
        if p < 85 && users.iter().all(|(_, q)| *q != p) {
            users.push((u, p));
        }
        if users.len() == 2 {
            break;
        }
    }
    for (u, _) in &users {
        deposit(&base, *u, "20").await;
    }
    let mut ids = Vec::new();
    for ((_, p), to) in users.iter().zip([2, 3]) {
        let (status, body) = call(
            &base,
            Method::POST,
            "/api/v1/admin/cells/moves",
            &token(1, true),
            Some(serde_json::json!({"partition": p, "to": to})),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let end = move_ended(&base, id).await;
        assert_eq!(end["step"], "DONE", "{end}");
    }
    // Each switch took a version of its own (a front that reloaded after the first switch takes
    // the second as newer), and each user is served by their new cell.
    for cell in &three.cells {
        let version: i64 = sqlx::query_scalar("SELECT map_version FROM cell_identity")
            .fetch_one(&cell.db.pool)
            .await
            .unwrap();
        assert_eq!(version, 3, "cell {}: two switches, two versions", cell.id);
    }
    for ((u, _), cell) in users.iter().zip([1usize, 2]) {
        let (status, body) = transfer(&base, *u, "FUNDING", "SPOT", "5").await;
        assert_eq!(
            (status, &body["state"]),
            (200, &"COMMITTED".into()),
            "{body}"
        );
        assert!(
            events_of(&three, cell, *u).await > 0,
            "user {u} in cell {}",
            cell + 1
        );
    }
    three.assert_every_cell_exact().await;
}

#[tokio::test]
async fn cells_move_018_a_deposit_or_transfer_of_a_paused_partition_is_a_503_to_retry_never_a_500()
{
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.clone();
    let u = three.one_user_per_cell()[0];
    let p = partition_of(UserId::new(u).unwrap()).get();
    deposit(&base, u, "10").await;
    let pause = |state: &'static str| {
        let pool = three.cells[0].db.pool.clone();
        async move {
            sqlx::query(
                "UPDATE cell_partitions SET state = $2, move_id = CASE WHEN $2 = 'STEADY' THEN NULL ELSE 'm-test' END
                 WHERE partition = $1",
            )
            .bind(i16::from(p))
            .bind(state)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let http = reqwest::Client::new();
    for state in ["DRAINING", "FROZEN"] {
        pause(state).await;
        let deposit = http
            .post(format!("{base}/api/v1/admin/deposits"))
            .bearer_auth(token(1, true))
            .json(
                &serde_json::json!({"user_id": u, "asset": "USDT", "amount": "1",
                                      "external_id": format!("paused-{state}")}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(deposit.status(), 503, "{state}: a deposit");
        assert_eq!(deposit.headers()["retry-after"], "1");
        assert_eq!(deposit.headers()[edge::error::ROUTE_AGAIN], "map");
        let (status, body) = transfer(&base, u, "FUNDING", "SPOT", "1").await;
        assert_eq!(status, 503, "{state}: a new transfer: {body}");
    }
    pause("STEADY").await;
    let (status, body) = transfer(&base, u, "FUNDING", "SPOT", "1").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &"COMMITTED".into()),
        "{body}"
    );
    three.assert_every_cell_exact().await;
}
