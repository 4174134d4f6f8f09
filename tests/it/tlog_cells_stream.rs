//! The checkpoints of each cell on the JetStream checkpoint stream (issues 34 and 36, ADR 0016
//! "Cells"): one `ledger serve --nats` under a map of two cells (two databases, two spot-cores,
//! a real `nats-server -js` of the test's own) publishes each cell's signed checkpoints on the
//! cell's own subject of the one checkpoint stream (`ledger.log.checkpoints.cell.N`), each signed
//! by that cell's identity and equal to what the cell's database stores, and
//! `ledger verify --cell N --from-stream` checks each cell's log against its copies there; a
//! cell's copies never verify as another cell's.

use std::time::{Duration, Instant};

use cells::CellId;
use domain::UserId;
use serde_json::json;

use crate::helpers::{token, TestDb};
use crate::nats::NatsServer;
use crate::procs::LedgerProcess;
use crate::tlog::{key_file, signer, ORIGIN};
use crate::tlog_cells::{checkpointed, verify_cell, TwoCells};

/// Cell `db`'s stored checkpoints (size, note), once the newest covers its whole feed.
async fn stored_when_checkpointed(db: &TestDb) -> Vec<(i64, String)> {
    checkpointed(db).await;
    sqlx::query_as("SELECT size, note FROM tlog_checkpoints ORDER BY size")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

/// The cell's checkpoints read back from the stream, once its last is of `size`.
async fn published(url: &str, cell: u16, size: i64) -> Vec<(i64, String)> {
    let subject = relay::checkpoints::subject(Some(cell));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let notes = relay::checkpoints::read_back(
            url,
            relay::checkpoints::CHECKPOINT_STREAM_DEFAULT,
            &subject,
        )
        .await
        .unwrap_or_default();
        if notes.last().and_then(|n| n.size) == Some(size as u64) {
            return notes
                .into_iter()
                .map(|n| (n.size.unwrap() as i64, n.note))
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "cell {cell}'s checkpoints on the stream stayed at {:?} of {size}",
            notes.last().map(|n| n.size)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn tlog_each_cells_checkpoints_are_published_on_its_own_subject_and_verify_from_the_stream() {
    let nats = NatsServer::start().await;
    let url = nats.url();
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
        ("LEDGER_LOG_CHECKPOINT_EVENTS", "2"),
        ("LEDGER_LOG_CHECKPOINT_MS", "100"),
        ("LEDGER_NATS_URL", url.as_str()),
    ];
    let ledger = LedgerProcess::start_cells(&map, &env);

    // A user of each cell: a deposit and two transfers each (more in cell 2, so the two logs
    // differ in size).
    for cell in 1..=2u16 {
        let id = CellId::new(cell.into()).unwrap();
        let user = (1..)
            .find(|&u| placement.cell_of(UserId::new(u).unwrap()) == id)
            .unwrap();
        let deposit = reqwest::Client::new()
            .post(format!("{}/api/v1/admin/deposits", ledger.base))
            .bearer_auth(token(1, true))
            .json(&json!({"user_id": user, "asset": "USDT", "amount": "100",
                          "external_id": format!("tlog-cells-stream-{user}")}))
            .send()
            .await
            .expect("deposit request");
        assert_eq!(deposit.status(), 200);
        let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"});
        for _ in 0..usize::from(cell) * 2 {
            let answer = ledger.transfer(user, body.clone()).await;
            assert_eq!(answer["state"], "COMMITTED", "{answer}");
            assert_eq!(answer["log_cell"], json!(cell), "{answer}");
        }
    }

    for cell in 1..=2u16 {
        let stored = stored_when_checkpointed(&cells[usize::from(cell) - 1].0).await;
        let size = stored.last().unwrap().0;
        let on_stream = published(&url, cell, size).await;
        assert_eq!(
            on_stream, stored,
            "cell {cell}: the stream holds what it stores"
        );
        let identity = signer().for_cell(cell).unwrap();
        let other = signer().for_cell(3 - cell).unwrap();
        for (_, note) in &on_stream {
            let body = identity.verifier().open(note).expect("the cell's own key");
            assert!(
                body.starts_with(&format!("{ORIGIN}/cell/{cell}\n")),
                "{body}"
            );
            assert!(other.verifier().open(note).is_err(), "not the other cell's");
        }
        let (ok, out) = verify_cell(&map, &key, cell, &["--from-stream", "--nats", &url]);
        assert!(ok, "cell {cell}: {out}");
        assert!(
            out.contains(&format!("{} checkpoints read back", on_stream.len())),
            "cell {cell}: {out}"
        );
    }
    // The event streams are the cells' own, and the checkpoints are on none of them.
    let js = nats.jetstream().await;
    for cell in 1..=2u16 {
        let name = format!("{}_{cell}", relay::STREAM_DEFAULT);
        let mut events = js.get_stream(&name).await.expect("the cell's event stream");
        let subjects = events.info().await.unwrap().config.subjects.clone();
        assert!(
            subjects
                .iter()
                .all(|s| !s.starts_with(relay::checkpoints::CHECKPOINT_SUBJECT)),
            "{subjects:?}"
        );
    }
}
