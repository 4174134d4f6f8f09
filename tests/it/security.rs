//! The availability attacks of the security review, each run for real against a `ledger serve`
//! process (or the in-process API where no CPU is at stake), each with a victim measured while
//! it runs: a GraphQL document whose fragments fan out exponentially, alias amplification, slow
//! clients (silent, trickled headers, trickled body, a huge declared body), streams that outlive
//! their token, a `crit` header and an everlasting token, and unbounded stream counts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::helpers::{ApiStack, Stack, JWT_SECRET};
use crate::procs::LedgerProcess;

/// What a victim must still get while an attack runs, on a quiet machine.
const VICTIM_LATENCY_MAX: Duration = Duration::from_secs(1);

/// How much slower than without the attack the victim's slowest answer may be on a busy one.
const VICTIM_SLOWDOWN_MAX: u32 = 4;

/// The victim's bound in this run: [`VICTIM_LATENCY_MAX`], or a few times its slowest answer
/// without the attack when a shared machine (the suite's other tests, a build) already makes it
/// slow. Starvation (an answer held until the attack stops, or a timeout) passes neither.
async fn victim_bound(base: &str) -> Duration {
    let unattacked = victim(base.to_owned(), 900, Duration::from_secs(2)).await;
    eprintln!("victim's slowest answer without an attack: {unattacked:?}");
    VICTIM_LATENCY_MAX.max(unattacked * VICTIM_SLOWDOWN_MAX)
}

fn token(user: u64, admin: bool, ttl: Duration) -> String {
    edge::mint(JWT_SECRET, domain::UserId::new(user).unwrap(), admin, ttl)
}

/// `fragment F0 on QueryRoot { __typename }`, `F{i} = { ...F{i-1} ...F{i-1} }`, `{ ...F{n} }`.
fn fan_out(n: usize) -> String {
    let mut q = String::from("{ ...F");
    q.push_str(&format!(
        "{n} }}\nfragment F0 on QueryRoot {{ __typename }}\n"
    ));
    for i in 1..=n {
        q.push_str(&format!(
            "fragment F{i} on QueryRoot {{ ...F{p} ...F{p} }}\n",
            p = i - 1
        ));
    }
    q
}

