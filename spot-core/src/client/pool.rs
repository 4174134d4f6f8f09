//! `SpotClient`: the pooled client (idle connections kept, timeouts), the replicas of a
//! replicated cell and the leader it follows (ADR 0020 §4), and pipelined calls.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use liveness::TcpLiveness;
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use super::conn::{framed, pipelined, with_trace, Conn};
use super::error::{ClientError, HELLO_REFUSED};
use crate::protocol::{Request, Response, TRACE_SINCE_VERSION};

/// Idle connections kept for reuse; more concurrent calls simply open more connections.
pub const MAX_IDLE_CONNECTIONS: usize = 32;

/// A change of leader this client observed in a replicated cell (ADR 0020 §4): a replica
/// answered its `hello` as the leader of an epoch higher than any seen before. For the ledger
/// to record in the cell's `failovers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderChange {
    pub at: SystemTime,
    /// The replica that led before (its address), `None` when this client had seen none.
    pub from: Option<String>,
    pub to: String,
    pub epoch: u64,
}

/// What this client observed of its cell's leadership: the changes not yet taken, and since
/// when no replica answers as the leader.
#[derive(Debug, Default)]
struct LeaderObserved {
    leader: Option<String>,
    changes: Vec<LeaderChange>,
    leaderless_since: Option<SystemTime>,
}

/// Most changes kept while nobody takes them.
const CHANGES_KEPT_MAX: usize = 256;

/// How one replica answers a `hello` now ([`SpotClient::probe_replica`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaAnswer {
    /// It leads `epoch`.
    Leader { epoch: u64 },
    /// It refused with `NOT_LEADER` (or `STALE_EPOCH`): a follower; the message names the
    /// leader it believes in when it knows one.
    Follower { message: String },
    /// It did not answer, or refused the hello (a wrong token, another cell).
    Down { error: String },
}

