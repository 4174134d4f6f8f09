//! GraphQL subscriptions over a websocket under a cell map (`/graphql/ws`, ADR 0017 §5). The
//! token is in the socket's first message (`connection_init`'s payload), not in a header, so
//! the front cannot route the upgrade request by it: it accepts the socket itself, reads that
//! message (for at most `query_api::graphql::WS_INIT_WAIT_MAX`), verifies the token with the
//! same keys as every cell, and relays the socket to the cell that serves the caller:
//!
//! - a user's: the user's cell, frame for frame (`relay`), so the subscription is exactly the
//!   one-cell one, over the user's own cell's feed;
//! - an admin's: every cell that is up, one inner socket each, merged (`Merge`): each message
//!   of the client goes to every cell, each cell's updates come through as they come (each
//!   `TransferUpdate` names its `cell`, and its `position` is that cell's feed position), one
//!   `connection_ack` once every cell acknowledged (its payload names the `cells` relayed and the
//!   `down_cells` left out), one `complete` of an operation once every cell completed it, and an
//!   error every cell gives alike (a query that does not validate) once. `?cell=N` on the upgrade
//!   URL relays an admin's socket to cell N alone (to resume one cell's updates exactly with
//!   `after`, which is one cell's position);
//! - no verifiable token (or a first message that is not `connection_init`): the home cell,
//!   which refuses it as one cell does.
//!
//! The init message goes to the chosen cells unchanged, and each cell verifies it again and
//! closes the socket when the token expires; an inner socket that ends closes the client's (and
//! every other inner socket). Each inner socket is a connection to the cell's own router over an
//! in-memory pipe (`tokio::io::duplex`, served by hyper with upgrades, a tungstenite client on
//! the other end), so the cell's own `/graphql/ws` serves it with its own admission and limits.
//! A cell that is down (or whose bulkhead is full) when the socket opens: a user's socket is
//! closed at once with 1013 (try again later) naming the cell; an admin's goes on with the other
//! cells and names it in `down_cells`. An `Authorization` header on the upgrade request is not
//! what authorizes the subscription (the init payload is, in each cell), so it is not what
//! routes it either.

use std::collections::{HashMap, HashSet};

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request};
use axum::http::header::SEC_WEBSOCKET_PROTOCOL;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cells::CellId;
use edge::auth::Identity;
use edge::config::BODY_BYTES_MAX;
use futures_util::stream::{BoxStream, SelectAll, SplitSink};
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use query_api::graphql::{ws_init_token, WS_INIT_WAIT_MAX, WS_PROTOCOLS};
use serde_json::{json, Value};
use tokio::io::DuplexStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, protocol::frame::coding::CloseCode};
use tokio_tungstenite::WebSocketStream;

use crate::route::Front;
use crate::slot::Refusal;

/// GraphQL's websocket route.
pub const WS_PATH: &str = "/graphql/ws";

/// The in-memory pipe's buffer, each way.
const PIPE_BYTES: usize = 64 * 1024;
/// "Try again later" (RFC 6455's registry): a user's cell is down when the socket opens.
const TRY_AGAIN_LATER: u16 = 1013;

/// One inner socket: the client's side of a connection to one cell's router.
type Inner = WebSocketStream<DuplexStream>;

impl Front {
    /// Whether `path` is GraphQL's websocket route (methods here, so the front router needs no
    /// path into this module: no import circle).
    pub(crate) fn is_ws(path: &str) -> bool {
        path == WS_PATH
    }

    /// The websocket route's answer (`upgrade`).
    pub(crate) async fn ws_upgrade(&self, req: Request) -> Response {
        upgrade(self, req).await
    }
}