async fn gql(http: &reqwest::Client, base: &str, token: &str, query: &str) -> (u16, Value) {
    let resp = http
        .post(format!("{base}/graphql"))
        .bearer_auth(token)
        .json(&json!({ "query": query }))
        .send()
        .await
        .expect("graphql answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A victim: user `user` (funded) alternates `/healthz` and a 1-unit transfer for `duration`,
/// and returns the slowest answer seen. Every answer must be a success.
async fn victim(base: String, user: u64, duration: Duration) -> Duration {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let user_token = token(user, false, Duration::from_secs(600));
    let end = Instant::now() + duration;
    let mut slowest = Duration::ZERO;
    let mut turn = 0u64;
    while Instant::now() < end {
        let start = Instant::now();
        let status = if turn.is_multiple_of(2) {
            http.get(format!("{base}/healthz")).send().await
        } else {
            let (from, to) = if turn % 4 == 1 {
                ("FUNDING", "SPOT")
            } else {
                ("SPOT", "FUNDING")
            };
            http.post(format!("{base}/api/v1/internal_transfer"))
                .bearer_auth(&user_token)
                .json(&json!({"from": from, "to": to, "asset": "USDT", "amount": "1"}))
                .send()
                .await
        }
        .map(|r| r.status().as_u16());
        slowest = slowest.max(start.elapsed());
        assert_eq!(status.ok(), Some(200), "victim request {turn} failed");
        turn += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(turn >= 4, "the victim got too few turns: {turn}");
    slowest
}

/// A `ledger serve` with a funded victim (user 900).
async fn served(env: &[(&str, &str)]) -> (Stack, LedgerProcess) {
    let stack = Stack::start().await;
    stack.deposit(900, "USDT", "1000").await;
    let ledger = LedgerProcess::start(&stack.db.url, &stack.spot, env);
    (stack, ledger)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atk_graphql_fragment_fan_out_is_refused_at_once_while_others_are_served() {
    let (_stack, mut ledger) = served(&[]).await;
    let base = ledger.base.clone();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let attacker = token(901, false, Duration::from_secs(600));

    // One request alone: refused as too big, fast, with the contract's code.
    let start = Instant::now();
    let (status, body) = gql(&http, &base, &attacker, &fan_out(29)).await;
    assert!(
        start.elapsed() < VICTIM_LATENCY_MAX,
        "{:?}",
        start.elapsed()
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );
    // The same shape on `Transfer` inside a page, which used to be refused only after the walk.
    let nested = fan_out(24).replace("on QueryRoot", "on Transfer").replace(
        "{ ...F24 }",
        "{ transfers(first: 100) { nodes { ...F24 } } }",
    );
    let (_, body) = gql(&http, &base, &attacker, &nested).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );

    let bound = victim_bound(&base).await;
    // Four attackers sending n = 24 and n = 29 in a loop while the victim works.
    let attacks: Vec<_> = (0..4)
        .map(|i| {
            let (http, base, attacker) = (http.clone(), base.clone(), attacker.clone());
            let doc = fan_out(if i % 2 == 0 { 24 } else { 29 });
            tokio::spawn(async move {
                loop {
                    let (_, body) = gql(&http, &base, &attacker, &doc).await;
                    assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_REQUEST");
                }
            })
        })
        .collect();
    let slowest = victim(base.clone(), 900, Duration::from_secs(3)).await;
    eprintln!("victim's slowest answer under the fan-out attack: {slowest:?}");
    assert!(
        slowest < bound,
        "victim waited {slowest:?} (bound {bound:?})"
    );
    for attack in &attacks {
        assert!(
            !attack.is_finished(),
            "an attacker saw something else than a refusal"
        );
    }

    for attack in attacks {
        attack.abort();
    }

    // SIGTERM stops the process while a request is in flight (an open event stream).
    let admin = token(1, true, Duration::from_secs(600));
    let stream = http
        .get(format!("{base}/api/v1/events/stream"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    ledger.terminate();
    let status = tokio::task::spawn_blocking(move || {
        let status = ledger.wait_exit(Duration::from_secs(20));
        (status, ledger)
    })
    .await
    .unwrap()
    .0;
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atk_graphql_alias_amplification_cannot_starve_another_users_transfer() {
    let (_stack, ledger) = served(&[]).await;
    let base = ledger.base.clone();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let attacker = token(902, false, Duration::from_secs(600));

    // The review's document: 700 aliases of `balances`, refused before it runs anything.
    let aliases: String = (0..700)
        .map(|i| format!("a{i}:balances{{asset}} "))
        .collect();
    let wide = format!("{{{aliases}}}");
    let (_, body) = gql(&http, &base, &attacker, &wide).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );
    let eleven: String = (0..11)
        .map(|i| format!("a{i}:balances{{asset}} "))
        .collect();
    let (_, body) = gql(&http, &base, &attacker, &format!("{{{eleven}}}")).await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("root fields"),
        "{body}"
    );
    // Through variables of cost: too many I/O fields inside one page is refused as complex.
    let heavy = "{ transfers(first: 100) { nodes { events { sequence } } } }";
    let (_, body) = gql(&http, &base, &attacker, heavy).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );

    // The most a request may ask (10 root fields that each query the database and spot-core),
    // from four threads without pause, while another user transfers.
    let widest_allowed: String = (0..10)
        .map(|i| format!("a{i}: balances {{ asset funding spot inFlight }} "))
        .collect();
    let widest_allowed = format!("{{ {widest_allowed} }}");
    let (_, body) = gql(&http, &base, &attacker, &widest_allowed).await;
    assert!(body.get("errors").is_none(), "{body}");
    let bound = victim_bound(&base).await;
    let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let attacks: Vec<_> = (0..4)
        .map(|_| {
            let (http, base, attacker) = (http.clone(), base.clone(), attacker.clone());
            let (doc, answered) = (widest_allowed.clone(), answered.clone());
            tokio::spawn(async move {
                loop {
                    gql(&http, &base, &attacker, &doc).await;
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    let slowest = victim(base.clone(), 900, Duration::from_secs(4)).await;
    let attack_requests = answered.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "victim's slowest answer under alias amplification: {slowest:?} ({attack_requests} attack requests answered)"
    );
    assert!(attack_requests > 0, "the attack ran");
    assert!(
        slowest < bound,
        "victim waited {slowest:?} (bound {bound:?})"
    );
    for attack in attacks {
        attack.abort();
    }
}

/// A connection to `addr` from `127.0.0.2`: another address than the victim's.
async fn connect_from_elsewhere(addr: &str) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind("127.0.0.2:0".parse().unwrap())?;
    socket.connect(addr.parse().unwrap()).await
}

/// Open descriptors of a process.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Accepted connections the server still holds on `port` (ESTABLISHED or CLOSE_WAIT sockets
/// whose local port is the server's): each is a descriptor of the server's.
fn held_connections(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && matches!(fields.get(3), Some(&"01") | Some(&"08"))
        })
        .count()
}

/// Whether the server has closed `conn` (EOF, reset, or a refused write) within `within`,
/// reading away whatever it answered first.
async fn closed_by_server(conn: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atk_slow_clients_cannot_hold_connections_descriptors_or_the_server() {
    let (_stack, ledger) = served(&[
        ("LEDGER_HTTP_HEADER_TIMEOUT_MS", "1000"),
        ("LEDGER_HTTP_REQUEST_TIMEOUT_MS", "2000"),
        ("LEDGER_HTTP_CONNECTIONS_PER_ADDRESS_MAX", "64"),
    ])
    .await;
    let base = ledger.base.clone();
    let addr = base.trim_start_matches("http://").to_owned();
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    let bound = victim_bound(&base).await;
    let fds_before = open_fds(ledger.pid());
    let user_token = token(903, false, Duration::from_secs(600));

    // 150 connections from one address: silent ones, ones trickling header lines, ones
    // trickling a body. Past the per-address cap they are closed at once.
    let mut conns = Vec::new();
    for i in 0..150 {
        let mut conn = connect_from_elsewhere(&addr).await.expect("connect");
        match i % 3 {
            0 => {}
            1 => {
                let _ = conn
                    .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    .await;
            }
            _ => {
                let head = format!(
                    "POST /api/v1/internal_transfer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {user_token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
                );
                let _ = conn.write_all(head.as_bytes()).await;
            }
        }
        conns.push(conn);
    }
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        // Keep trickling a byte a connection every 200 ms, as a slow-loris client does.
        for _ in 0..25 {
            for conn in &mut conns {
                let _ = conn.write_all(b"X").await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        conns
    });
    let (fds_during, held_during) = {
        tokio::time::sleep(Duration::from_millis(300)).await;
        (open_fds(ledger.pid()), held_connections(port))
    };
    let slowest = victim(base.clone(), 900, Duration::from_secs(2)).await;
    eprintln!(
        "slow clients: victim's slowest {slowest:?}; descriptors {fds_before} before, {fds_during} during; {held_during} connections held"
    );
    assert!(
        slowest < bound,
        "victim waited {slowest:?} (bound {bound:?})"
    );
    // The per-address cap (64), plus the victim's own connection.
    assert!(
        held_during <= 64 + 2,
        "the server held {held_during} connections, past the per-address cap"
    );

    // Every one of them is closed by the server: at the header timeout (1 s) or the request
    // timeout (2 s), trickling or not.
    let mut conns = trickle.await.unwrap();
    let left = Duration::from_secs(6).saturating_sub(started.elapsed());
    for (i, conn) in conns.iter_mut().enumerate() {
        assert!(
            closed_by_server(conn, left.max(Duration::from_millis(500))).await,
            "connection {i} still open {:?} after it started",
            started.elapsed()
        );
    }
    drop(conns);
    // Every descriptor of theirs is given back (the database and spot-core pools may have grown
    // meanwhile, so the server's accepted sockets are what is counted).
    let deadline = Instant::now() + Duration::from_secs(5);
    while held_connections(port) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(held_connections(port), 0, "connections were given back");

    // A body declared far over the limit is refused before any of it is sent.
    let mut conn = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /api/v1/internal_transfer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {user_token}\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(VICTIM_LATENCY_MAX, conn.read(&mut answer))
        .await
        .expect("refused at once")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("BAD_REQUEST"), "{answer}");
}

async fn ws_connect(
    base: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>> {
    let url = format!("{}/graphql/ws", base.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    tokio_tungstenite::connect_async(request).await.unwrap().0
}

async fn next_json(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
) -> Value {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a message in time")
            .expect("still open")
            .expect("a frame");
        if let Message::Text(text) = msg {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

#[tokio::test]
async fn atk_streams_close_when_their_token_expires_and_one_bearer_parser_serves_all() {
    let api = ApiStack::start().await;
    api.stack.deposit(31, "USDT", "10").await;

    // The websocket takes `bearer` in any case, like REST, and closes at the token's expiry.
    let mut ws = ws_connect(&api.base).await;
    let short = token(31, false, Duration::from_secs(3));
    let opened = Instant::now();
    ws.send(Message::text(
        json!({"type": "connection_init", "payload": {"Authorization": format!("bearer {short}")}})
            .to_string(),
    ))
    .await
    .unwrap();
    assert_eq!(next_json(&mut ws).await["type"], "connection_ack");
    ws.send(Message::text(
        json!({"id": "1", "type": "subscribe",
               "payload": {"query": "subscription { transferUpdates(after: 0) { reqId state } }"}})
        .to_string(),
    ))
    .await
    .unwrap();
    api.stack
        .transfer(
            31,
            domain::AccountType::Funding,
            domain::AccountType::Spot,
            "USDT",
            "1",
        )
        .await;
    assert_eq!(
        next_json(&mut ws).await["type"],
        "next",
        "updates flow while the token is valid"
    );
    let closed = tokio::time::timeout(Duration::from_secs(8), async {
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Close(_) = msg {
                break;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the websocket outlived its token");
    assert!(
        opened.elapsed() >= Duration::from_secs(1),
        "closed too early"
    );

    // The SSE feed ends at its admin token's expiry.
    let admin = token(1, true, Duration::from_secs(2));
    let mut stream = api
        .http
        .get(format!("{}/api/v1/events/stream?after=0", api.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let ended = tokio::time::timeout(Duration::from_secs(8), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the event stream outlived its token");
}

#[tokio::test]
async fn atk_crit_headers_and_everlasting_tokens_are_unauthorized() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let api = ApiStack::start().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let sign = |header: &str, claims: Value| {
        let message = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET),
            jsonwebtoken::Algorithm::HS256,
        )
        .unwrap();
        format!("{message}.{signature}")
    };
    let plain = r#"{"alg":"HS256","typ":"JWT"}"#;
    let crit = r#"{"alg":"HS256","typ":"JWT","crit":["x-bound-to"],"x-bound-to":"device-1"}"#;
    let fine = sign(plain, json!({"sub": "7", "exp": now + 600}));
    let (status, _) = api
        .call(reqwest::Method::GET, "/api/v1/balances", Some(&fine), None)
        .await;
    assert_eq!(status, 200, "the same token without crit is fine");
    for bad in [
        sign(crit, json!({"sub": "7", "exp": now + 600})),
        sign(plain, json!({"sub": "7", "exp": u64::MAX})),
        sign(plain, json!({"sub": "7", "exp": now + 400 * 24 * 3600})),
    ] {
        let (status, body) = api
            .call(reqwest::Method::GET, "/api/v1/balances", Some(&bad), None)
            .await;
        assert_eq!((status, body["code"].as_str()), (401, Some("UNAUTHORIZED")));
    }
}

#[tokio::test]
async fn atk_subscriptions_and_event_streams_are_capped() {
    let api = ApiStack::start().await;
    let mut ws = ws_connect(&api.base).await;
    let user = token(41, false, Duration::from_secs(600));
    ws.send(Message::text(
        json!({"type": "connection_init", "payload": {"token": user}}).to_string(),
    ))
    .await
    .unwrap();
    assert_eq!(next_json(&mut ws).await["type"], "connection_ack");
    let cap = edge::admission::SUBSCRIPTIONS_PER_USER_MAX;
    for id in 0..=cap {
        ws.send(Message::text(
            json!({"id": id.to_string(), "type": "subscribe",
                   "payload": {"query": "subscription { transferUpdates { reqId } }"}})
            .to_string(),
        ))
        .await
        .unwrap();
    }
    // The one over the cap is refused with the contract's code (as an `error`, or as a `next`
    // carrying errors, depending on the protocol's reading); the others stay open and silent.
    // Which one is over the cap depends on the order the server starts them in.
    let refused = next_json(&mut ws).await;
    let errors = if refused["type"] == "error" {
        &refused["payload"]
    } else {
        &refused["payload"]["errors"]
    };
    assert_eq!(
        errors[0]["extensions"]["code"], "RATE_LIMIT_EXCEEDED",
        "{refused}"
    );

    let admin = token(1, true, Duration::from_secs(600));
    let mut streams = Vec::new();
    for _ in 0..edge::admission::EVENT_STREAMS_MAX {
        let s = api
            .http
            .get(format!("{}/api/v1/events/stream", api.base))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(s.status(), 200);
        streams.push(s);
    }
    let (status, body) = api
        .call(
            reqwest::Method::GET,
            "/api/v1/events/stream",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("RATE_LIMIT_EXCEEDED"))
    );
    drop(streams);
}
