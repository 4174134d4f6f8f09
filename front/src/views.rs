//! The front's fan-out routes (ADR 0017 §4, §5, §11): the admin views asked of every cell and
//! merged (`fanout.rs` merges), `/metrics` with a `cell` label on every sample, and an asset
//! change written to the home cell first, then to every other cell.

use axum::body::Body;
use axum::extract::{Query, Request};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cells::CellId;
use edge::error::ApiError;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::fanout::{self, Answers, Position};
use crate::route::Front;
use crate::slot::{self, Refusal};

/// The default and largest page of the admin transfers list (`query-api`'s).
const TRANSFERS_PAGE_DEFAULT: usize = 50;
const TRANSFERS_PAGE_MAX: usize = 500;
const ALERTS_PAGE_DEFAULT: usize = 50;
const STUCK_PAGE_DEFAULT: usize = 100;

/// An admin route the front answers across cells.
pub enum View {
    Transfers,
    Overview,
    Cells,
    Alerts,
    Invariant,
    Stuck,
    PutAsset,
}

impl Front {
    /// The fan-out route `method` and `path` name, if any.
    pub(crate) fn admin_view(&self, method: &Method, path: &str) -> Option<View> {
        match (method.clone(), path) {
            (Method::GET, "/api/v1/admin/transfers") => Some(View::Transfers),
            (Method::GET, "/api/v1/admin/overview") => Some(View::Overview),
            (Method::GET, "/api/v1/admin/cells") => Some(View::Cells),
            (Method::GET, "/api/v1/admin/alerts") => Some(View::Alerts),
            (Method::GET, "/api/v1/admin/invariant") => Some(View::Invariant),
            (Method::GET, "/api/v1/admin/transfers/stuck") => Some(View::Stuck),
            (Method::PUT, p) if p.starts_with("/api/v1/admin/assets/") => Some(View::PutAsset),
            _ => None,
        }
    }

