//! The tamper-evident log's checkpoints on a JetStream stream of their own (issue 36,
//! `docs/adr/0016-tamper-evident-log.md`), on a real `nats-server -js` of the test's own and a
//! real `ledger serve --nats`: every checkpoint the follower signs is published there (never on
//! the event stream), the stream refuses a purge, and a tail cut in PostgreSQL and re-signed with
//! the real key (which the database alone cannot tell) is caught by `ledger verify --from-stream`
//! and reported by the publisher.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::Stack;
use crate::nats::NatsServer;
use crate::procs::LedgerProcess;
use crate::tlog::{exec, follow, key_file, ledger, signer, wait_checkpointed, ORIGIN};

/// Waits until the checkpoint stream's last checkpoint is of `size`; every note read back.
async fn published_up_to(url: &str, size: u64) -> Vec<relay::checkpoints::StreamNote> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let notes = relay::checkpoints::read_back(
            url,
            relay::checkpoints::CHECKPOINT_STREAM_DEFAULT,
            relay::checkpoints::CHECKPOINT_SUBJECT,
        )
        .await
        .unwrap_or_default();
        if notes.last().and_then(|n| n.size) == Some(size) {
            return notes;
        }
        assert!(
            Instant::now() < deadline,
            "the stream's checkpoints stayed at {:?} of {size}",
            notes.last().map(|n| n.size)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn tlog_checkpoints_on_their_own_stream_catch_a_cut_and_resigned_tail() {
    let s = Stack::start().await;
    let nats = NatsServer::start().await;
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let key_text = key.to_str().unwrap().to_owned();
    let env = [
        ("LEDGER_LOG_SIGNING_KEY_FILE", key_text.as_str()),
        ("LEDGER_LOG_CHECKPOINT_EVENTS", "3"),
        ("LEDGER_LOG_CHECKPOINT_MS", "100"),
        ("LEDGER_NATS_URL", url.as_str()),
    ];
    s.deposit(1, "USDT", "1000").await;
    let mut process = LedgerProcess::start(&s.db.url, &s.spot, &env);
    let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"});
    for _ in 0..4 {
        let answer = process.transfer(1, body.clone()).await;
        assert_eq!(answer["state"], "COMMITTED", "{answer}");
    }
    let size = wait_checkpointed(&s.db.pool).await;
    let notes = published_up_to(&url, size).await;

    // Every stored checkpoint is on the stream, in order, as signed, and nothing else is.
    let stored: Vec<(i64, String)> =
        sqlx::query_as("SELECT size, note FROM tlog_checkpoints ORDER BY size")
            .fetch_all(&s.db.pool)
            .await
            .unwrap();
    let on_stream: Vec<(i64, String)> = notes
        .iter()
        .map(|n| (n.size.unwrap() as i64, n.note.clone()))
        .collect();
    assert_eq!(on_stream, stored);
    let verifier = signer().verifier();
    for n in &notes {
        let body = verifier.open(&n.note).expect("signed by the log's key");
        assert!(body.starts_with(&format!("{ORIGIN}\n")), "{body}");
    }
    // Its own stream: the event stream holds events only, and the checkpoints cannot be purged.
    let js = nats.jetstream().await;
    let mut events = js.get_stream(relay::STREAM_DEFAULT).await.expect("events");
    let subjects = events.info().await.unwrap().config.subjects.clone();
    assert_eq!(subjects, [relay::message::stream_subjects()]);
    let checkpoints = js
        .get_stream(relay::checkpoints::CHECKPOINT_STREAM_DEFAULT)
        .await
        .expect("the checkpoint stream");
    assert!(
        checkpoints.purge().await.is_err(),
        "the stream refuses purges"
    );

    let db = &s.db.url;
    let (ok, out) = ledger(&["verify", "--from-stream", "--nats", &url], db, &key);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("{} checkpoints read back", notes.len())),
        "{out}"
    );

    // The tail cut and the tree rebuilt and re-signed with the real key, the ledger stopped.
    process.kill();
    let cut = size / 2;
    exec(
        &s.db.pool,
        &format!("DELETE FROM events WHERE feed_position > {cut}"),
    )
    .await;
    for sql in [
        "DELETE FROM tlog_tiles",
        "DELETE FROM tlog_checkpoints",
        "UPDATE tlog_state SET size = 0, edge = ''::bytea",
    ] {
        exec(&s.db.pool, sql).await;
    }
    follow(&s.db.pool).await;
    let (ok, out) = ledger(&["verify"], db, &key);
    assert!(ok, "the database alone agrees with itself again: {out}");
    let (ok, out) = ledger(&["verify", "--from-stream", "--nats", &url], db, &key);
    assert!(!ok, "{out}");
    assert!(out.contains("VERIFY FAILED at checkpoint of size"), "{out}");
    assert!(
        out.contains("(stream LEDGER_LOG_CHECKPOINTS sequence"),
        "{out}"
    );
    assert!(out.contains("its tail was cut"), "{out}");

    // Started again on the cut log, the publisher says so and publishes nothing over it.
    let process = LedgerProcess::start(&s.db.url, &s.spot, &env);
    process
        .wait_log("the log's tail was cut", Duration::from_secs(30))
        .await;
    let again = published_up_to(&url, size).await;
    assert_eq!(again.len(), notes.len(), "nothing published over the cut");
}
