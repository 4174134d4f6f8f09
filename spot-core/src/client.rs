//! Async client for spot-core, used by the coordinator's adapter, and the transport it is one of
//! (`SpotTransport`: the simulation puts an in-process engine behind the same trait).
//!
//! Its errors separate "never sent" (`Connect`) from "sent, outcome unknown" (`Timeout`,
//! `Io`, `Protocol`): only the first proves nothing happened; for the others the caller
//! must retry the same req_id or ask `lookup`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use liveness::TcpLiveness;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use std::borrow::Cow;

use crate::protocol::{HelloInfo, Request, Response, TRACE_SINCE_VERSION};

/// One request, framed (its JSON and a newline).
fn framed(req: &Request) -> Result<Vec<u8>, ClientError> {
    let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

/// Requests framed one after another, for one pipelined write.
fn pipelined<'a>(reqs: impl Iterator<Item = Cow<'a, Request>>) -> Result<Vec<u8>, ClientError> {
    let mut lines = Vec::with_capacity(reqs.size_hint().0 * 192);
    for req in reqs {
        serde_json::to_writer(&mut lines, req.as_ref())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        lines.push(b'\n');
    }
    Ok(lines)
}

/// `req` carrying the trace context `trace`, when it is a movement (the only requests that take
/// one); `None` for any other request.
fn with_trace(req: &Request, trace: &str) -> Option<Request> {
    let (op, movement) = req.as_movement()?;
    let mut movement = movement.clone();
    movement.trace = Some(trace.to_owned());
    Some(match op {
        crate::protocol::MovementOp::Withdraw => Request::Withdraw(movement),
        crate::protocol::MovementOp::Deposit => Request::Deposit(movement),
        crate::protocol::MovementOp::Refund => Request::Refund(movement),
    })
}

/// Idle connections kept for reuse; more concurrent calls simply open more connections.
pub const MAX_IDLE_CONNECTIONS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The deadline passed after the request may have been sent; outcome unknown.
    #[error("spot-core did not answer before the deadline; outcome unknown")]
    Timeout,
    /// No connection could be made; the request was never sent.
    #[error("could not connect to spot-core: {0}")]
    Connect(String),
    /// The connection broke after the request may have been sent; outcome unknown.
    #[error("connection to spot-core failed: {0}; outcome unknown")]
    Io(String),
    /// The answer could not be understood; outcome unknown.
    #[error("unintelligible answer from spot-core: {0}")]
    Protocol(String),
}

impl ClientError {
    /// True unless the request provably never reached spot-core.
    pub fn outcome_unknown(&self) -> bool {
        !matches!(self, ClientError::Connect(_))
    }
}

#[derive(Debug)]
struct Conn {
    stream: BufReader<TcpStream>,
    /// The engine's protocol version, from its answer to `hello` (1 without one).
    protocol: u32,
    /// The epoch a replicated engine leads (ADR 0020 §4), from its answer to `hello`.
    epoch: Option<u64>,
}