    /// One cell's answer to a GET of `uri`: `None` when the cell is down or saturated.
    pub(crate) async fn ask(
        &self,
        cell: CellId,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Option<(u16, Value)> {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(uri.clone())
            .body(Body::empty())
            .expect("a GET of a valid URI is valid");
        *req.headers_mut() = headers.clone();
        let answer = self.forward(cell, req).await;
        let status = answer.status().as_u16();
        let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .ok()?;
        let body: Value = serde_json::from_slice(&bytes).ok()?;
        if status == 503 && body["cell"].as_u64() == Some(u64::from(cell.get())) {
            return None;
        }
        Some((status, body))
    }

    /// The same GET asked of every cell at once.
    async fn ask_every(&self, uri: &Uri, headers: &HeaderMap) -> Answers {
        let cells: Vec<CellId> = self.cells().collect();
        self.ask_cells(&cells, uri, headers).await
    }

    /// The same GET asked of each of `cells` at once.
    pub(crate) async fn ask_cells(
        &self,
        cells: &[CellId],
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Answers {
        let asks = cells.iter().map(|c| self.ask(*c, uri, headers));
        let answers = futures_util::future::join_all(asks).await;
        cells.iter().copied().zip(answers).collect()
    }

    /// `GET /metrics`: every cell's figures with its `cell` label, and `ledger_cell_up`.
    pub(crate) async fn metrics(&self) -> Response {
        let mut families = Vec::new();
        let mut up = Vec::new();
        for (cell, slot) in self.slots.all().iter() {
            let text = match slot.serving() {
                Some(served) => cell_metrics(served.metrics).await,
                None => None,
            };
            up.push((*cell, text.is_some()));
            if let Some(text) = text {
                fanout::relabel_metrics(&mut families, *cell, &text);
            }
        }
        (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            fanout::metrics_text(&families, &up),
        )
            .into_response()
    }
}

/// One cell's `/metrics` text, `None` when it did not answer 200.
async fn cell_metrics(app: axum::Router) -> Option<String> {
    let req = Request::builder()
        .uri("/metrics")
        .body(Body::empty())
        .expect("a GET of /metrics is valid");
    let answer = app.oneshot(req).await.ok()?;
    if answer.status() != StatusCode::OK {
        return None;
    }
    let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .ok()?;
    String::from_utf8(bytes.to_vec()).ok()
}

impl View {
    /// Answers `req` across the cells of `front`.
    pub async fn run(self, front: &Front, req: Request) -> Response {
        match self {
            Self::PutAsset => put_asset(front, req).await,
            Self::Transfers => transfers(front, req).await,
            Self::Overview | Self::Cells | Self::Alerts | Self::Invariant | Self::Stuck => {
                let (parts, _) = req.into_parts();
                let answers = front.ask_every(&parts.uri, &parts.headers).await;
                if let Some(refusal) = first_refusal(&answers) {
                    return refusal;
                }
                let merged = match self {
                    Self::Overview => {
                        let states: Vec<Value> =
                            front.slots.all().values().map(|s| s.describe()).collect();
                        fanout::overview(&answers, &states)
                    }
                    Self::Cells => fanout::cells(&answers),
                    Self::Alerts => {
                        let limit = query_usize(&parts.uri, "limit").unwrap_or(ALERTS_PAGE_DEFAULT);
                        fanout::alerts(&answers, limit)
                    }
                    Self::Stuck => {
                        let limit = query_usize(&parts.uri, "limit").unwrap_or(STUCK_PAGE_DEFAULT);
                        fanout::stuck(&answers, limit)
                    }
                    _ => fanout::invariant(&answers),
                };
                (StatusCode::OK, Json(merged)).into_response()
            }
        }
    }
}

/// A request every cell refused alike (4xx: a bad query, a token refused) is answered with the
/// first cell's refusal, as one cell would answer it.
pub(crate) fn first_refusal(answers: &Answers) -> Option<Response> {
    answers.values().flatten().find_map(|(status, body)| {
        let status = StatusCode::from_u16(*status).ok()?;
        status
            .is_client_error()
            .then(|| (status, Json(body.clone())).into_response())
    })
}

/// `name`'s value in `uri`'s query, parsed.
pub(crate) fn query_usize(uri: &Uri, name: &str) -> Option<usize> {
    query_pairs(uri)
        .into_iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
}

pub(crate) fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map(|q| q.0)
        .unwrap_or_default()
}

/// `uri` with `after` set to `after` (or left out) and `limit` set to `limit`.
fn with_page(uri: &Uri, after: Option<&str>, limit: usize) -> Uri {
    let mut query: Vec<String> = query_pairs(uri)
        .into_iter()
        .filter(|(k, _)| k != "after" && k != "limit")
        .map(|(k, v)| format!("{}={}", encode(&k), encode(&v)))
        .collect();
    if let Some(after) = after {
        query.push(format!("after={}", encode(after)));
    }
    query.push(format!("limit={limit}"));
    format!("{}?{}", uri.path(), query.join("&"))
        .parse()
        .expect("a path with an encoded query is a URI")
}

/// Percent-encodes all but the unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The page a transfers listing asks for: its `limit` and each cell's position. `Err(None)` for
/// a `limit` out of range (a cell's own refusal answers it), `Err(Some(_))` for a cursor that
/// does not parse.
fn page_asked(uri: &Uri, cells: &[CellId]) -> Result<(usize, Positions), Option<ApiError>> {
    let pairs = query_pairs(uri);
    let value = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let limit = match value("limit").map(str::parse::<usize>) {
        None => TRANSFERS_PAGE_DEFAULT,
        Some(Ok(n)) if (1..=TRANSFERS_PAGE_MAX).contains(&n) => n,
        Some(_) => return Err(None),
    };
    let positions = fanout::parse_positions(value("after"), cells).ok_or_else(|| {
        Some(ApiError::BadRequest(
            "`after` must be a cursor this listing returned".into(),
        ))
    })?;
    Ok((limit, positions))
}

type Positions = std::collections::BTreeMap<CellId, Position>;

/// One cell's page of the listing `parts` asks for, from `at`, at most `limit` rows.
async fn cell_page(
    front: &Front,
    parts: &axum::http::request::Parts,
    cell: CellId,
    at: Position,
    limit: usize,
) -> Option<(u16, Value)> {
    let uri = match at {
        Position::End => return Some((200, json!({"transfers": [], "next": null}))),
        Position::Start => with_page(&parts.uri, None, limit),
        Position::After(c) => with_page(&parts.uri, Some(&c), limit),
    };
    front.ask(cell, &uri, &parts.headers).await
}

/// `GET /api/v1/admin/transfers` across cells: each cell's page from its own position, merged
/// newest first, the next cursor naming each cell's position after this page (`fanout.rs`).
async fn transfers(front: &Front, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    let cells: Vec<CellId> = front.cells().collect();
    let (limit, mut positions) = match page_asked(&parts.uri, &cells) {
        Ok(asked) => asked,
        Err(None) => {
            let req = Request::from_parts(parts, Body::empty());
            return front.forward(front.any_cell(), req).await;
        }
        Err(Some(refused)) => return refused.into_response(),
    };
    let asks = cells
        .iter()
        .map(|c| cell_page(front, &parts, *c, positions[c].clone(), limit));
    let answers: Answers = cells
        .iter()
        .copied()
        .zip(futures_util::future::join_all(asks).await)
        .collect();
    if let Some(refusal) = first_refusal(&answers) {
        return refusal;
    }
    let (rows, taken) = fanout::merge_transfers(&answers, limit);
    for (cell, answer) in &answers {
        let Some((200, body)) = answer else {
            continue;
        };
        let returned = body["transfers"].as_array().map_or(0, Vec::len);
        let took = taken.get(cell).copied().unwrap_or(0);
        let next = if took == returned {
            Some(body["next"].clone())
        } else if took > 0 {
            // Where this cell stops: its own cursor after exactly the rows taken.
            let again = cell_page(front, &parts, *cell, positions[cell].clone(), took).await;
            again.and_then(|(status, body)| (status == 200).then(|| body["next"].clone()))
        } else {
            None
        };
        if let Some(next) = next {
            let at = next
                .as_str()
                .map_or(Position::End, |c| Position::After(c.to_owned()));
            positions.insert(*cell, at);
        }
    }
    let page = fanout::transfers_page(rows, fanout::encode_positions(&positions), &answers);
    (StatusCode::OK, Json(page)).into_response()
}

/// `PUT /api/v1/admin/assets/{symbol}` (ADR 0017 §4): written to the home cell, which checks
/// and stores it; then laid over every other cell up now (a cell down catches up before it
/// serves again, `watch.rs`). With the home cell down the change is refused (503 naming it) and
/// nothing changes anywhere.
async fn put_asset(front: &Front, req: Request) -> Response {
    let home = front.home();
    let Some(home_slot) = front.slots.get(&home) else {
        return ApiError::Internal("no home cell".into()).into_response();
    };
    if home_slot.serving().is_none() {
        return slot::refused(home, &Refusal::Down);
    }
    let answer = front.forward(home, req).await;
    if answer.status() != StatusCode::OK {
        return answer;
    }
    let Some(home_store) = home_slot.serving().map(|s| s.assets.store().clone()) else {
        return answer;
    };
    for (cell, slot) in front.slots.all().iter().filter(|(c, _)| **c != home) {
        let Some(served) = slot.serving() else {
            tracing::warn!(%cell, "asset change not applied to a cell that is down; it catches up before it serves again");
            continue;
        };
        if let Err(e) = served.assets.copy_from(home_store.as_ref()).await {
            tracing::warn!(%cell, error = %e, "asset change not applied yet; the cell's watcher retries");
        }
    }
    answer
}
