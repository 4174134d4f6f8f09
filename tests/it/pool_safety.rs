//! A `begin()` cancelled while its BEGIN is in flight must not leave a pooled connection inside a
//! transaction (sqlx 0.8 returns it to the pool that way, issue #4393). If it did, the next
//! "autocommit" statement on it would answer OK and never commit: a write the caller believes
//! durable would vanish when the connection closes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_left_inside_a_transaction_is_never_handed_out() {
    let db = TestDb::new().await;
    // One connection, so the next borrower gets the very connection left inside the block.
    let pool = schema::connect(&db.url, 1).await.unwrap();
    let watcher = schema::connect(&db.url, 1).await.unwrap();
    sqlx::query("CREATE TABLE cancelled_begin (v int)")
        .execute(&pool)
        .await
        .unwrap();
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    // A clean connection passes the check and is handed out again, not replaced.
    let again: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(again, backend, "a clean pooled connection is kept");

    // Put the pool's connection inside a transaction block without sqlx knowing, the state a
    // `begin()` cancelled while its BEGIN is in flight leaves (that window is microseconds wide,
    // too narrow to hit on purpose): a BEGIN sent as plain SQL, and the connection given back.
    {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let state: Option<String> =
        sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
            .bind(backend)
            .fetch_optional(&watcher)
            .await
            .unwrap();
    assert_eq!(
        state.as_deref(),
        Some("idle in transaction"),
        "the pool took back a connection inside a transaction block"
    );

    // The next autocommit write through the pool is committed: another session sees it.
    sqlx::query("INSERT INTO cancelled_begin VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM cancelled_begin")
        .fetch_one(&watcher)
        .await
        .unwrap();
    assert_eq!(seen, 1, "a write through the pool was left uncommitted");
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&watcher)
    .await
    .unwrap();
    assert_eq!(open, 0, "no session is left inside a transaction");
}

/// A server that accepts the connection and never answers (what a starting ledger meets behind
/// a forwarder whose far side vanished, or a blackholed server: its SSLRequest is never
/// answered). Found by the chaos run with network faults, where a restarted `ledger serve` waited
/// on such a connection for 37 minutes, never serving and never exiting. Creating the database
/// and connecting the pool now end with an error within their bounds, so the process exits and
/// its supervisor starts it again.
#[tokio::test]
async fn cra_a_server_that_accepts_and_never_answers_fails_startup_within_a_bound() {
    // The kernel completes the handshake from the backlog; nothing ever reads or answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/ledger?sslmode=disable",
        silent.local_addr().unwrap().port()
    );
    let started = std::time::Instant::now();
    let ensured = tokio::time::timeout(Duration::from_secs(60), schema::ensure_database(&url))
        .await
        .expect("creating the database must not wait forever");
    let err = ensured.expect_err("nothing answered");
    assert!(err.to_string().contains("did not answer"), "{err:#}");
    assert!(
        started.elapsed() < schema::ENSURE_DATABASE_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    let started = std::time::Instant::now();
    let pooled = tokio::time::timeout(Duration::from_secs(60), schema::connect(&url, 2))
        .await
        .expect("connecting the pool must not wait forever");
    assert!(pooled.is_err(), "nothing answered");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

/// Every connection a ledger makes to PostgreSQL has its liveness settings on its socket before
/// it sends its first query: the pool's, and those made outside it (creating the database at
/// startup, the failover watcher's probe, the relay's leadership). A connection left with the
/// system's defaults outlives a vanished server by about 15 minutes when a query's answer is
/// lost, and by hours when idle. Found by the chaos run with network faults
/// (`chaos 100000 1000 --pg-restarts 20 --net-faults 300 --pg-failovers 5`): twice a PostgreSQL
/// fault left a connection established past the 30 s bound. A ledger started just before the
/// fault was inside `ensure_database`, whose connection was never tuned, so it waited out its
/// 30 s statement bound instead of the 10 s user timeout.
///
/// Two forwarders in this process, both to the test server, stand for a failover pair's hosts;
/// each one reads the client's side of the protocol and, at every connection's first query,
/// reads that connection's socket options back from the kernel (the client's socket is in this
/// process too).
#[tokio::test]
async fn fnd_004_every_database_connection_is_tuned_before_its_first_query() {
    let liveness = schema::DbLiveness {
        tcp: liveness::TcpLiveness {
            keepalive: Duration::from_secs(7),
            user_timeout: Duration::from_millis(9_500),
        },
        idle_in_transaction: Duration::from_secs(60),
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let upstream = upstream_addr();
    let a = first_query_watch(upstream, liveness, seen.clone()).await;
    let b = first_query_watch(upstream, liveness, seen.clone()).await;
    let name = format!("it_{}", ulid::Ulid::new().to_string().to_lowercase());
    // Two hosts: the startup and the pool look for the writable one, and a watcher keeps a probe.
    let url = format!(
        "postgres://postgres@{a},{b}/{name}?sslmode=disable&target_session_attrs=read-write"
    );
    // The database does not exist yet: `ensure_database` creates it on a connection of its own.
    let pool = schema::prepare_with(&url, 2, liveness).await.unwrap();
    let taken = relay::checkpoint::Leadership::try_take(&pool, "it-tuned", "it")
        .await
        .unwrap();
    let mut lead = taken.expect("no other relay leads this stream");
    lead.checkpoint().await.unwrap();
    // The watcher's probe asks every 250 ms; give it a turn.
    tokio::time::sleep(schema::failover::PROBE_INTERVAL * 2).await;
    let seen = seen.lock().unwrap().clone();
    let described: Vec<String> = seen
        .iter()
        .map(|c| {
            let how = if c.tuned { "tuned" } else { "NOT tuned" };
            format!("port {} first sent {}: {how}", c.port, c.kind)
        })
        .collect();
    println!("{described:#?}");
    assert!(
        seen.len() >= 3,
        "the database's creation, the probe and the pool each connect: {described:#?}"
    );
    assert!(
        seen.iter().all(|c| c.tuned),
        "a connection sent a query with the system's socket defaults: {described:#?}"
    );
    drop(lead);
    pool.close().await;
    tests::pg_ctl::drop_database(&crate::helpers::server_url(), &name)
        .await
        .unwrap();
}

/// What a forwarder saw of one connection when it sent its first query.
#[derive(Clone)]
struct FirstQuery {
    /// The client's local port.
    port: u16,
    /// Its socket had the liveness settings then.
    tuned: bool,
    /// The message type (`Q` simple, `P` parse).
    kind: char,
}

fn upstream_addr() -> std::net::SocketAddr {
    let server = crate::helpers::server_url();
    let hostport = server
        .rsplit_once('@')
        .map_or(server.as_str(), |(_, h)| h)
        .trim_end_matches('/');
    std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .unwrap()
        .next()
        .unwrap()
}

/// A forwarder to `upstream` on a port of its own that records each connection's first query.
async fn first_query_watch(
    upstream: std::net::SocketAddr,
    liveness: schema::DbLiveness,
    seen: Arc<Mutex<Vec<FirstQuery>>>,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((down, client)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut down_r, mut down_w) = down.into_split();
                let (mut up_r, mut up_w) = up.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut up_r, &mut down_w).await });
                let mut parser = FrontendParser::default();
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let Ok(n) = down_r.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    if let Some(kind) = parser.first_query(&buf[..n]) {
                        let tuned = client_socket_tuned(client.port(), addr.port(), liveness);
                        seen.lock().unwrap().push(FirstQuery {
                            port: client.port(),
                            tuned,
                            kind,
                        });
                    }
                    if up_w.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Follows the frontend side of the PostgreSQL protocol far enough to see the first query: the