impl Conn {
    /// Connect and, with a token, authenticate. Every failure here is `Connect`: the request
    /// itself has not been sent yet.
    async fn connect(
        addr: &str,
        hello: Option<&[u8]>,
        liveness: &TcpLiveness,
    ) -> Result<Conn, ClientError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        // A pooled connection whose peer vanished (no FIN, no RST) is then errored by the kernel
        // within a bound, and `looks_alive` drops it instead of sending on it.
        liveness
            .apply(&stream)
            .map_err(|e| ClientError::Connect(format!("TCP liveness options: {e}")))?;
        let mut conn = Conn {
            stream: BufReader::new(stream),
            protocol: 1,
            epoch: None,
        };
        if let Some(hello) = hello {
            match conn.exchange_raw(hello).await {
                Ok((answer @ Response::Ok { .. }, info)) => {
                    conn.protocol = answer.protocol_version();
                    conn.epoch = info.epoch;
                }
                // A replica that does not lead (or has not heard of the newest epoch) is not a
                // misconfiguration: the cell is electing, or the leader is elsewhere.
                Ok((
                    Response::Error {
                        code:
                            crate::protocol::ErrorCode::NotLeader
                            | crate::protocol::ErrorCode::StaleEpoch,
                        message,
                    },
                    _,
                )) => return Err(ClientError::Connect(format!("no leader here: {message}"))),
                Ok((other, _)) => {
                    return Err(ClientError::Connect(format!("{HELLO_REFUSED}: {other:?}")))
                }
                Err(e) => return Err(ClientError::Connect(format!("during hello: {e}"))),
            }
        }
        Ok(conn)
    }

    /// Whether an idle pooled connection still looks usable. A server restart closes idle
    /// connections; noticing that before sending avoids turning a harmless reconnect into an
    /// "outcome unknown" error.
    fn looks_alive(&self) -> bool {
        if !self.stream.buffer().is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.stream.get_ref().try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Writes `count` framed requests at once and reads their `count` answers, in order, each
    /// within `deadline`. After the first failure to read (a broken connection, the deadline)
    /// every answer still missing is that failure: the request may have been applied.
    async fn exchange_many(
        &mut self,
        lines: &[u8],
        count: usize,
        deadline: Instant,
    ) -> Vec<Result<Response, ClientError>> {
        let io = |e: std::io::Error| ClientError::Io(e.to_string());
        let written = match timeout_at(deadline, self.stream.get_mut().write_all(lines)).await {
            Ok(written) => written.map_err(io),
            Err(_) => Err(ClientError::Timeout),
        };
        if let Err(e) = written {
            return vec![Err(e); count];
        }
        let mut answers = Vec::with_capacity(count);
        let mut answer = Vec::with_capacity(256);
        while answers.len() < count {
            answer.clear();
            let read = match timeout_at(deadline, self.stream.read_until(b'\n', &mut answer)).await
            {
                Ok(read) => read.map_err(io),
                Err(_) => Err(ClientError::Timeout),
            };
            let failed = match read {
                Ok(_) if answer.last() == Some(&b'\n') => None,
                Ok(_) => Some(ClientError::Io(
                    "connection closed before a complete answer".into(),
                )),
                Err(e) => Some(e),
            };
            if let Some(e) = failed {
                answers.resize(count, Err(e));
                break;
            }
            answers.push(
                serde_json::from_slice(&answer).map_err(|e| ClientError::Protocol(e.to_string())),
            );
        }
        answers
    }

    /// `exchange`, with what a replica adds to its answer to `hello` read from the same line.
    async fn exchange_raw(&mut self, line: &[u8]) -> Result<(Response, HelloInfo), ClientError> {
        let answer = self.exchange_line(line).await?;
        let response =
            serde_json::from_slice(&answer).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let info = serde_json::from_slice(&answer).unwrap_or_default();
        Ok((response, info))
    }

    async fn exchange(&mut self, line: &[u8]) -> Result<Response, ClientError> {
        let answer = self.exchange_line(line).await?;
        serde_json::from_slice(&answer).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Writes one request line and reads its whole answer line.
    async fn exchange_line(&mut self, line: &[u8]) -> Result<Vec<u8>, ClientError> {
        let io = |e: std::io::Error| ClientError::Io(e.to_string());
        self.stream.get_mut().write_all(line).await.map_err(io)?;
        let mut answer = Vec::with_capacity(256);
        self.stream
            .read_until(b'\n', &mut answer)
            .await
            .map_err(io)?;
        if answer.last() != Some(&b'\n') {
            return Err(ClientError::Io(
                "connection closed before a complete answer".into(),
            ));
        }
        Ok(answer)
    }
}

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
    /// The framed `hello` line sent on every new connection, when there is a token or a cell,
    /// or traces are exported (to learn the engine's protocol version).
    hello: Option<Vec<u8>>,
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
            .field("token", &self.hello.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// One request, one answer: how the adapter reaches spot-core. `SpotClient` is the TCP one; the
/// simulation (`ledger-sim`) answers from an in-process `Engine` with faults of its own.
/// Errors keep `ClientError`'s meaning: only `Connect` proves the request was never sent.
#[async_trait::async_trait]
pub trait SpotTransport: Send + Sync {
    /// Sends one request and waits for its answer.
    async fn call(&self, req: &Request) -> Result<Response, ClientError>;

    /// Sends many requests and waits for their answers, one per request in order, each with
    /// `call`'s meaning. This default sends them one by one; the TCP client pipelines them on
    /// one connection, so spot-core's WAL group-commits them under one fsync.
    async fn call_many(&self, reqs: &[Request]) -> Vec<Result<Response, ClientError>> {
        let mut answers = Vec::with_capacity(reqs.len());
        for req in reqs {
            answers.push(self.call(req).await);
        }
        answers
    }

    /// The TCP client behind this transport, when it is one (the leadership it observed, its
    /// replicas' addresses); `None` for any other (the simulation's).
    fn tcp_client(&self) -> Option<&SpotClient> {
        None
    }
}

#[async_trait::async_trait]
impl SpotTransport for SpotClient {
    async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        SpotClient::call(self, req).await
    }

    fn tcp_client(&self) -> Option<&SpotClient> {
        Some(self)
    }

    async fn call_many(&self, reqs: &[Request]) -> Vec<Result<Response, ClientError>> {
        SpotClient::call_many(self, reqs).await
    }
}

/// Most requests one pipelined write carries: below the server's in-flight cap per connection
/// (`server::MAX_IN_FLIGHT_PER_CONN`, 1024), so the server never stops reading a pipeline whose
/// answers the client only reads after writing it (which could otherwise deadlock both).
pub const PIPELINE_REQUESTS_MAX: usize = 512;

/// How a `Connect` error says the engine answered the `hello` with a refusal (a wrong token,
/// another cell): a misconfiguration rather than an engine that is not up yet.
pub const HELLO_REFUSED: &str = "spot-core refused the hello";

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
        let hello = (token.is_some() || cell.is_some() || traced).then(|| {
            let token = token.clone().unwrap_or_default();
            let mut line = serde_json::to_vec(&Request::Hello {
                token,
                cell,
                epoch: None,
                map_version: None,
            })
            .expect("serializing a hello cannot fail");
            line.push(b'\n');
            line
        });
        let addrs: Vec<String> = addr
            .split(',')
            .map(|a| a.trim().to_owned())
            .filter(|a| !a.is_empty())
            .collect();
        let replicated = addrs.len() > 1;
        SpotClient {
            inner: Arc::new(Inner {
                addrs,
                current: AtomicUsize::new(0),
                epoch_seen: AtomicU64::new(0),
                token: token.clone().unwrap_or_default(),
                cell,
                hello: if replicated { None } else { hello },
                addr,
                timeout,
                liveness,
                traced,
                idle: Mutex::new(Vec::new()),
                observed: Mutex::new(LeaderObserved::default()),
            }),
        }
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
            return Conn::connect(&inner.addr, inner.hello.as_deref(), &inner.liveness).await;
        }
        let first = inner.current.load(Ordering::Relaxed);
        let mut last_error = None;
        for k in 0..inner.addrs.len() {
            let i = (first + k) % inner.addrs.len();
            let seen = inner.epoch_seen.load(Ordering::Acquire);
            let mut hello = serde_json::to_vec(&Request::Hello {
                token: inner.token.clone(),
                cell: inner.cell,
                epoch: (seen > 0).then_some(seen),
                map_version: None,
            })
            .expect("serializing a hello cannot fail");
            hello.push(b'\n');
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let client = SpotClient::new(addr, Duration::from_secs(5));
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert!(matches!(err, ClientError::Connect(_)), "{err:?}");
        assert!(!err.outcome_unknown());
    }

    #[tokio::test]
    async fn silent_server_is_a_timeout_and_the_connection_is_not_reused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (accepted_tx, mut accepted_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                accepted_tx.send(s).unwrap();
            }
        });
        let client = SpotClient::new(addr, Duration::from_millis(200));
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert_eq!(err, ClientError::Timeout);
        assert!(err.outcome_unknown());
        let first = accepted_rx.recv().await.unwrap();
        // The second call must open a new connection rather than reuse the timed-out one.
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert_eq!(err, ClientError::Timeout);
        let second = accepted_rx.recv().await.unwrap();
        assert_ne!(first.peer_addr().unwrap(), second.peer_addr().unwrap());
    }

    #[tokio::test]
    async fn garbage_and_hangups_are_reported_as_unknown_outcomes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            // First connection answers garbage, second hangs up after reading the request.
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut req = Vec::new();
            s.read_until(b'\n', &mut req).await.unwrap();
            s.get_mut()
                .write_all(b"{\"status\":\"what\"}\n")
                .await
                .unwrap();
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut req = Vec::new();
            s.read_until(b'\n', &mut req).await.unwrap();
            drop(s);
        });
        let client = SpotClient::new(addr, Duration::from_secs(5));
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert!(matches!(err, ClientError::Io(_)), "{err:?}");
    }
}
