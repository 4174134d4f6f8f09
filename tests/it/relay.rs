//! The JetStream relay (docs/adr/0005-relay.md) against a real `nats-server -js` and
//! real `ledger relay` processes: every event of the feed in the stream exactly once, in feed
//! order, checked message by message, across SIGKILLs of the relay, a killed NATS server, a
//! leader change, and a restart after the duplicate window has passed.

use std::time::{Duration, Instant};

use application::{Coordinator, NewTransfer};
use domain::{AccountType, Amount, AssetSymbol, Resolution, TransferState, UserId};

use crate::helpers::{bin, Stack};
use crate::nats::{assert_stream_equals_feed, stream_end, wait_until, NatsServer, RelayProcess};

const STREAM: &str = "LEDGER_EVENTS";

/// Users of the mixed load: 1..=4 commit, 5 fails (too little money), 6 compensates (its SPOT
/// account refuses deposits).
async fn prepare_users(s: &Stack) {
    for user in 1..=4 {
        s.deposit(user, "USDT", "1000000").await;
    }
    s.deposit(5, "USDT", "1").await;
    s.deposit(6, "USDT", "1000000").await;
    s.spot_adapter
        .set_status(
            UserId::new(6).unwrap(),
            &AssetSymbol::parse("USDT").unwrap(),
            adapters::AccountStatus::Disabled,
        )
        .await
        .unwrap();
}