struct Inner {
    addr: String,
    /// The replicas of a replicated cell (`addr` split at commas; one address otherwise).
    addrs: Vec<String>,
    /// The replica that answered last as the leader (tried first).
    current: AtomicUsize,
    /// The highest epoch any replica answered with: a replica that has not seen it refuses the
    /// `hello`, and an answer with a lower one is not used (ADR 0020 §4).
    epoch_seen: AtomicU64,
    /// What a replicated cell's `hello` carries besides the epoch.
    token: String,
    cell: Option<u16>,
    timeout: Duration,
    liveness: TcpLiveness,
    /// A `hello` is sent on every new connection to a single engine: there is a token or a
    /// cell, or traces are exported (to learn the engine's protocol version). A replicated
    /// cell's connections always send one, and so does any once a map version is set.
    say_hello: bool,
    /// The cell map version this client routes by (ADR 0023 §1), named in every `hello`; 0: none
    /// (no map, the `hello` names none). An engine that has seen a newer one refuses it.
    map_version: AtomicU64,
    /// Traces are exported: movements carry their caller's trace context to engines that speak
    /// protocol version 2 (`docs/adr/0018-traces.md`).
    traced: bool,
    idle: Mutex<Vec<Conn>>,
    observed: Mutex<LeaderObserved>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Inner")
            .field("addr", &self.addr)
            .field("timeout", &self.timeout)
            .field("liveness", &self.liveness)
            .field("token", &"<redacted>")
            .field("map_version", &self.map_version.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Most requests one pipelined write carries: below the server's in-flight cap per connection
/// (`server::MAX_IN_FLIGHT_PER_CONN`, 1024), so the server never stops reading a pipeline whose
/// answers the client only reads after writing it (which could otherwise deadlock both).
pub const PIPELINE_REQUESTS_MAX: usize = 512;

/// Cheap to clone; clones share one connection pool.
#[derive(Debug, Clone)]
pub struct SpotClient {
    inner: Arc<Inner>,
}

impl SpotClient {
    /// `timeout` bounds each `call` from start to answer, connecting included.
    pub fn new(addr: String, timeout: Duration) -> SpotClient {
        SpotClient::with_token(addr, timeout, None)
    }

    /// Like `new`; with a token, every new connection first authenticates with a `hello`.
    pub fn with_token(addr: String, timeout: Duration, token: Option<String>) -> SpotClient {
        SpotClient::with_liveness(addr, timeout, token, TcpLiveness::DEFAULT)
    }

    /// Like `with_token`, with the keepalive and `TCP_USER_TIMEOUT` every connection gets.
    pub fn with_liveness(
        addr: String,
        timeout: Duration,
        token: Option<String>,
        liveness: TcpLiveness,
    ) -> SpotClient {
        SpotClient::for_cell(addr, timeout, token, liveness, None)
    }

    /// Like `with_liveness`, expecting the engine to be `cell` (ADR 0017): every new connection
    /// then says so in its `hello`, sent even without a token, and an engine of another cell
    /// refuses it (a `Connect` error: nothing was sent).
    pub fn for_cell(
        addr: String,
        timeout: Duration,
        token: Option<String>,
        liveness: TcpLiveness,
        cell: Option<u16>,
    ) -> SpotClient {
        let traced = telemetry::enabled();
        let say_hello = token.is_some() || cell.is_some() || traced;
        let addrs: Vec<String> = addr
            .split(',')
            .map(|a| a.trim().to_owned())
            .filter(|a| !a.is_empty())
            .collect();
        SpotClient {
            inner: Arc::new(Inner {
                addrs,
                current: AtomicUsize::new(0),
                epoch_seen: AtomicU64::new(0),
                token: token.clone().unwrap_or_default(),
                cell,
                say_hello,
                map_version: AtomicU64::new(0),
                addr,
                timeout,
                liveness,
                traced,
                idle: Mutex::new(Vec::new()),
                observed: Mutex::new(LeaderObserved::default()),
            }),
        }
    }

    /// This client, routing by the cell map version `map_version` (`None`: no map, the
    /// default): every new connection's `hello` names it, and an engine that has seen a newer
    /// one refuses it with [`ClientError::StaleMap`].
    pub fn with_map_version(self, map_version: Option<u64>) -> SpotClient {
        self.set_map_version(map_version);
        self
    }

    /// Routes by `map_version` from now on (new connections; pooled ones said their hello).
    /// Version 0 is no map.
    pub fn set_map_version(&self, map_version: Option<u64>) {
        self.inner
            .map_version
            .store(map_version.unwrap_or(0), Ordering::Release);
    }

    /// The cell map version this client routes by, if any.
    pub fn map_version(&self) -> Option<u64> {
        Some(self.inner.map_version.load(Ordering::Acquire)).filter(|v| *v > 0)
    }

    /// The framed `hello` line of a new connection, naming `epoch`.
    fn hello_line(&self, epoch: Option<u64>) -> Vec<u8> {
        let inner = &self.inner;
        let mut hello = serde_json::to_vec(&Request::Hello {
            token: inner.token.clone(),
            cell: inner.cell,
            epoch,
            map_version: self.map_version(),
        })
        .expect("serializing a hello cannot fail");
        hello.push(b'\n');
        hello
    }

    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// A new connection by `deadline`. When it fails after a pooled connection's send already
    /// failed (`first_failure`), that first failure is the answer: its request may have been
    /// applied, so "never sent" would be a lie.
    async fn connect_by(
        &self,
        deadline: Instant,
        first_failure: Option<ClientError>,
    ) -> Result<Conn, ClientError> {
        let connected = match timeout_at(deadline, self.connect_any()).await {
            Ok(c) => c,
            Err(_) => Err(ClientError::Connect("timed out while connecting".into())),
        };
        match (connected, first_failure) {
            (Ok(c), _) => Ok(c),
            (Err(_), Some(first)) => Err(first),
            (Err(e), None) => Err(e),
        }
    }

    /// A connection to the one engine, or, for a replicated cell, to its leader: each replica in
    /// turn from the last leader, until one answers its `hello` as the leader of an epoch at
    /// least as high as any seen (ADR 0020 §4).
    async fn connect_any(&self) -> Result<Conn, ClientError> {
        let inner = &self.inner;
        if inner.addrs.len() <= 1 {
            let hello =
                (inner.say_hello || self.map_version().is_some()).then(|| self.hello_line(None));
            return Conn::connect(&inner.addr, hello.as_deref(), &inner.liveness).await;
        }
        let first = inner.current.load(Ordering::Relaxed);
        let mut last_error = None;
        for k in 0..inner.addrs.len() {
            let i = (first + k) % inner.addrs.len();
            let seen = inner.epoch_seen.load(Ordering::Acquire);
            let hello = self.hello_line((seen > 0).then_some(seen));
            match Conn::connect(&inner.addrs[i], Some(&hello), &inner.liveness).await {
                Ok(conn) => {
                    let epoch = conn.epoch.unwrap_or(0);
                    if epoch < inner.epoch_seen.load(Ordering::Acquire) {
                        last_error = Some(ClientError::Connect(format!(
                            "{} answered epoch {epoch}, older than one seen",
                            inner.addrs[i]
                        )));
                        continue;
                    }
                    let before = inner.epoch_seen.fetch_max(epoch, Ordering::AcqRel);
                    inner.current.store(i, Ordering::Relaxed);
                    self.observe_leader(&inner.addrs[i], epoch, before);
                    return Ok(conn);
                }
                // The leader has seen a newer map: another replica cannot make this map good.
                Err(e @ ClientError::StaleMap(_)) => return Err(e),
                Err(e) => last_error = Some(e),
            }
        }
        self.observed()
            .leaderless_since
            .get_or_insert_with(SystemTime::now);
        Err(last_error.unwrap_or_else(|| ClientError::Connect("no replica".into())))
    }

    fn observed(&self) -> std::sync::MutexGuard<'_, LeaderObserved> {
        self.inner
            .observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// `addr` answered as the leader of `epoch`, the highest epoch seen before being `before`:
    /// a change when the epoch is higher than one seen (the first sight is none).
    fn observe_leader(&self, addr: &str, epoch: u64, before: u64) {
        let mut o = self.observed();
        o.leaderless_since = None;
        let from = o.leader.replace(addr.to_owned());
        if before > 0 && epoch > before {
            if o.changes.len() >= CHANGES_KEPT_MAX {
                o.changes.remove(0);
            }
            o.changes.push(LeaderChange {
                at: SystemTime::now(),
                from,
                to: addr.to_owned(),
                epoch,
            });
        }
    }

    /// The replicas' addresses (one address for a single engine).
    pub fn replicas(&self) -> &[String] {
        &self.inner.addrs
    }

    /// Whether this client follows a replicated cell (several addresses).
    pub fn replicated(&self) -> bool {
        self.inner.addrs.len() > 1
    }

    /// Takes the leader changes observed since the last call, oldest first.
    pub fn take_leader_changes(&self) -> Vec<LeaderChange> {
        std::mem::take(&mut self.observed().changes)
    }

    /// Gives back changes a caller took and could not record: taken again first.
    pub fn untake_leader_changes(&self, mut changes: Vec<LeaderChange>) {
        let mut o = self.observed();
        changes.append(&mut o.changes);
        changes.truncate(CHANGES_KEPT_MAX);
        o.changes = changes;
    }

    /// Since when no replica has answered this client as the leader (its last attempt to
    /// connect tried them all); `None` while one does.
    pub fn leaderless_since(&self) -> Option<SystemTime> {
        self.observed().leaderless_since
    }

    /// The replica this client last used as the leader (its address), if any.
    pub fn leader_in_use(&self) -> Option<String> {
        self.observed().leader.clone()
    }

    /// How the replica at `addr` answers a `hello` of this client's cell and token now, within
    /// `within` (the cells view asks each replica its role). No epoch is sent: a replica
    /// behind the epochs seen still says what it believes it is.
    pub async fn probe_replica(&self, addr: &str, within: Duration) -> ReplicaAnswer {
        let inner = &self.inner;
        let mut hello = serde_json::to_vec(&Request::Hello {
            token: inner.token.clone(),
            cell: inner.cell,
            epoch: None,
            map_version: None,
        })
        .expect("serializing a hello cannot fail");
        hello.push(b'\n');
        let asked = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| ClientError::Connect(e.to_string()))?;
            let mut conn = Conn {
                stream: BufReader::new(stream),
                protocol: 1,
                epoch: None,
            };
            conn.exchange_raw(&hello).await
        };
        match tokio::time::timeout(within, asked).await {
            Err(_) => ReplicaAnswer::Down {
                error: "no answer in time".into(),
            },
            Ok(Err(e)) => ReplicaAnswer::Down {
                error: e.to_string(),
            },
            Ok(Ok((Response::Ok { .. }, info))) => match info.role.as_deref() {
                Some("leader") | None => ReplicaAnswer::Leader {
                    epoch: info.epoch.unwrap_or(0),
                },
                Some(other) => ReplicaAnswer::Follower {
                    message: format!("answers as {other}"),
                },
            },
            Ok(Ok((
                Response::Error {
                    code:
                        crate::protocol::ErrorCode::NotLeader | crate::protocol::ErrorCode::StaleEpoch,
                    message,
                },
                _,
            ))) => ReplicaAnswer::Follower { message },
            Ok(Ok((other, _))) => ReplicaAnswer::Down {
                error: format!("{HELLO_REFUSED}: {other:?}"),
            },
        }
    }

