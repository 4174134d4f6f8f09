//! `ledger cells plan` (ADR 0023) over three real cell databases: the database computes a
//! user's partition exactly as `cells::partition_of` does, and the plan reads each cell's users,
//! proposes moves that even the cells out, and executes none of them.

use cells::{partition_of, CellId};
use domain::UserId;
use serde_json::Value;

use crate::cells::ThreeCells;
use crate::helpers::{bin, TestDb};

#[tokio::test]
async fn cells_013_the_database_partitions_a_user_as_the_map_does() {
    let db = TestDb::new().await;
    let users: Vec<i64> = (1..=3_000).chain([i64::MAX, 4_294_967_296]).collect();
    let in_sql = adapters::pg::partitions::partitions_of(&db.pool, &users)
        .await
        .unwrap();
    for (user, got) in users.iter().zip(in_sql) {
        let id = UserId::new(u64::try_from(*user).unwrap()).unwrap();
        assert_eq!(got, partition_of(id).get(), "user {user}");
    }
}

#[tokio::test]
async fn cells_014_the_plan_evens_the_cells_users_out_and_moves_nothing() {
    let three = ThreeCells::start().await;
    // Thirty users of cell 1 hold FUNDING accounts; cells 2 and 3 hold none.
    let one = CellId::new(1).unwrap();
    let users: Vec<i64> = (1..)
        .filter(|&u| three.placement.cell_of(UserId::new(u).unwrap()) == one)
        .take(30)
        .map(|u| i64::try_from(u).unwrap())
        .collect();
    sqlx::query("INSERT INTO funding_accounts (user_id, asset) SELECT u, 'USDT' FROM unnest($1::bigint[]) u")
        .bind(&users)
        .execute(&three.cells[0].db.pool)
        .await
        .unwrap();
    let plan = || {
        let out = std::process::Command::new(bin("ledger"))
            .args(["cells", "plan", "--json"])
            .env("LEDGER_CELL_MAP", &three.map)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run ledger cells plan");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("the plan as JSON")
    };
    let first = plan();
    assert_eq!(first["by"], "users");
    assert_eq!(first["before"]["1"], 30, "{first}");
    assert_eq!(first["before"]["2"], 0, "{first}");
    let moves = first["moves"].as_array().unwrap();
    assert!(!moves.is_empty(), "{first}");
    assert!(moves.iter().all(|m| m["from"] == 1), "{first}");
    let after: Vec<u64> = ["1", "2", "3"]
        .iter()
        .map(|c| first["after"][c].as_u64().unwrap())
        .collect();
    assert_eq!(after.iter().sum::<u64>(), 30);
    let (max, min) = (after.iter().max().unwrap(), after.iter().min().unwrap());
    assert!(max - min < 30, "the plan narrows the gap: {first}");
    // Nothing was executed: the same weights, the same plan.
    assert_eq!(plan(), first);
    // Without a map there is nothing to plan.
    let out = std::process::Command::new(bin("ledger"))
        .args(["cells", "plan"])
        .env_remove("LEDGER_CELL_MAP")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a cell map"));
}