/// untyped startup packets (an SSLRequest or GSSENCRequest, then the StartupMessage), then typed
/// messages (a type byte and a length).
#[derive(Default)]
struct FrontendParser {
    pending: Vec<u8>,
    started: bool,
    queried: bool,
}

impl FrontendParser {
    /// Takes the next bytes; the type of the first query message when it arrives in them.
    fn first_query(&mut self, bytes: &[u8]) -> Option<char> {
        self.pending.extend_from_slice(bytes);
        let mut found = None;
        loop {
            let (header, kind) = if self.started {
                (5, self.pending.first().copied())
            } else {
                (4, None)
            };
            if self.pending.len() < header {
                return found;
            }
            let at = header - 4;
            let len = u32::from_be_bytes(self.pending[at..at + 4].try_into().unwrap()) as usize;
            let whole = at + len;
            // An untyped packet also needs its code (4 bytes after the length).
            let need = if self.started { whole } else { whole.max(8) };
            if self.pending.len() < need {
                return found;
            }
            match kind {
                None => {
                    let code = u32::from_be_bytes(self.pending[4..8].try_into().unwrap());
                    // 80877103: SSLRequest, 80877104: GSSENCRequest; anything else starts.
                    self.started = !matches!(code, 80_877_103 | 80_877_104);
                }
                Some(k @ (b'Q' | b'P')) if !self.queried => {
                    self.queried = true;
                    found = Some(char::from(k));
                }
                Some(_) => {}
            }
            self.pending.drain(..whole);
        }
    }
}

/// Whether this process's socket from local port `local` to forwarder port `peer` has the
/// keepalive and user timeout of `liveness`, read back from the kernel.
fn client_socket_tuned(local: u16, peer: u16, liveness: schema::DbLiveness) -> bool {
    use rustix::net::sockopt;
    for socket in schema::net::process_sockets().unwrap() {
        let mine = rustix::net::getsockname(&socket.fd)
            .ok()
            .and_then(|a| std::net::SocketAddr::try_from(a).ok());
        if mine.map(|a| a.port()) != Some(local) || socket.peer.map(|a| a.port()) != Some(peer) {
            continue;
        }
        let dup = &socket.fd;
        return sockopt::socket_keepalive(dup).unwrap_or(false)
            && sockopt::tcp_keepidle(dup).ok() == Some(liveness.tcp.keepalive)
            && sockopt::tcp_user_timeout(dup).ok()
                == u32::try_from(liveness.tcp.user_timeout.as_millis()).ok();
    }
    panic!("no socket of this process from port {local} to port {peer}");
}