    /// The highest epoch a replica of this cell has answered with (0: none, or not replicated).
    pub fn epoch_seen(&self) -> u64 {
        self.inner.epoch_seen.load(Ordering::Acquire)
    }

    /// Send one request and wait for its answer.
    pub async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let deadline = Instant::now() + self.inner.timeout;
        let line = framed(req)?;
        // The same request with the caller's trace context, for engines that take it.
        let traced = match self.trace_context() {
            Some(trace) => with_trace(req, &trace).map(|r| framed(&r)).transpose()?,
            None => None,
        };
        let line_for = |conn: &Conn| match &traced {
            Some(t) if conn.protocol >= TRACE_SINCE_VERSION => t.as_slice(),
            _ => line.as_slice(),
        };
        // A pooled connection may have been closed by a server restart without the reactor having
        // noticed yet. Every request is idempotent (movements by req_id), so when a pooled
        // connection breaks, sending once more on a fresh connection is safe.
        let mut first_failure = None;
        if let Some(mut conn) = self.take_idle() {
            match timeout_at(deadline, conn.exchange(line_for(&conn))).await {
                Ok(Ok(response)) => {
                    self.put_idle(conn);
                    return Ok(response);
                }
                Ok(Err(e @ ClientError::Io(_))) => first_failure = Some(e),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(ClientError::Timeout),
            }
        }
        let mut conn = self.connect_by(deadline, first_failure).await?;
        // On any error the connection is dropped here: it may still carry a late answer
        // that would be mistaken for the answer to the next request.
        let response = match timeout_at(deadline, conn.exchange(line_for(&conn))).await {
            Ok(r) => r?,
            Err(_) => return Err(ClientError::Timeout),
        };
        self.put_idle(conn);
        Ok(response)
    }

    /// Sends many requests pipelined on one connection (in writes of at most
    /// [`PIPELINE_REQUESTS_MAX`]) and returns one answer per request, in order. spot-core
    /// answers a connection's requests in order and its WAL syncs whatever is queued together,
    /// so a pipeline costs about one fsync instead of one each. `timeout` bounds each write of
    /// the pipeline from start to last answer. The errors keep `call`'s meaning per request.
    pub async fn call_many(&self, reqs: &[Request]) -> Vec<Result<Response, ClientError>> {
        let mut answers = Vec::with_capacity(reqs.len());
        let trace = self.trace_context();
        for chunk in reqs.chunks(PIPELINE_REQUESTS_MAX) {
            let lines = pipelined(chunk.iter().map(Cow::Borrowed));
            let traced = trace.as_deref().map(|trace| {
                pipelined(
                    chunk
                        .iter()
                        .map(|req| with_trace(req, trace).map_or(Cow::Borrowed(req), Cow::Owned)),
                )
            });
            match (lines, traced.transpose()) {
                (Ok(lines), Ok(traced)) => {
                    answers.extend(self.pipeline(&lines, traced.as_deref(), chunk.len()).await)
                }
                (Err(e), _) | (_, Err(e)) => answers.extend(vec![Err(e); chunk.len()]),
            }
        }
        answers
    }

    /// One pipelined write of `count` framed requests and its answers. As in `call`, a pooled
    /// connection that broke before any answer came back is replaced by a fresh one and the
    /// whole pipeline sent again (every request is idempotent).
    async fn pipeline(
        &self,
        lines: &[u8],
        traced: Option<&[u8]>,
        count: usize,
    ) -> Vec<Result<Response, ClientError>> {
        let deadline = Instant::now() + self.inner.timeout;
        let lines_for = |conn: &Conn| match traced {
            Some(t) if conn.protocol >= TRACE_SINCE_VERSION => t,
            _ => lines,
        };
        let mut first_failure = None;
        if let Some(mut conn) = self.take_idle() {
            let answers = conn.exchange_many(lines_for(&conn), count, deadline).await;
            match answers.first() {
                Some(Err(e @ ClientError::Io(_))) => first_failure = Some(e.clone()),
                _ => {
                    if answers.iter().all(Result::is_ok) {
                        self.put_idle(conn);
                    }
                    return answers;
                }
            }
        }
        let mut conn = match self.connect_by(deadline, first_failure).await {
            Ok(c) => c,
            Err(e) => return vec![Err(e); count],
        };
        let answers = conn.exchange_many(lines_for(&conn), count, deadline).await;
        // Kept only when every answer came back whole: otherwise a late answer could be taken
        // for the answer to a later request.
        if answers.iter().all(Result::is_ok) {
            self.put_idle(conn);
        }
        answers
    }

    /// The caller's trace context to send along, when traces are exported.
    fn trace_context(&self) -> Option<String> {
        if !self.inner.traced {
            return None;
        }
        telemetry::current_traceparent()
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(conn) = idle.pop() {
            if conn.looks_alive() {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: Conn) {
        let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
    }
}