/// `transfers` transfers by `workers` concurrent callers: 80 % commit, 10 % fail, 10 % roll
/// back after a refused deposit.
async fn run_load(coordinator: Coordinator, transfers: usize, workers: usize) {
    let mut tasks = Vec::new();
    for w in 0..workers {
        let c = coordinator.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..transfers).step_by(workers) {
                let (user, amount) = match i % 10 {
                    8 => (6, "1"),
                    9 => (5, "5"),
                    _ => (1 + (i % 4) as u64, "1"),
                };
                c.submit(NewTransfer {
                    user_id: UserId::new(user).unwrap(),
                    from: AccountType::Funding,
                    to: AccountType::Spot,
                    asset: domain::AssetSymbol::parse("USDT").unwrap(),
                    amount: Amount::parse(amount).unwrap(),
                    cid: None,
                })
                .await
                .expect("submit");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A stack with the users set up, the projector running (as `ledger serve` runs it), and a
/// NATS server.
async fn setup() -> (Stack, NatsServer, tokio::task::JoinHandle<()>) {
    let s = Stack::start().await;
    prepare_users(&s).await;
    let projector = tokio::spawn(projections::Projector::new(s.db.pool.clone()).run());
    let nats = NatsServer::start().await;
    (s, nats, projector)
}

async fn feed_head(s: &Stack) -> i64 {
    projections::feed::head(&s.db.pool).await.unwrap()
}

/// Runs `ledger tail` to completion and returns its lines.
fn tail(nats: &NatsServer, args: &[&str]) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(bin("ledger"))
        .args(["tail", "--nats", &nats.url()])
        .args(args)
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

fn positions(lines: &[serde_json::Value]) -> Vec<i64> {
    lines
        .iter()
        .map(|l| l["event"]["position"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn relay_publishes_every_event_of_a_mixed_load_once_in_feed_order() {
    let (mut s, nats, _projector) = setup().await;
    let _relay = RelayProcess::start(&s.db.url, &nats.url(), &[]);
    run_load(s.coordinator.clone(), 100, 4).await;

    // A manual resolution: the deposit's outcome is unknown (spot-core down), the operator
    // records NOT_APPLIED, the transfer is refunded.
    s.spot.kill();
    let t = s
        .transfer(1, AccountType::Funding, AccountType::Spot, "USDT", "2")
        .await;
    assert_eq!(t.state, TransferState::TargetPending);
    s.spot.restart();
    let resolved = s
        .coordinator
        .manually_resolve(&t.req_id, Resolution::NotApplied, "admin:1", "test", true)
        .await
        .expect("manual resolution");
    assert_eq!(resolved.data.state, TransferState::RolledBack);

    let js = nats.jetstream().await;
    let n = assert_stream_equals_feed(&s.db.pool, &js, STREAM).await;
    let events = crate::nats::whole_feed(&s.db.pool).await;
    for kind in [
        "ExternalDeposited",
        "TransferCommitted",
        "TransferFailed",
        "CompensationStarted",
        "TransferRolledBack",
        "TransferManuallyResolved",
    ] {
        assert!(
            events.iter().any(|e| e.event_type == kind),
            "the load made a {kind}"
        );
    }

    // Consumers: `ledger tail` prints the same events in the same order; a durable consumer
    // resumes after what it acknowledged; a feed position or a sequence is a starting point.
    let all = tail(&nats, &["--limit", &n.to_string()]);
    assert_eq!(positions(&all), (1..=n as i64).collect::<Vec<_>>());
    assert_eq!(all[0]["event"], projections::feed::event_json(&events[0]));
    let first = tail(&nats, &["--durable", "audit", "--limit", "5"]);
    let next = tail(&nats, &["--durable", "audit", "--limit", "5"]);
    assert_eq!(positions(&first), [1, 2, 3, 4, 5]);
    assert_eq!(positions(&next), [6, 7, 8, 9, 10]);
    let after = tail(&nats, &["--after-position", "20", "--limit", "2"]);
    assert_eq!(positions(&after), [21, 22]);
    let from = tail(&nats, &["--from-sequence", "30", "--limit", "1"]);
    assert_eq!(from[0]["stream_sequence"], 30);
    let one_user = tail(&nats, &["--subject", "ledger.events.*.5", "--limit", "3"]);
    assert!(one_user
        .iter()
        .all(|l| l["event"]["user_id"] == 5 && l["subject"].as_str().unwrap().ends_with(".5")));
}

#[tokio::test]
async fn relay_sigkilled_mid_batch_three_times_loses_and_duplicates_nothing() {
    let (s, nats, _projector) = setup().await;
    let js = nats.jetstream().await;
    let load = tokio::spawn(run_load(s.coordinator.clone(), 600, 6));
    for round in 1..=3 {
        // A backlog, so the relay is publishing a full window when it dies.
        let (_, before) = stream_end(&js, STREAM).await;
        wait_until(Duration::from_secs(30), "a backlog", || async {
            feed_head(&s).await >= before + 400 || load.is_finished()
        })
        .await;
        let mut relay = RelayProcess::start(&s.db.url, &nats.url(), &[]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while stream_end(&js, STREAM).await.1 <= before {
            assert!(
                Instant::now() < deadline,
                "round {round}: the relay published nothing"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        relay.kill();
        let (seq, position) = stream_end(&js, STREAM).await;
        let head = feed_head(&s).await;
        println!("round {round}: SIGKILL at stream sequence {seq} (position {position}), feed head {head}");
    }
    load.await.unwrap();
    let _relay = RelayProcess::start(&s.db.url, &nats.url(), &[]);
    assert_stream_equals_feed(&s.db.pool, &js, STREAM).await;
}

#[tokio::test]
async fn relay_resumes_after_the_nats_server_is_killed_and_restarted_during_the_load() {
    let (s, mut nats, _projector) = setup().await;
    let relay = RelayProcess::start(&s.db.url, &nats.url(), &[]);
    let load = tokio::spawn(run_load(s.coordinator.clone(), 400, 4));
    let js = nats.jetstream().await;
    wait_until(Duration::from_secs(30), "the relay to publish", || async {
        stream_end(&js, STREAM).await.1 > 100
    })
    .await;
    nats.kill();
    // The ledger keeps serving while NATS is down, and the relay notices (its unanswered acks
    // time out) and says so where `/metrics` reads it.
    let head = feed_head(&s).await;
    wait_until(
        Duration::from_secs(30),
        "transfers while NATS is down",
        || async { feed_head(&s).await >= head + 100 || load.is_finished() },
    )
    .await;
    wait_until(
        Duration::from_secs(20),
        "the relay to record its error",
        || async {
            let status = relay::status_of(&s.db.pool, STREAM).await.unwrap().unwrap();
            status.last_error.is_some()
        },
    )
    .await;
    nats.restart().await;
    load.await.unwrap();
    let js = nats.jetstream().await;
    assert_stream_equals_feed(&s.db.pool, &js, STREAM).await;
    println!(
        "relay log while NATS was down:\n{}",
        relay
            .log()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("resum"))
            .take(10)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn relay_two_processes_one_publishes_and_the_standby_takes_over_within_seconds() {
    let (s, nats, _projector) = setup().await;
    let mut a = RelayProcess::start(&s.db.url, &nats.url(), &[]);
    let mut b = RelayProcess::start(&s.db.url, &nats.url(), &[]);
    let load = tokio::spawn(run_load(s.coordinator.clone(), 400, 4));
    let js = nats.jetstream().await;
    wait_until(Duration::from_secs(30), "the relay to publish", || async {
        stream_end(&js, STREAM).await.1 > 200
    })
    .await;
    assert!(
        a.leads() != b.leads(),
        "exactly one relay leads:\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    let (leader, standby) = if a.leads() {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    let leader_pid = leader.pid;
    leader.kill();
    let killed = Instant::now();
    wait_until(
        Duration::from_secs(5),
        "the standby to take over",
        || async { standby.leads() },
    )
    .await;
    let takeover = killed.elapsed();
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT leader FROM relay_checkpoint WHERE stream = $1")
            .bind(STREAM)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    let recorded = recorded.unwrap_or_default();
    assert!(
        recorded.contains(&format!("-{}@", standby.pid))
            && !recorded.contains(&format!("-{leader_pid}@")),
        "{recorded}"
    );
    println!(
        "standby took over {} ms after the leader's SIGKILL",
        takeover.as_millis()
    );
    load.await.unwrap();
    assert_stream_equals_feed(&s.db.pool, &js, STREAM).await;
}

#[tokio::test]
async fn relay_started_after_the_duplicate_window_passed_publishes_nothing_twice() {
    let (s, nats, _projector) = setup().await;
    let window = ["--duplicate-window-ms", "1000"];
    let mut relay = RelayProcess::start(&s.db.url, &nats.url(), &window);
    run_load(s.coordinator.clone(), 60, 3).await;
    let js = nats.jetstream().await;
    let published = assert_stream_equals_feed(&s.db.pool, &js, STREAM).await;
    let info = js
        .get_stream(STREAM)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(info.config.duplicate_window, Duration::from_secs(1));
    relay.kill();
    // The worst checkpoint there can be (a crash before any was written, or a restored backup):
    // only the stream's own last position keeps the relay from publishing it all again.
    sqlx::query("UPDATE relay_checkpoint SET position = 0, stream_sequence = 0")
        .execute(&s.db.pool)
        .await
        .unwrap();
    // JetStream forgets message ids once the window has passed: let it pass, twice over.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let _relay = RelayProcess::start(&s.db.url, &nats.url(), &window);
    run_load(s.coordinator.clone(), 20, 2).await;
    let total = assert_stream_equals_feed(&s.db.pool, &js, STREAM).await;
    assert!(total > published, "the new events were relayed too");
}
