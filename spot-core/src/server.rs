//! TCP front end: newline-delimited JSON, pipelined, answered in request order.
//!
//! Each connection has a reader task that parses lines and queues them to the engine thread,
//! and a writer that awaits the answers in the order the requests arrived.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::bytes::Bytes;
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, FramedRead};

use crate::protocol::{Request, Response, MAX_LINE_BYTES, MAX_MOVE_LINE_BYTES};
use crate::wal::EngineHandle;

/// Requests a single connection may have in flight before its reader stops reading, so a
/// client that never reads its answers cannot make the server buffer without bound.
const MAX_IN_FLIGHT_PER_CONN: usize = 1024;

/// How long a connection may take to authenticate when the server has a token.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// The shared secret every connection must present first, if any.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl Token {
    pub fn new(token: impl Into<Arc<str>>) -> Token {
        Token(token.into())
    }

    /// Comparison whose time does not depend on where the first difference is.
    fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), offered.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

enum Pending {
    /// Boxed: most requests wait (`Waiting`), and a queue of them stays small.
    Ready(Box<Response>),
    Waiting(oneshot::Receiver<Response>),
    /// The answer to an accepted `hello`: a `Response::hello()` line with, on a replica, its
    /// epoch and role (ADR 0020 §4).
    Hello(Option<(u64, &'static str)>),
}

/// Who may talk to this engine: the shared token, if any, and the cell this engine is, if it
/// was given one (ADR 0017). A `hello` naming another cell is refused.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub token: Option<Token>,
    pub cell: Option<u16>,
    /// This engine's role when it is a replica (ADR 0020): only the leader serves.
    pub role: Option<Arc<crate::replica::Role>>,
}

impl Access {
    /// Why a `hello` offering `offered` and naming `cell` is refused, if it is.
    fn refusal(&self, offered: &str, cell: Option<u16>) -> Option<String> {
        if self.token.as_ref().is_some_and(|t| !t.matches(offered)) {
            return Some("wrong token".to_owned());
        }
        match (self.cell, cell) {
            (Some(mine), Some(expected)) if mine != expected => Some(format!(
                "this spot-core is cell {mine}; the client expected cell {expected}"
            )),
            _ => None,
        }
    }

