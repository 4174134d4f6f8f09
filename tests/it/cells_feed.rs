//! The feed and the relay per cell (ADR 0017 §8) with real parts: three cells (three databases,
//! three spot-cores) behind one `ledger serve` under a cell map. Each cell's feed is dense and
//! gap-free on its own; the admin's HTTP feed and its SSE twin page every cell's events exactly
//! once, each naming its cell, with a cursor of one position per cell; and with `--nats` (a
//! private `nats-server -js`) each cell's feed lands in its own stream `LEDGER_EVENTS_<cell>`,
//! exactly once and in feed order, across a SIGKILL of the ledger mid-load; `ledger tail` under
//! the map reads every cell's stream.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cells::CellId;
use domain::UserId;
use reqwest::Method;
use serde_json::{json, Value};

use crate::cells::{call, deposit, transfer, ThreeCells};
use crate::helpers::{bin, token};
use crate::nats::{assert_stream_equals_cell_feed, whole_feed, NatsServer};
use crate::procs::LedgerProcess;

/// The first `n` users (by id) of each cell, in cell order.
fn users_per_cell(three: &ThreeCells, n: usize) -> Vec<Vec<u64>> {
    (1..=3u64)
        .map(|cell| {
            let cell = CellId::new(cell).unwrap();
            (1..)
                .filter(|&u| three.placement.cell_of(UserId::new(u).unwrap()) == cell)
                .take(n)
                .collect()
        })
        .collect()
}

/// A deposit and `rounds` transfers each way for every user: events in every cell.
async fn load(base: &str, users: &[Vec<u64>], rounds: usize) {
    for &user in users.iter().flatten() {
        deposit(base, user, "1000").await;
    }
    for _ in 0..rounds {
        for &user in users.iter().flatten() {
            for (from, to) in [("FUNDING", "SPOT"), ("SPOT", "FUNDING")] {
                let (status, body) = transfer(base, user, from, to, "1").await;
                assert_eq!(
                    (status, body["state"].clone()),
                    (200, json!("COMMITTED")),
                    "{body}"
                );
            }
        }
    }
}

/// Every cell's whole feed from its own database: `(position, event_id)` in order.
async fn cell_feeds(three: &ThreeCells) -> BTreeMap<u16, Vec<(i64, String)>> {
    let mut out = BTreeMap::new();
    for cell in &three.cells {
        let events = whole_feed(&cell.db.pool).await;
        out.insert(
            cell.id,
            events
                .into_iter()
                .map(|e| (e.position, e.event_id))
                .collect(),
        );
    }
    out
}

