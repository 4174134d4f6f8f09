//! The HTTP server: accepts connections and serves the router over HTTP/1.1 with the limits that
//! `axum::serve` does not set, so no client can hold a connection, a descriptor or a worker
//! for free:
//! - a connection waiting for a request's headers (a new one, or an idle keep-alive one) is
//!   closed after [`HttpLimits::header_read_timeout`], however slowly it trickles them;
//! - a request must be read and answered (up to its response head) within
//!   [`HttpLimits::request_timeout`], body included;
//! - a `Content-Length` over the body limit is refused before any of the body is read;
//! - at most [`HttpLimits::connections_max`] connections are open at once, and at most
//!   [`HttpLimits::connections_per_address_max`] from one address; a connection over a cap is
//!   closed at once. A websocket keeps its slot until it closes.
//!
//! Shutdown stops accepting, lets requests in progress finish, and closes idle connections.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header::CONTENT_LENGTH;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::config::{BODY_BYTES_MAX, BULK_TRANSFERS_PATH};
use crate::error::ApiError;

/// The server's timeouts and caps. Defaults suit one process on a small machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest wait for a request's complete headers, from the moment the connection is ready
    /// for one (`LEDGER_HTTP_HEADER_TIMEOUT_MS`).
    pub header_read_timeout: Duration,
    /// Longest a request may take from its headers to its response head, reading its body
    /// included (`LEDGER_HTTP_REQUEST_TIMEOUT_MS`). Streams (SSE, websockets) answer their head
    /// at once and are bounded by their token's expiry instead.
    pub request_timeout: Duration,
    /// Connections open at once (`LEDGER_HTTP_CONNECTIONS_MAX`).
    pub connections_max: usize,
    /// Connections open at once from one IP address (`LEDGER_HTTP_CONNECTIONS_PER_ADDRESS_MAX`).
    pub connections_per_address_max: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            // A transfer is answered once it is final or its next step is unknown; spot-core
            // calls time out after 5 s, so 30 s leaves ample room.
            request_timeout: Duration::from_secs(30),
            connections_max: 4_096,
            connections_per_address_max: 256,
        }
    }
}

/// Refuses a body declared larger than the limit before reading it, and bounds a request's
/// time (body read included) by `request_timeout`.
pub async fn request_limits(
    State(limits): State<HttpLimits>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u128>().ok());
    // The bulk route's larger limit is its own (the command side's bulk route), enforced while its body is read.
    let limit = if request.uri().path() == BULK_TRANSFERS_PATH {
        u128::MAX
    } else {
        BODY_BYTES_MAX as u128
    };
    if declared.is_some_and(|n| n > limit) {
        return ApiError::PayloadTooLarge(BODY_BYTES_MAX).into_response();
    }
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::RequestTimeout.into_response(),
    }
}

/// Open connections, in all and per address.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// One admitted connection; dropping it frees its slots.
#[derive(Debug)]
struct Slot {
    open: Arc<Mutex<Open>>,
    address: IpAddr,
}

impl Slot {
    fn admit(open: &Arc<Mutex<Open>>, address: IpAddr, limits: &HttpLimits) -> Option<Self> {
        let mut counts = open.lock().unwrap_or_else(|e| e.into_inner());
        let mine = counts.per_address.get(&address).copied().unwrap_or(0);
        if counts.total >= limits.connections_max || mine >= limits.connections_per_address_max {
            return None;
        }
        counts.total += 1;
        counts.per_address.insert(address, mine + 1);
        Some(Self {
            open: open.clone(),
            address,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.open.lock().unwrap_or_else(|e| e.into_inner());
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_address.get_mut(&self.address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Only addresses with open connections are remembered.
                counts.per_address.remove(&self.address);
            }
        }
    }
}

/// A connection that carries its slot: an upgraded websocket keeps the stream, and so the slot,
/// until it closes.
struct Counted {
    stream: TcpStream,
    _slot: Slot,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Serves `app` on `listener` with `limits` until `shutdown` completes, then stops accepting and
/// waits for the connections in progress (a caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let open = Arc::new(Mutex::new(Open::default()));
    // Connections hold a receiver each: the sender's `closed()` says when all have ended.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of descriptors or a connection reset before accept: wait a little rather
                // than spin, then go on.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = Slot::admit(&open, peer.ip(), &limits) else {
            tracing::debug!(%peer, "connection refused: over the connection cap");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Counted {
            stream,
            _slot: slot,
        });
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(BODY_BYTES_MAX.max(8 * 1024) * 4);
            let conn = builder.serve_connection(io, service).with_upgrades();
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => log_end(result),
                _ = async { stop.wait_for(|stopping| *stopping).await.map(|_| ()) } => {
                    conn.as_mut().graceful_shutdown();
                    log_end(conn.await);
                }
            }
            drop(stop);
        });
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(true);
    stop_tx.closed().await;
    Ok(())
}

fn log_end(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_in_all_and_per_address_and_freed_on_drop() {
        let limits = HttpLimits {
            connections_max: 3,
            connections_per_address_max: 2,
            ..HttpLimits::default()
        };
        let open = Arc::new(Mutex::new(Open::default()));
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let a1 = Slot::admit(&open, a, &limits).unwrap();
        let a2 = Slot::admit(&open, a, &limits).unwrap();
        assert!(Slot::admit(&open, a, &limits).is_none(), "per address");
        let b1 = Slot::admit(&open, b, &limits).unwrap();
        assert!(Slot::admit(&open, b, &limits).is_none(), "in all");
        drop(a1);
        assert!(Slot::admit(&open, b, &limits).is_some());
        drop((a2, b1));
        assert_eq!(open.lock().unwrap().total, 0);
        assert!(open.lock().unwrap().per_address.is_empty());
    }
}
