//! One connection to spot-core: its `hello` (token, cell, epoch, map version, protocol version),
//! the framing of requests, and one exchange or a pipelined one under a deadline.

use std::borrow::Cow;

use liveness::TcpLiveness;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use super::error::{ClientError, HELLO_REFUSED};
use crate::protocol::{HelloInfo, Request, Response};

/// One request, framed (its JSON and a newline).
pub(super) fn framed(req: &Request) -> Result<Vec<u8>, ClientError> {
    let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

/// Requests framed one after another, for one pipelined write.
pub(super) fn pipelined<'a>(
    reqs: impl Iterator<Item = Cow<'a, Request>>,
) -> Result<Vec<u8>, ClientError> {
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
pub(super) fn with_trace(req: &Request, trace: &str) -> Option<Request> {
    let (op, movement) = req.as_movement()?;
    let mut movement = movement.clone();
    movement.trace = Some(trace.to_owned());
    Some(match op {
        crate::protocol::MovementOp::Withdraw => Request::Withdraw(movement),
        crate::protocol::MovementOp::Deposit => Request::Deposit(movement),
        crate::protocol::MovementOp::Refund => Request::Refund(movement),
    })
}

#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stream: BufReader<TcpStream>,
    /// The engine's protocol version, from its answer to `hello` (1 without one).
    pub(super) protocol: u32,
    /// The epoch a replicated engine leads (ADR 0020 §4), from its answer to `hello`.
    pub(super) epoch: Option<u64>,
}

impl Conn {
    /// Connect and, with a token, authenticate. Every failure here is `Connect`: the request
    /// itself has not been sent yet.
    pub(super) async fn connect(
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
                // This engine has seen a newer cell map: not an engine still starting, nor one
                // to try again with the same map.
                Ok((
                    Response::Error {
                        code: crate::protocol::ErrorCode::StaleMap,
                        message,
                    },
                    _,
                )) => return Err(ClientError::StaleMap(message)),
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
    pub(super) fn looks_alive(&self) -> bool {
        if !self.stream.buffer().is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.stream.get_ref().try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Writes `count` framed requests at once and reads their `count` answers, in order, each
    /// within `deadline`. After the first failure to read (a broken connection, the deadline)
    /// every answer still missing is that failure: the request may have been applied.
    pub(super) async fn exchange_many(
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
                serde_json::from_slice(&answer)
                    .map_err(|e| ClientError::Protocol(e.to_string()))
                    .and_then(ClientError::surfaced),
            );
        }
        answers
    }

    /// `exchange`, with what a replica adds to its answer to `hello` read from the same line.
    pub(super) async fn exchange_raw(
        &mut self,
        line: &[u8],
    ) -> Result<(Response, HelloInfo), ClientError> {
        let answer = self.exchange_line(line).await?;
        let response =
            serde_json::from_slice(&answer).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let info = serde_json::from_slice(&answer).unwrap_or_default();
        Ok((response, info))
    }

    /// One exchange; a `MOVED` answer is [`ClientError::Moved`].
    pub(super) async fn exchange(&mut self, line: &[u8]) -> Result<Response, ClientError> {
        let answer = self.exchange_line(line).await?;
        serde_json::from_slice(&answer)
            .map_err(|e| ClientError::Protocol(e.to_string()))
            .and_then(ClientError::surfaced)
    }

    /// Writes one request line and reads its whole answer line.
    pub(super) async fn exchange_line(&mut self, line: &[u8]) -> Result<Vec<u8>, ClientError> {
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