/// `GET /graphql/ws` under a cell map: the socket is taken here and relayed to the caller's
/// cell(s) once its first message names the caller. A request that is not a websocket
/// handshake of a protocol GraphQL speaks goes to the home cell, which refuses it as one cell
/// does.
pub(crate) async fn upgrade(front: &Front, req: Request) -> Response {
    // `?cell=N`: an admin's socket to cell N alone.
    let only = match crate::checks::named_cell(front, req.uri()) {
        Ok(only) => only,
        Err(refused) => return refused.into_response(),
    };
    let Some(protocol) = graphql_protocol(&req) else {
        return front.forward(front.any_cell(), req).await;
    };
    let (mut parts, body) = req.into_parts();
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(_) => {
            let req = Request::from_parts(parts, body);
            return front.forward(front.any_cell(), req).await;
        }
    };
    let front = front.clone();
    upgrade
        .protocols(WS_PROTOCOLS)
        .max_message_size(BODY_BYTES_MAX)
        .max_frame_size(BODY_BYTES_MAX)
        .on_upgrade(move |socket| serve(front, socket, protocol, only))
}

/// The first protocol of the client's `Sec-WebSocket-Protocol` that GraphQL speaks here.
fn graphql_protocol(req: &Request) -> Option<&'static str> {
    req.headers()
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|asked| {
            WS_PROTOCOLS
                .iter()
                .find(|p| p.eq_ignore_ascii_case(asked.trim()))
                .copied()
        })
}

/// Serves one client socket: reads its first message, picks the cells, relays.
async fn serve(front: Front, mut client: WebSocket, protocol: &'static str, only: Option<CellId>) {
    let Ok(Some(first)) = tokio::time::timeout(WS_INIT_WAIT_MAX, first_message(&mut client)).await
    else {
        return;
    };
    let identity = init_identity(&front, &first);
    let merged = identity.is_some_and(|id| id.admin) && only.is_none();
    let cells: Vec<CellId> = match identity {
        Some(id) if id.admin => only.map_or_else(|| front.cells().collect(), |c| vec![c]),
        Some(id) => vec![front.cell_of(id.user_id)],
        None => vec![front.any_cell()],
    };
    let mut inners = Vec::new();
    let mut down = Vec::new();
    for cell in cells {
        match open(&front, cell, protocol).await {
            Ok(inner) => inners.push((cell, inner)),
            Err(why) => {
                tracing::warn!(%cell, why, "a websocket's cell could not be reached");
                down.push((cell, why));
            }
        }
    }
    if inners.is_empty() {
        let reason = down
            .first()
            .map_or_else(|| "no cell is up".to_owned(), |(_, why)| why.clone());
        let frame = CloseFrame {
            code: TRY_AGAIN_LATER,
            reason: reason.into(),
        };
        let _ = client.send(Message::Close(Some(frame))).await;
        return;
    }
    let Some(first) = to_cell(first) else {
        return;
    };
    if merged {
        let down: Vec<u16> = down.iter().map(|(c, _)| c.get()).collect();
        merge(client, first, inners, down).await;
    } else if let Some((_, inner)) = inners.pop() {
        relay(client, first, inner).await;
    }
}

/// The client's first message other than a ping or a pong (answered by the socket itself);
/// `None` once the socket ended.
async fn first_message(client: &mut WebSocket) -> Option<Message> {
    loop {
        match client.recv().await? {
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(message) => return Some(message),
            Err(_) => return None,
        }
    }
}

/// Who the first message's token names, if it is a `connection_init` whose token verifies.
fn init_identity(front: &Front, first: &Message) -> Option<Identity> {
    let Message::Text(text) = first else {
        return None;
    };
    let init: Value = serde_json::from_str(text.as_str()).ok()?;
    if init["type"] != "connection_init" {
        return None;
    }
    front.keys.verify(ws_init_token(&init["payload"])?).ok()
}

/// A websocket to `cell`'s own router over an in-memory pipe, or why not (the cell is down or
/// its bulkhead is full: its permit is held only for the handshake, as for any request).
async fn open(front: &Front, cell: CellId, protocol: &'static str) -> Result<Inner, String> {
    let slot = front
        .slots
        .get(&cell)
        .ok_or_else(|| format!("no cell {cell}"))?;
    let (app, permit) = slot.admit().map_err(|why| match why {
        Refusal::Down => format!("cell {cell} is unavailable; retry later"),
        Refusal::Saturated => format!("cell {cell} has too many requests in flight; retry later"),
    })?;
    let (near, far) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(async move {
        let served = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(far), TowerToHyperService::new(app))
            .with_upgrades();
        if let Err(e) = served.await {
            tracing::debug!(error = %e, "a cell's inner websocket connection ended with an error");
        }
    });
    let mut request = format!("ws://cell-{cell}{WS_PATH}")
        .into_client_request()
        .map_err(|e| e.to_string())?;
    request.headers_mut().insert(
        SEC_WEBSOCKET_PROTOCOL,
        axum::http::HeaderValue::from_static(protocol),
    );
    let (inner, answer) = tokio_tungstenite::client_async(request, near)
        .await
        .map_err(|e| format!("cell {cell}: websocket handshake: {e}"))?;
    drop(permit);
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(format!("cell {cell} answered {}", answer.status()));
    }
    Ok(inner)
}