#[tokio::test]
async fn cells_011_each_cells_feed_is_dense_and_the_merged_feed_gives_every_event_once() {
    let three = ThreeCells::start().await;
    let ledger = LedgerProcess::start_cells(&three.map, &[]);
    let base = ledger.base.as_str();
    let users = users_per_cell(&three, 2);
    load(base, &users, 2).await;
    let admin = token(1, true);

    // Each cell's own feed is dense: positions 1..=n, nothing missing, nothing twice.
    let feeds = cell_feeds(&three).await;
    for (cell, events) in &feeds {
        let positions: Vec<i64> = events.iter().map(|(p, _)| *p).collect();
        let dense: Vec<i64> = (1..=positions.len() as i64).collect();
        assert_eq!(positions, dense, "cell {cell}'s feed is dense");
        assert!(!events.is_empty(), "cell {cell} has events");
        // Each user's deposit is one event of its own cell's feed (and log), none of another's.
        let deposits = events
            .iter()
            .filter(|(_, id)| id.starts_with("Deposit:"))
            .count();
        assert_eq!(
            deposits,
            users[usize::from(*cell) - 1].len(),
            "cell {cell}'s deposits"
        );
    }

    // Paging the merged feed by its cursor gives each cell's events once, in its order.
    let mut cursor = String::new();
    let mut seen: BTreeMap<u16, Vec<(i64, String)>> = BTreeMap::new();
    let mut last_head;
    loop {
        let path = format!("/api/v1/events?after={cursor}&limit=7");
        let (status, page) = call(base, Method::GET, &path, &admin, None).await;
        assert_eq!(status, 200, "{page}");
        assert!(page.get("partial").is_none(), "{page}");
        let events = page["events"].as_array().unwrap();
        assert!(events.len() <= 7);
        for e in events {
            let cell =
                u16::try_from(e["cell"].as_u64().expect("each event names its cell")).unwrap();
            if let Some(user) = e["user_id"].as_u64() {
                let home = three.placement.cell_of(UserId::new(user).unwrap());
                assert_eq!(home.get(), cell, "user {user}'s event in its cell: {e}");
            }
            seen.entry(cell).or_default().push((
                e["position"].as_i64().unwrap(),
                e["event_id"].as_str().unwrap().to_owned(),
            ));
        }
        last_head = page["head"].as_str().unwrap().to_owned();
        let next = page["next_after"].as_str().unwrap().to_owned();
        if events.is_empty() {
            assert_eq!(next, cursor, "an empty page leaves the cursor where it was");
            break;
        }
        cursor = next;
    }
    assert_eq!(
        seen, feeds,
        "the merged feed is every cell's feed, each in order"
    );
    let head: Vec<String> = feeds
        .iter()
        .map(|(cell, events)| format!("{cell}:{}", events.len()))
        .collect();
    assert_eq!(last_head, head.join(","));
    assert_eq!(
        cursor,
        head.join(","),
        "the last cursor is every cell's head"
    );

    // A cursor that is not one of this map's is refused; a user still cannot read the feed.
    for bad in ["5", "9:1", "1:1,1:2", "2:-1"] {
        let (status, body) = call(
            base,
            Method::GET,
            &format!("/api/v1/events?after={bad}"),
            &admin,
            None,
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _) = call(
        base,
        Method::GET,
        "/api/v1/events",
        &token(users[0][0], false),
        None,
    )
    .await;
    assert_eq!(status, 403);

    // The SSE twin: from a cursor two events short of cell 2's head, it sends exactly those
    // two (each `id` the whole cursor after it), then cell 3's next event as it is appended.
    let n2 = feeds[&2].len();
    let start = format!("1:{},2:{},3:{}", feeds[&1].len(), n2 - 2, feeds[&3].len());
    let mut resp = reqwest::Client::new()
        .get(format!("{base}/api/v1/events/stream?after={start}"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    let want = format!("id: 1:{},2:{n2},3:{}", feeds[&1].len(), feeds[&3].len());
    read_sse_until(&mut resp, &mut text, &want).await;
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert_eq!(ids.len(), 2, "{text}");
    assert!(text.contains("\"cell\":2"), "{text}");
    let (status, body) = transfer(base, users[2][0], "FUNDING", "SPOT", "1").await;
    assert_eq!(status, 200, "{body}");
    let want = format!("id: 1:{},2:{n2},3:{}", feeds[&1].len(), feeds[&3].len() + 1);
    read_sse_until(&mut resp, &mut text, &want).await;
    drop(resp);

    // Not following: from the same cursor, every cell's events up to its head as the stream
    // found it (cell 2's last two, cell 3's new transfer), then the stream ends by itself.
    three.assert_every_cell_exact().await;
    let (status, page) = call(base, Method::GET, "/api/v1/events?limit=1", &admin, None).await;
    assert_eq!(status, 200, "{page}");
    let heads = page["head"].as_str().unwrap().to_owned();
    let n3 = i64::try_from(feeds[&3].len()).unwrap();
    let new_in_3: i64 = heads
        .split(',')
        .find_map(|part| part.strip_prefix("3:"))
        .and_then(|p| p.parse::<i64>().ok())
        .map(|head| head - n3)
        .expect("cell 3's head");
    let resp = reqwest::Client::new()
        .get(format!(
            "{base}/api/v1/events/stream?after={start}&follow=false"
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(20), resp.text())
        .await
        .expect("a stream that does not follow ends at the heads")
        .unwrap();
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert_eq!(ids.len(), usize::try_from(2 + new_in_3).unwrap(), "{text}");
    assert_eq!(ids.last().copied(), Some(heads.as_str()), "{text}");
}

/// Reads the SSE body until `text` holds `needle` (bounded).
async fn read_sse_until(resp: &mut reqwest::Response, text: &mut String, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text.contains(needle) {
        let chunk = tokio::time::timeout_at(deadline.into(), resp.chunk())
            .await
            .unwrap_or_else(|_| panic!("no `{needle}` in time: {text}"))
            .unwrap()
            .expect("the stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// Runs `ledger tail` under the map to completion and returns its lines.
fn tail(map: &std::path::Path, nats: &NatsServer, args: &[&str]) -> Vec<Value> {
    let out = std::process::Command::new(bin("ledger"))
        .args(["tail", "--nats", &nats.url()])
        .args(args)
        .env("LEDGER_CELL_MAP", map)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run ledger tail");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[tokio::test]
async fn cells_012_the_relay_publishes_each_cells_feed_to_its_own_stream_exactly_once() {
    let three = ThreeCells::start().await;
    let nats = NatsServer::start().await;
    let url = nats.url();
    let env = [("LEDGER_NATS_URL", url.as_str())];
    let mut ledger = LedgerProcess::start_cells(&three.map, &env);
    let users = users_per_cell(&three, 2);
    load(&ledger.base, &users, 2).await;
    // SIGKILL the ledger (and so every cell's relay) while it publishes; a new one resumes each
    // cell's stream from the stream's end and its checkpoint.
    ledger.kill();
    let ledger = LedgerProcess::start_cells(&three.map, &env);
    load(&ledger.base, &users, 1).await;

    let js = nats.jetstream().await;
    let mut total = 0;
    for cell in &three.cells {
        let stream = format!("LEDGER_EVENTS_{}", cell.id);
        total += assert_stream_equals_cell_feed(&cell.db.pool, &js, &stream, Some(cell.id)).await;
    }
    // No stream under today's one-cell name: every event went to its cell's stream.
    assert!(js.get_stream("LEDGER_EVENTS").await.is_err());

    // `ledger tail` under the map reads every cell's stream: each cell's positions in order,
    // all of them once.
    let lines = tail(&three.map, &nats, &["--limit", &total.to_string()]);
    assert_eq!(lines.len(), total);
    let mut per_cell: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for l in &lines {
        let cell = l["event"]["cell"]
            .as_u64()
            .expect("the event names its cell");
        per_cell
            .entry(cell)
            .or_default()
            .push(l["event"]["position"].as_i64().unwrap());
    }
    let feeds = cell_feeds(&three).await;
    for (cell, events) in &feeds {
        let want: Vec<i64> = events.iter().map(|(p, _)| *p).collect();
        assert_eq!(per_cell[&u64::from(*cell)], want, "cell {cell}");
    }
    // From a cursor: only what lies after it in each cell.
    let after = format!("1:{},3:{}", feeds[&1].len(), feeds[&3].len() - 1);
    let rest = feeds[&2].len() + 1;
    let lines = tail(
        &three.map,
        &nats,
        &["--after-cursor", &after, "--limit", &rest.to_string()],
    );
    let cells_of: Vec<u64> = lines
        .iter()
        .map(|l| l["event"]["cell"].as_u64().unwrap())
        .collect();
    assert_eq!(
        cells_of.iter().filter(|c| **c == 2).count(),
        feeds[&2].len()
    );
    assert_eq!(cells_of.iter().filter(|c| **c == 3).count(), 1);
    three.assert_every_cell_exact().await;
}