    /// On a replica: the refusal of a client that has seen `epoch`, or of any request while this
    /// replica does not lead; else the answer's epoch and role.
    fn replica_check(
        &self,
        epoch: Option<u64>,
    ) -> Result<Option<(u64, &'static str)>, Box<Response>> {
        let Some(role) = &self.role else {
            return Ok(None);
        };
        let mine = role.epoch();
        if epoch.is_some_and(|seen| seen > mine) {
            return Err(Box::new(Response::Error {
                code: crate::protocol::ErrorCode::StaleEpoch,
                message: format!(
                    "this replica's epoch {mine} is older than the {} the client has seen",
                    epoch.unwrap_or_default()
                ),
            }));
        }
        if !role.leading() {
            return Err(Box::new(not_leader(role)));
        }
        Ok(Some((mine, "leader")))
    }
}

fn not_leader(role: &crate::replica::Role) -> Response {
    Response::Error {
        code: crate::protocol::ErrorCode::NotLeader,
        message: match role.leader() {
            Some(addr) => format!("this replica does not lead; the leader is at {addr}"),
            None => "this replica does not lead; no leader is known".to_owned(),
        },
    }
}

/// Accept connections forever. With a token, each connection must start with a matching
/// `hello` before anything else is read; with a cell id, a `hello` naming another cell is
/// refused.
pub async fn serve(
    listener: TcpListener,
    engine: EngineHandle,
    access: Access,
) -> std::io::Result<()> {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tracing::debug!(%peer, "connection accepted");
                let engine = engine.clone();
                let access = access.clone();
                tokio::spawn(async move {
                    handle_connection(stream, engine, access).await;
                    tracing::debug!(%peer, "connection closed");
                });
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning, the listener stays valid.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle_connection(stream: TcpStream, engine: EngineHandle, access: Access) {
    let _ = stream.set_nodelay(true);
    // A client that vanished without a word (its host died, a partition) would otherwise keep
    // this task and its socket for hours.
    let _ = liveness::TcpLiveness::DEFAULT.apply(&stream);
    let (rd, wr) = stream.into_split();
    let (queue_tx, queue_rx) = mpsc::channel(MAX_IN_FLIGHT_PER_CONN);
    let writer = tokio::spawn(write_loop(wr, queue_rx));
    read_loop(rd, engine, access, queue_tx).await;
    let _ = writer.await;
}

/// Read the first non-blank line and check it is a `hello` with the right token (and, when it
/// names one, this engine's cell, and a map version not older than the engine's). On failure the
/// UNAUTHORIZED (or STALE_MAP) answer is queued and false returned: the caller closes the
/// connection.
async fn authenticate<R: AsyncRead + Unpin>(
    lines: &mut RequestLines<R>,
    access: &Access,
    engine: &EngineHandle,
    queue: &mpsc::Sender<Pending>,
) -> bool {
    let first = async {
        loop {
            match next_line(lines).await {
                LineRead::Line(line) if line.trim_ascii().is_empty() => continue,
                LineRead::Line(line) => return Some(line.trim_ascii().to_vec()),
                LineRead::Eof => return None,
                LineRead::TooLong => return Some(Vec::new()),
            }
        }
    };
    let answer = match tokio::time::timeout(AUTH_TIMEOUT, first).await {
        Ok(None) => return false,
        Ok(Some(text)) => match serde_json::from_slice::<Request>(&text) {
            Ok(Request::Hello {
                token: offered,
                cell,
                epoch,
                map_version,
            }) => match access.refusal(&offered, cell) {
                None => {
                    let answer = match access.replica_check(epoch) {
                        Ok(info) => match map_check(engine, map_version).await {
                            MapCheck::Accepted => Pending::Hello(info),
                            MapCheck::Refused(refused) => {
                                let _ = queue.send(Pending::Ready(refused)).await;
                                return false;
                            }
                            MapCheck::Gone => return false,
                        },
                        Err(refused) => Pending::Ready(refused),
                    };
                    return queue.send(answer).await.is_ok();
                }
                Some(refusal) => refusal,
            },
            _ => "the first request must be {\"op\":\"hello\",\"token\":...}".to_owned(),
        },
        Err(_) => "no hello before the deadline".to_owned(),
    };
    tracing::warn!(reason = %answer, "connection refused: unauthorized");
    let _ = queue
        .send(Pending::Ready(Box::new(Response::unauthorized(answer))))
        .await;
    false
}

async fn read_loop(
    rd: OwnedReadHalf,
    engine: EngineHandle,
    access: Access,
    queue: mpsc::Sender<Pending>,
) {
    // A `move_in` carries a partition's state: its line may be longer than any other.
    let mut lines = request_lines(rd, MAX_MOVE_LINE_BYTES);
    if access.token.is_some() && !authenticate(&mut lines, &access, &engine, &queue).await {
        drop(queue);
        linger(lines.get_mut()).await;
        return;
    }
    loop {
        let parsed = match next_request(&mut lines).await {
            NextRequest::Parsed(parsed) => parsed,
            NextRequest::Close(answer) => {
                if let Some(answer) = answer {
                    let _ = queue.send(answer).await;
                }
                return;
            }
        };
        let pending = match parsed {
            // A repeated hello (or one sent to a server without a token) is answered here.
            Ok(Request::Hello {
                token: offered,
                cell,
                epoch,
                map_version,
            }) => match answer_hello(&access, &engine, &offered, cell, epoch, map_version).await {
                HelloAnswer::Open(answer) => answer,
                HelloAnswer::Close(answer) => {
                    if let Some(answer) = answer {
                        let _ = queue.send(answer).await;
                    }
                    drop(queue);
                    linger(lines.get_mut()).await;
                    return;
                }
            },
            // A replica that does not lead answers nothing but `hello` (ADR 0020 §3: every
            // answer comes from state two replicas hold).
            Ok(_) if access.role.as_ref().is_some_and(|r| !r.leading()) => Pending::Ready(
                Box::new(not_leader(access.role.as_deref().expect("checked above"))),
            ),
            Ok(request) => {
                let trace = caller_trace(&request);
                match engine.submit_traced(request, trace).await {
                    Some(rx) => Pending::Waiting(rx),
                    None => return,
                }
            }
            Err(e) => Pending::Ready(Box::new(Response::bad_request(format!(
                "invalid request: {e}"
            )))),
        };
        if queue.send(pending).await.is_err() {
            return;
        }
    }
}

/// The next request line of a connection, parsed, or the end of the connection.
enum NextRequest {
    Parsed(Result<Request, serde_json::Error>),
    /// The input ended, or a line was too long (answered `BAD_REQUEST`, the last answer).
    Close(Option<Pending>),
}

/// The next non-blank line, parsed. Only a `move_in` (a partition's state) may be longer than
/// [`MAX_LINE_BYTES`], up to [`MAX_MOVE_LINE_BYTES`].
async fn next_request<R: AsyncRead + Unpin>(lines: &mut RequestLines<R>) -> NextRequest {
    let too_long = |limit: usize| {
        let msg = format!("request line longer than {limit} bytes; closing connection");
        NextRequest::Close(Some(Pending::Ready(Box::new(Response::bad_request(msg)))))
    };
    loop {
        let line = match next_line(lines).await {
            LineRead::Line(line) => line,
            LineRead::Eof => return NextRequest::Close(None),
            LineRead::TooLong => return too_long(MAX_MOVE_LINE_BYTES),
        };
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let parsed = serde_json::from_slice::<Request>(text);
        if text.len() > MAX_LINE_BYTES && !matches!(parsed, Ok(Request::MoveIn { .. })) {
            return too_long(MAX_LINE_BYTES);
        }
        return NextRequest::Parsed(parsed);
    }
}

/// The answer to a `hello` on a connection already reading requests.
enum HelloAnswer {
    /// Answered (accepted, or refused `NOT_LEADER` / `STALE_EPOCH`); the connection goes on.
    Open(Pending),
    /// Refused for its token or cell (`UNAUTHORIZED`) or its map version (`STALE_MAP`): the
    /// answer, if any, is the connection's last.
    Close(Option<Pending>),
}

/// A repeated `hello` (or one sent to a server without a token): its token and cell, then on a
/// replica its epoch, then its map version.
async fn answer_hello(
    access: &Access,
    engine: &EngineHandle,
    offered: &str,
    cell: Option<u16>,
    epoch: Option<u64>,
    map_version: Option<u64>,
) -> HelloAnswer {
    if let Some(refusal) = access.refusal(offered, cell) {
        tracing::warn!(reason = %refusal, "connection refused: unauthorized");
        return HelloAnswer::Close(Some(Pending::Ready(Box::new(Response::unauthorized(
            refusal,
        )))));
    }
    match access.replica_check(epoch) {
        Err(refused) => HelloAnswer::Open(Pending::Ready(refused)),
        Ok(info) => match map_check(engine, map_version).await {
            MapCheck::Accepted => HelloAnswer::Open(Pending::Hello(info)),
            MapCheck::Refused(refused) => HelloAnswer::Close(Some(Pending::Ready(refused))),
            MapCheck::Gone => HelloAnswer::Close(None),
        },
    }
}

/// What the engine said of a `hello`'s map version.
enum MapCheck {
    /// None named, or one not older than the engine's (a higher one is now durable).
    Accepted,
    /// `STALE_MAP`: the answer to send before closing the connection.
    Refused(Box<Response>),
    /// The engine thread is gone (shutting down): close without an answer.
    Gone,
}

/// A `hello`'s map version, checked by the engine, which records a higher one than it knew
/// (durable, and on a replica shipped and acknowledged, like every record) before this returns
/// (ADR 0023 §1). Awaited before the connection's next line is read: nothing a client pipelines
/// after a refused hello reaches the engine. A hello without a map version costs nothing here.
async fn map_check(engine: &EngineHandle, map_version: Option<u64>) -> MapCheck {
    let Some(version) = map_version else {
        return MapCheck::Accepted;
    };
    // Only the map version is the engine's to check: no token travels to the engine thread.
    let hello = Request::Hello {
        token: String::new(),
        cell: None,
        epoch: None,
        map_version: Some(version),
    };
    match engine.call(hello).await {
        Some(Response::Ok { .. }) => MapCheck::Accepted,
        Some(refused) => {
            tracing::warn!(map_version = version, answer = ?refused, "hello refused: stale map");
            MapCheck::Refused(Box::new(refused))
        }
        None => MapCheck::Gone,
    }
}

/// The caller's span context of a movement whose caller sent it (protocol version 2), when this
/// engine exports traces; `None` (nothing made) for every other request. Read here, on the
/// connection's task, so that the engine thread only makes the append's span from it.
fn caller_trace(request: &Request) -> Option<telemetry::SpanContext> {
    let (_, movement) = request.as_movement()?;
    let text = movement.trace.as_deref().filter(|_| telemetry::enabled())?;
    telemetry::parse_traceparent(text)
}

/// After the last answer of a connection being closed: discard further input for a moment
/// (the writer, whose queue is closed, sends the answer and a FIN meanwhile). Closing with
/// unread input would send a reset that can destroy the answer before the peer reads it.
async fn linger<R: AsyncRead + Unpin>(reader: &mut R) {
    let drain = async {
        let mut buf = vec![0u8; 16 * 1024];
        let mut discarded = 0usize;
        while discarded < 1 << 20 {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => discarded += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

async fn write_loop(wr: OwnedWriteHalf, mut queue: mpsc::Receiver<Pending>) {
    let mut out = BufWriter::with_capacity(64 * 1024, wr);
    let mut buf = Vec::with_capacity(1024);
    while let Some(pending) = queue.recv().await {
        let response = match pending {
            Pending::Ready(r) => *r,
            Pending::Hello(info) => {
                buf.clear();
                serde_json::to_writer(&mut buf, &Response::hello()).expect("responses serialize");
                if let Some((epoch, role)) = info {
                    // `{"status":"ok","protocol":3}` gains the replica's epoch and role.
                    buf.pop();
                    buf.extend_from_slice(
                        format!(",\"epoch\":{epoch},\"role\":\"{role}\"}}").as_bytes(),
                    );
                }
                buf.push(b'\n');
                if out.write_all(&buf).await.is_err() {
                    return;
                }
                if queue.is_empty() && out.flush().await.is_err() {
                    return;
                }
                continue;
            }
            Pending::Waiting(mut rx) => match rx.try_recv() {
                Ok(r) => r,
                Err(oneshot::error::TryRecvError::Empty) => {
                    // Push out what is ready before waiting for the next batch's fsync.
                    if out.flush().await.is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(r) => r,
                        Err(_) => return,
                    }
                }
                // The engine dropped the request without answering: we cannot say what
                // happened, so closing the connection (outcome unknown) is the honest answer.
                Err(oneshot::error::TryRecvError::Closed) => return,
            },
        };
        buf.clear();
        serde_json::to_writer(&mut buf, &response).expect("responses serialize");
        buf.push(b'\n');
        if out.write_all(&buf).await.is_err() {
            return;
        }
        if queue.is_empty() && out.flush().await.is_err() {
            return;
        }
    }
    let _ = out.flush().await;
    let _ = out.shutdown().await;
}

/// The request lines of one connection, split at `\n` by tokio-util's delimiter codec, which
/// never buffers more than `max` bytes of one line (the `\n` not counted). A final line without
/// a newline still counts as a line. Frames are bytes rather than `LinesCodec`'s `String` on
/// purpose: `LinesCodec` turns a line that is not UTF-8 into a stream error, which would end
/// the connection, where the protocol answers such a line (malformed JSON) BAD_REQUEST and keeps
/// the connection usable; serde_json checks the UTF-8 as it parses.
type RequestLines<R> = FramedRead<R, AnyDelimiterCodec>;

fn request_lines<R: AsyncRead>(rd: R, max: usize) -> RequestLines<R> {
    let codec = AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), b"\n".to_vec(), max);
    FramedRead::with_capacity(rd, codec, 64 * 1024)
}

#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    Line(Bytes),
    Eof,
    TooLong,
}

/// The next line; a read error ends the connection as the end of input does.
async fn next_line<R: AsyncRead + Unpin>(lines: &mut RequestLines<R>) -> LineRead {
    match lines.next().await {
        Some(Ok(line)) => LineRead::Line(line),
        Some(Err(AnyDelimiterCodecError::MaxChunkLengthExceeded)) => LineRead::TooLong,
        Some(Err(AnyDelimiterCodecError::Io(_))) | None => LineRead::Eof,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<LineRead> {
        // Input in small pieces, so lines span several reads.
        let mut reader: Box<dyn AsyncRead + Unpin> = Box::new(tokio::io::empty());
        for piece in input.chunks(3) {
            reader = Box::new(reader.chain(piece));
        }
        let mut lines = request_lines(reader, max);
        let mut out = Vec::new();
        loop {
            let res = next_line(&mut lines).await;
            let stop = !matches!(res, LineRead::Line(_));
            out.push(res);
            if stop {
                return out;
            }
        }
    }

    fn line(text: &'static [u8]) -> LineRead {
        LineRead::Line(Bytes::from_static(text))
    }

    #[tokio::test]
    async fn lines_are_split_and_limited() {
        let got = lines(b"ab\ncdefg\n\nxyz", 5).await;
        let expect = vec![
            line(b"ab"),
            line(b"cdefg"),
            line(b""),
            line(b"xyz"),
            LineRead::Eof,
        ];
        assert_eq!(got, expect);
        let got = lines(b"ok\ntoolong\nnext\n", 5).await;
        assert_eq!(got[0], line(b"ok"));
        assert_eq!(got[1], LineRead::TooLong);
        assert_eq!(got.len(), 2);
    }

    #[tokio::test]
    async fn a_line_that_is_not_utf8_is_still_a_line() {
        let got = lines(b"\xff\xfe{}\n{}\n", 64).await;
        assert_eq!(got, vec![line(b"\xff\xfe{}"), line(b"{}"), LineRead::Eof]);
    }

    #[test]
    fn a_hello_naming_another_cell_is_refused() {
        let cell_one = Access {
            role: None,
            token: Some(Token::new("t")),
            cell: Some(1),
        };
        assert_eq!(cell_one.refusal("t", Some(1)), None);
        // No cell named: an old client, or a ledger without a cell map.
        assert_eq!(cell_one.refusal("t", None), None);
        assert_eq!(
            cell_one.refusal("t", Some(2)).as_deref(),
            Some("this spot-core is cell 1; the client expected cell 2")
        );
        assert_eq!(
            cell_one.refusal("x", Some(1)).as_deref(),
            Some("wrong token")
        );
        // An engine without a cell id accepts any.
        let any = Access::default();
        assert_eq!(any.refusal("", Some(7)), None);
    }

    /// One connection: `lines` written at once, every answer read until the server closes it
    /// or `answers` came.
    async fn session(addr: &str, lines: &str, answers: usize) -> Vec<serde_json::Value> {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(lines.as_bytes()).await.unwrap();
        let mut reader = BufReader::new(stream).lines();
        let mut out = Vec::new();
        while out.len() < answers {
            match tokio::time::timeout(Duration::from_secs(10), reader.next_line()).await {
                Ok(Ok(Some(line))) => out.push(serde_json::from_str(&line).unwrap()),
                Ok(_) => break,
                Err(_) => panic!("no answer in time after {out:?}"),
            }
        }
        out
    }

    /// A hello's map version (ADR 0023 §1), with and without a token: a higher one than the
    /// engine knew is recorded (the journal has it) before the `ok`; an equal one and none are
    /// `ok`; a lower one is refused `STALE_MAP` and the connection closed, so a movement
    /// pipelined after it never reaches the engine.
    #[tokio::test]
    async fn a_hello_naming_an_older_map_is_refused_stale_map() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, wal, _) = crate::wal::open(
            crate::assets::Assets::builtin(),
            dir.path(),
            &crate::wal::StorageOptions::default(),
        )
        .unwrap();
        let (handle, _thread) =
            crate::wal::spawn_committer(engine, wal, crate::storage::FailPoints::default())
                .unwrap();
        for token in [None, Some(Token::new("t"))] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let access = Access {
                token,
                ..Access::default()
            };
            tokio::spawn(serve(listener, handle.clone(), access));
            let hello = |v: Option<u64>| {
                let v = v.map_or(String::new(), |v| format!(r#","map_version":{v}"#));
                format!("{{\"op\":\"hello\",\"token\":\"t\"{v}}}\n")
            };
            let status = "{\"op\":\"status\"}\n";
            let ok =
                serde_json::json!({"status": "ok", "protocol": crate::protocol::PROTOCOL_VERSION});
            let got = session(&addr, &format!("{}{status}", hello(Some(2))), 2).await;
            assert_eq!(got[0], ok);
            assert_eq!(got[1]["core"]["map_version"], 2);
            for v in [Some(2), None] {
                let got = session(&addr, &format!("{}{status}", hello(v)), 2).await;
                assert_eq!(got[0], ok, "{v:?}");
                assert_eq!(got[1]["core"]["map_version"], 2);
                assert_eq!(got[1]["core"]["last_seq"], 1, "nothing more recorded");
            }
            let deposit = format!(
                r#"{{"op":"deposit","req_id":"{}","user_id":1,"asset":"USDT","amount":"1"}}"#,
                crate::ulid::for_label("after a stale hello")
            );
            let got = session(&addr, &format!("{}{deposit}\n", hello(Some(1))), 2).await;
            assert_eq!(got.len(), 1, "closed after the refusal: {got:?}");
            assert_eq!(got[0]["code"], "STALE_MAP");
            assert_eq!(
                got[0]["message"],
                "this client routes by map version 1; this spot-core has seen version 2: \
                 reload the map"
            );
        }
        let records = handle
            .call(Request::Journal {
                after_seq: 0,
                limit: 10,
            })
            .await
            .unwrap();
        let Response::Ok {
            records: Some(records),
            ..
        } = records
        else {
            panic!("{records:?}");
        };
        assert_eq!(
            records,
            vec![crate::protocol::JournalRecord::MapVersion(
                crate::protocol::MapVersionRecord { seq: 1, version: 2 }
            )]
        );
    }
}