/// A user's socket: every frame each way, as is, until either side ends.
async fn relay(client: WebSocket, first: tungstenite::Message, inner: Inner) {
    let (mut to_cell_sink, mut from_cell) = inner.split();
    let (mut to_client, mut from_client) = client.split();
    if to_cell_sink.send(first).await.is_err() {
        return;
    }
    let up = async {
        while let Some(Ok(message)) = from_client.next().await {
            let Some(message) = to_cell(message) else {
                continue;
            };
            if to_cell_sink.send(message).await.is_err() {
                break;
            }
        }
    };
    let down = async {
        while let Some(Ok(message)) = from_cell.next().await {
            let Some(message) = to_client_message(message) else {
                continue;
            };
            if to_client.send(message).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// What the merge asks to be done with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// Send this text to the client.
    Client(String),
    /// Send this text to every cell.
    Cells(String),
    /// Send this text to one cell (by its place in the merge).
    Cell(usize, String),
}

/// An admin's socket over several cells: what goes where (graphql-transport-ws and graphql-ws
/// alike: `subscribe`/`start` open an operation, `complete`/`stop` end it, `next`/`data` carry
/// its results).
#[derive(Debug)]
struct Merge {
    cells: Vec<u16>,
    down_cells: Vec<u16>,
    acked: HashSet<usize>,
    ack_sent: bool,
    /// Each open operation's cells that have not completed it yet.
    open: HashMap<String, usize>,
    /// The error-only results already sent, per operation: every cell refuses a bad query alike.
    errors_sent: HashSet<(String, String)>,
}

impl Merge {
    fn new(cells: Vec<u16>, down_cells: Vec<u16>) -> Self {
        Self {
            cells,
            down_cells,
            acked: HashSet::new(),
            ack_sent: false,
            open: HashMap::new(),
            errors_sent: HashSet::new(),
        }
    }

    /// A text message of the client.
    fn on_client(&mut self, text: &str) -> Vec<Action> {
        let message: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let id = message["id"].as_str().map(str::to_owned);
        match message["type"].as_str() {
            Some("subscribe" | "start") => {
                if let Some(id) = id {
                    self.open.insert(id, self.cells.len());
                }
                vec![Action::Cells(text.to_owned())]
            }
            // Answered here: a cell's pong would come once per cell.
            Some("ping") => vec![Action::Client(json!({"type": "pong"}).to_string())],
            Some("pong") => Vec::new(),
            // complete/stop, a second init, connection_terminate, or what no cell understands
            // (each answers it as one cell does).
            _ => vec![Action::Cells(text.to_owned())],
        }
    }

    /// A text message of the cell at place `from`.
    fn on_cell(&mut self, from: usize, text: &str) -> Vec<Action> {
        let Ok(message) = serde_json::from_str::<Value>(text) else {
            return vec![Action::Client(text.to_owned())];
        };
        let id = message["id"].as_str().unwrap_or_default().to_owned();
        match message["type"].as_str() {
            Some("connection_ack") => {
                self.acked.insert(from);
                if self.ack_sent || self.acked.len() < self.cells.len() {
                    return Vec::new();
                }
                self.ack_sent = true;
                let ack = json!({"type": "connection_ack",
                    "payload": {"cells": self.cells, "down_cells": self.down_cells}});
                vec![Action::Client(ack.to_string())]
            }
            Some("next" | "data") => {
                let payload = &message["payload"];
                let error_only = payload["data"].is_null() && payload["errors"].is_array();
                if error_only && !self.errors_sent.insert((id, payload["errors"].to_string())) {
                    return Vec::new();
                }
                vec![Action::Client(text.to_owned())]
            }
            Some("complete") => {
                let Some(left) = self.open.get_mut(&id) else {
                    return Vec::new();
                };
                *left = left.saturating_sub(1);
                if *left > 0 {
                    return Vec::new();
                }
                self.open.remove(&id);
                self.errors_sent.retain(|(op, _)| *op != id);
                vec![Action::Client(text.to_owned())]
            }
            Some("ping") => vec![Action::Cell(from, json!({"type": "pong"}).to_string())],
            Some("pong" | "ka") => Vec::new(),
            _ => vec![Action::Client(text.to_owned())],
        }
    }
}

/// One message of one cell, by its place in the merge.
type FromCells = SelectAll<BoxStream<'static, (usize, Result<tungstenite::Message, String>)>>;

/// An admin's socket over `inners` (every cell up), merged; `down` are the cells left out.
async fn merge(
    client: WebSocket,
    first: tungstenite::Message,
    inners: Vec<(CellId, Inner)>,
    down: Vec<u16>,
) {
    let cells: Vec<u16> = inners.iter().map(|(c, _)| c.get()).collect();
    let mut state = Merge::new(cells, down);
    let mut sinks = Vec::new();
    let mut streams = Vec::new();
    for (at, (_, inner)) in inners.into_iter().enumerate() {
        let (sink, stream) = inner.split();
        sinks.push(sink);
        streams.push(
            stream
                .map(move |m| (at, m.map_err(|e| e.to_string())))
                .boxed(),
        );
    }
    let mut from_cells: FromCells = futures_util::stream::select_all(streams);
    let (mut to_client, mut from_client) = client.split();
    for sink in &mut sinks {
        if sink.send(first.clone()).await.is_err() {
            return;
        }
    }
    loop {
        let actions = tokio::select! {
            message = from_client.next() => match message {
                Some(Ok(Message::Text(text))) => state.on_client(text.as_str()),
                Some(Ok(Message::Close(frame))) => {
                    let close = to_cell(Message::Close(frame));
                    for sink in &mut sinks {
                        if let Some(close) = close.clone() {
                            let _ = sink.send(close).await;
                        }
                    }
                    return;
                }
                Some(Ok(Message::Binary(bytes))) => {
                    for sink in &mut sinks {
                        let _ = sink.send(tungstenite::Message::Binary(bytes.clone())).await;
                    }
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return,
            },
            message = from_cells.next() => match message {
                Some((at, Ok(tungstenite::Message::Text(text)))) => state.on_cell(at, text.as_str()),
                Some((_, Ok(tungstenite::Message::Close(frame)))) => {
                    if let Some(close) = to_client_message(tungstenite::Message::Close(frame)) {
                        let _ = to_client.send(close).await;
                    }
                    return;
                }
                Some((_, Ok(tungstenite::Message::Binary(bytes)))) => {
                    let _ = to_client.send(Message::Binary(bytes)).await;
                    continue;
                }
                Some((_, Ok(_))) => continue,
                // A cell's socket ended: so does the client's (it reconnects to every cell).
                Some((_, Err(_))) | None => return,
            },
        };
        if !perform(actions, &mut to_client, &mut sinks).await {
            return;
        }
    }
}

/// Sends what the merge decided, in order: false once a socket would not take a message (the
/// merged socket then ends).
async fn perform(
    actions: Vec<Action>,
    to_client: &mut SplitSink<WebSocket, Message>,
    sinks: &mut [SplitSink<Inner, tungstenite::Message>],
) -> bool {
    for action in actions {
        let sent = match action {
            Action::Client(text) => to_client.send(Message::text(text)).await.is_ok(),
            Action::Cells(text) => {
                let mut all = true;
                for sink in sinks.iter_mut() {
                    all &= sink
                        .send(tungstenite::Message::text(text.clone()))
                        .await
                        .is_ok();
                }
                all
            }
            Action::Cell(at, text) => sinks[at]
                .send(tungstenite::Message::text(text))
                .await
                .is_ok(),
        };
        if !sent {
            return false;
        }
    }
    true
}

/// A client's message as the cell's socket takes it; pings and pongs stay on their own hop.
fn to_cell(message: Message) -> Option<tungstenite::Message> {
    match message {
        Message::Text(text) => Some(tungstenite::Message::text(text.as_str())),
        Message::Binary(bytes) => Some(tungstenite::Message::Binary(bytes)),
        Message::Close(frame) => Some(tungstenite::Message::Close(frame.map(|f| {
            tungstenite::protocol::CloseFrame {
                code: CloseCode::from(f.code),
                reason: f.reason.as_str().into(),
            }
        }))),
        Message::Ping(_) | Message::Pong(_) => None,
    }
}

/// A cell's message as the client's socket takes it; pings and pongs stay on their own hop.
fn to_client_message(message: tungstenite::Message) -> Option<Message> {
    match message {
        tungstenite::Message::Text(text) => Some(Message::text(text.as_str())),
        tungstenite::Message::Binary(bytes) => Some(Message::Binary(bytes)),
        tungstenite::Message::Close(frame) => Some(Message::Close(frame.map(|f| CloseFrame {
            code: u16::from(f.code),
            reason: f.reason.as_str().into(),
        }))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(text: &str) -> Action {
        Action::Client(text.to_owned())
    }

    #[test]
    fn one_ack_once_every_cell_acknowledged_naming_the_cells() {
        let mut merge = Merge::new(vec![1, 3], vec![2]);
        let init = r#"{"type":"connection_init","payload":{"token":"t"}}"#;
        assert_eq!(merge.on_client(init), [Action::Cells(init.to_owned())]);
        let ack = r#"{"type":"connection_ack"}"#;
        assert!(merge.on_cell(0, ack).is_empty());
        let sent = merge.on_cell(1, ack);
        let [Action::Client(text)] = sent.as_slice() else {
            panic!("{sent:?}");
        };
        let ack: Value = serde_json::from_str(text).unwrap();
        assert_eq!(ack["payload"], json!({"cells": [1, 3], "down_cells": [2]}));
        assert!(merge.on_cell(0, r#"{"type":"connection_ack"}"#).is_empty());
    }

    #[test]
    fn updates_pass_and_an_operation_completes_once_every_cell_completed_it() {
        let mut merge = Merge::new(vec![1, 2], Vec::new());
        let subscribe = r#"{"id":"1","type":"subscribe","payload":{"query":"subscription { x }"}}"#;
        assert_eq!(
            merge.on_client(subscribe),
            [Action::Cells(subscribe.to_owned())]
        );
        let next = r#"{"id":"1","type":"next","payload":{"data":{"x":1}}}"#;
        assert_eq!(merge.on_cell(1, next), [client(next)]);
        assert_eq!(merge.on_cell(0, next), [client(next)]);
        let complete = r#"{"id":"1","type":"complete"}"#;
        assert!(merge.on_cell(0, complete).is_empty());
        assert_eq!(merge.on_cell(1, complete), [client(complete)]);
        assert!(
            merge.on_cell(1, complete).is_empty(),
            "an operation completes once"
        );
    }

    #[test]
    fn an_error_every_cell_gives_alike_is_sent_once_and_pings_are_answered_here() {
        let mut merge = Merge::new(vec![1, 2, 3], Vec::new());
        merge.on_client(r#"{"id":"7","type":"start","payload":{"query":"nope"}}"#);
        let refused =
            r#"{"id":"7","type":"data","payload":{"data":null,"errors":[{"message":"bad"}]}}"#;
        assert_eq!(merge.on_cell(2, refused), [client(refused)]);
        assert!(merge.on_cell(0, refused).is_empty());
        assert!(merge.on_cell(1, refused).is_empty());
        assert_eq!(
            merge.on_client(r#"{"type":"ping"}"#),
            [client(r#"{"type":"pong"}"#)]
        );
        assert_eq!(
            merge.on_cell(1, r#"{"type":"ping"}"#),
            [Action::Cell(1, r#"{"type":"pong"}"#.to_owned())]
        );
        let stop = r#"{"id":"7","type":"stop"}"#;
        assert_eq!(merge.on_client(stop), [Action::Cells(stop.to_owned())]);
    }
}
