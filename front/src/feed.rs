//! The event feed under a cell map (ADR 0017 §8, contract §8): each cell keeps its own dense,
//! gap-free feed, so an admin's `GET /api/v1/events` and `GET /api/v1/events/stream` read every
//! cell's feed after the cursor's position for it (`1:5120,2:4987,3:5011`) and merge them.
//!
//! The merge is a k-way merge of the cells' pages: it always takes the head of the page whose
//! head event was recorded first (ties: the lower cell id), so each cell's events keep their
//! feed order, and the cells are interleaved by their recording time. Only the per-cell order is
//! a promise: no engine gives a dense order across cells without one sequencer. Each event names
//! its `cell`; `next_after` and `head` are cursors. A partition move's copy of an event (one
//! with an `origin`, ADR 0023 §5) is passed over, its cell's position advancing past it: the
//! merged feed gave that event from the cell it was appended in, so each event of a moved user
//! reaches a merged reader once. A cell that cannot be read leaves its
//! position where it was (so nothing of it is ever skipped) and the page says `partial` and
//! names it in `cells_down`; the stream goes on with the other cells and asks that one again.
//!
//! The front router (`route.rs`) sends an admin's GET of these two paths here; a user's token
//! still goes to its own cell, which refuses the feed as today (403). Without a map none of
//! this runs: `query_api`'s feed serves today's bare positions. The page size rule and the whole
//! of the stream but its reads are `query_api::feed_stream`'s, shared with that feed.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;

use application::reads::{event_json, FeedEvent};
use async_trait::async_trait;
use axum::extract::{FromRef, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::routing::get;
use axum::{Json, Router};
use cells::{CellId, FeedCursor};
use edge::admission::Admission;
use edge::auth::{AdminUser, JwtKeys};
use edge::error::ApiError;
use edge::reads::ReadSide;
use futures_util::stream::Stream;
use query_api::feed_stream::{self, page_limit, Sent, StreamSource, STREAM_BATCH_MAX};
use serde_json::{json, Value};
use tower_http::trace::TraceLayer;

use crate::slot::Slots;

/// The HTTP feed's path.
pub const EVENTS_PATH: &str = "/api/v1/events";
/// The SSE feed's path.
pub const STREAM_PATH: &str = "/api/v1/events/stream";

/// Every cell's slot (its read side while it serves), the keys that verify an admin's token
/// and the merged feed's own admission (its stream slots and read turns, shared by every
/// merged read, whichever cells are up). Cheap to clone.
#[derive(Clone)]
pub struct CellFeeds {
    slots: Slots,
    keys: Arc<JwtKeys>,
    admission: Arc<Admission>,
}

impl FromRef<CellFeeds> for Arc<JwtKeys> {
    fn from_ref(feeds: &CellFeeds) -> Self {
        feeds.keys.clone()
    }
}

impl CellFeeds {
    /// The feeds of the cells in `slots` (at least one), tokens verified with `jwt_secret`.
    pub fn new(slots: Slots, jwt_secret: &[u8]) -> Self {
        Self {
            slots,
            keys: Arc::new(JwtKeys::new(jwt_secret)),
            admission: Arc::new(Admission::default()),
        }
    }

    fn ids(&self) -> Vec<CellId> {
        self.slots.ids()
    }

    fn cursor(&self, text: Option<&String>) -> Result<FeedCursor, ApiError> {
        FeedCursor::parse(text.map_or("", String::as_str), &self.ids())
            .map_err(|e| ApiError::BadRequest(format!("`after`: {e}")))
    }

    /// The read side of each cell, `None` for a cell that does not serve now (not reached, or
    /// marked down by its watcher).
    fn reads(&self) -> Vec<(CellId, Option<ReadSide>)> {
        self.slots
            .all()
            .iter()
            .map(|(&cell, slot)| (cell, slot.serving().map(|s| s.reads)))
            .collect()
    }

    /// Each cell's page after the cursor's position for it, read at once; `Err` for a cell that
    /// could not be read (or is down).
    async fn pages(&self, after: &FeedCursor, limit: i64) -> Vec<CellPage> {
        let reads = self.reads().into_iter().map(|(cell, reads)| async move {
            let events = match reads {
                Some(reads) => reads
                    .feed_after(after.get(cell), limit, None)
                    .await
                    .map_err(|e| e.to_string()),
                None => Err("the cell is down".to_owned()),
            };
            CellPage { cell, events }
        });
        futures_util::future::join_all(reads).await
    }

    /// Each cell's last feed position; `Err` for a cell that could not be read (or is down).
    async fn heads(&self) -> Vec<(CellId, Result<i64, String>)> {
        let heads = self.reads().into_iter().map(|(cell, reads)| async move {
            let head = match reads {
                Some(reads) => reads.feed_head().await.map_err(|e| e.to_string()),
                None => Err("the cell is down".to_owned()),
            };
            (cell, head)
        });
        futures_util::future::join_all(heads).await
    }
}

/// One cell's read: its events, or why it could not be read.
struct CellPage {
    cell: CellId,
    events: Result<Vec<FeedEvent>, String>,
}

/// Is `path` one of the feed's two routes?
pub fn is_feed(path: &str) -> bool {
    path == EVENTS_PATH || path == STREAM_PATH
}

/// The two feed routes over every cell, with the limits, panic catching and tracing every
/// cell's router has.
pub fn router(feeds: CellFeeds, http: edge::http_server::HttpLimits) -> Router {
    Router::new()
        .route(EVENTS_PATH, get(events))
        .route(STREAM_PATH, get(stream_events))
        .layer(axum::middleware::from_fn_with_state(
            http,
            edge::http_server::request_limits,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            edge::error::panic_response,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(feeds)
}

/// The merge of the cells' pages (see the module's comment): at most `limit` events, each with
/// its cell, every cell's events in their feed order.
pub fn merge(pages: Vec<(CellId, Vec<FeedEvent>)>, limit: usize) -> Vec<(CellId, FeedEvent)> {
    let mut queues: Vec<(CellId, VecDeque<FeedEvent>)> = pages
        .into_iter()
        .map(|(cell, events)| (cell, events.into()))
        .collect();
    let mut out = Vec::new();
    while out.len() < limit {
        let next = queues
            .iter_mut()
            .filter_map(|(cell, q)| q.front().map(|e| (e.recorded_at, *cell)))
            .min();
        let Some((_, cell)) = next else { break };
        let queue = queues
            .iter_mut()
            .find(|(c, _)| *c == cell)
            .map(|(_, q)| q)
            .expect("the chosen cell has a queue");
        let event = queue.pop_front().expect("the chosen queue has a head");
        out.push((cell, event));
    }
    out
}

/// An event as the merged feed shows it: the one-cell JSON and its `cell`.
pub fn cell_event_json(cell: CellId, e: &FeedEvent) -> Value {
    let mut v = event_json(e);
    v["cell"] = json!(cell.get());
    v
}

/// `GET /api/v1/events?after=CURSOR&limit=M` (admin) under a map.
async fn events(
    State(feeds): State<CellFeeds>,
    _admin: AdminUser,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let after = feeds.cursor(params.get("after"))?;
    let limit = page_limit(&params)?;
    let (pages, heads) = tokio::join!(feeds.pages(&after, limit), feeds.heads());
    let mut down = Vec::new();
    let mut read = Vec::new();
    for page in pages {
        match page.events {
            Ok(events) => read.push((page.cell, events)),
            Err(e) => {
                tracing::warn!(cell = %page.cell, error = %e, "feed: a cell cannot be read");
                down.push(page.cell);
            }
        }
    }
    let merged = merge(read, usize::try_from(limit).unwrap_or(usize::MAX));
    let mut next = after.clone();
    for (cell, e) in &merged {
        next.set(*cell, e.position);
    }
    let mut head = after.clone();
    for (cell, at) in heads {
        match at {
            Ok(at) => head.set(cell, at),
            Err(_) if !down.contains(&cell) => down.push(cell),
            Err(_) => {}
        }
    }
    down.sort();
    let mut body = json!({
        "events": merged
            .iter()
            .filter(|(_, e)| e.origin.is_none())
            .map(|(c, e)| cell_event_json(*c, e))
            .collect::<Vec<_>>(),
        "next_after": next.to_string(),
        "head": head.to_string(),
    });
    if !down.is_empty() {
        body["partial"] = json!(true);
        body["cells_down"] = json!(down.iter().map(|c| c.get()).collect::<Vec<_>>());
    }
    Ok(Json(body))
}

/// `GET /api/v1/events/stream?after=CURSOR&follow=B` (admin) under a map: the merged feed as
/// server-sent events, each `id` the whole cursor after that event (what `Last-Event-ID` resumes
/// from); with `follow=false`, every cell's events up to its head when the stream was opened.
async fn stream_events(
    State(feeds): State<CellFeeds>,
    admin: AdminUser,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let resume =
        feed_stream::last_event_id(&headers).and_then(|v| FeedCursor::parse(v, &feeds.ids()).ok());
    let after = match resume {
        Some(cursor) => cursor,
        None => feeds.cursor(params.get("after"))?,
    };
    // Not following: every cell's events up to its head as read here (a cell that cannot be
    // read now has nothing more to send).
    let until = match feed_stream::follow(&params)? {
        true => None,
        false => {
            let mut until = after.clone();
            for (cell, head) in feeds.heads().await {
                if let Ok(head) = head {
                    until.set(cell, head.max(after.get(cell)));
                }
            }
            Some(until)
        }
    };
    let admission = Arc::clone(&feeds.admission);
    let merged = Merged {
        feeds,
        cursor: after,
        until,
    };
    feed_stream::serve(merged, admission, &admin)
}

/// Every cell's feed for a stream, merged after `cursor`; each event's id is the whole cursor
/// after it. A cell that cannot be read is asked again at the next look (its position stays,
/// so nothing of it is skipped), and the stream goes on with the others.
struct Merged {
    feeds: CellFeeds,
    cursor: FeedCursor,
    /// Each cell's head when a stream that does not follow was opened.
    until: Option<FeedCursor>,
}

#[async_trait]
impl StreamSource for Merged {
    async fn next_batch(&mut self) -> Result<Option<Vec<Sent>>, String> {
        if let Some(until) = &self.until {
            let ids = self.feeds.ids();
            if ids.iter().all(|&c| self.cursor.get(c) >= until.get(c)) {
                return Ok(None);
            }
        }
        let mut read = Vec::new();
        for page in self.feeds.pages(&self.cursor, STREAM_BATCH_MAX).await {
            match page.events {
                Ok(mut events) => {
                    if let Some(until) = &self.until {
                        events.retain(|e| e.position <= until.get(page.cell));
                    }
                    read.push((page.cell, events));
                }
                Err(e) => tracing::warn!(cell = %page.cell, error = %e,
                    "event stream: a cell cannot be read; asked again at the next look"),
            }
        }
        // A partition move's copy is passed over (its cursor advances): the merged feed gave
        // the event once already, from the cell it was appended in.
        let sent = merge(read, usize::MAX)
            .into_iter()
            .filter_map(|(cell, e)| {
                self.cursor.set(cell, e.position);
                e.origin.is_none().then(|| Sent {
                    id: self.cursor.to_string(),
                    event: e.event_type.clone(),
                    data: cell_event_json(cell, &e),
                })
            })
            .collect();
        Ok(Some(sent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn event(position: i64, at_ms: i64) -> FeedEvent {
        let at = Utc.timestamp_millis_opt(at_ms).unwrap();
        FeedEvent {
            position,
            event_id: format!("Transfer:x:{position}"),
            global_position: position,
            aggregate_type: "Transfer".into(),
            aggregate_id: "x".into(),
            sequence: position,
            event_type: "TransferCreated".into(),
            event_version: "1".into(),
            payload: json!({}),
            user_id: Some(1),
            occurred_at: at,
            recorded_at: at,
            origin: None,
        }
    }

    fn cell(id: u64) -> CellId {
        CellId::new(id).unwrap()
    }

    #[test]
    fn the_merge_interleaves_by_time_and_keeps_each_cells_order() {
        let one = vec![event(1, 10), event(2, 30), event(3, 50)];
        // Cell 2's positions were recorded out of time order: its feed order still wins.
        let two = vec![event(1, 20), event(2, 5), event(3, 40)];
        let merged = merge(vec![(cell(1), one), (cell(2), two)], 10);
        let got: Vec<(u16, i64)> = merged.iter().map(|(c, e)| (c.get(), e.position)).collect();
        assert_eq!(got, [(1, 1), (2, 1), (2, 2), (1, 2), (2, 3), (1, 3)]);
        // Ties go to the lower cell; the limit cuts the merge.
        let tie = merge(
            vec![(cell(2), vec![event(1, 7)]), (cell(1), vec![event(1, 7)])],
            1,
        );
        assert_eq!(tie[0].0, cell(1));
        assert_eq!(tie.len(), 1);
    }

    #[test]
    fn a_merged_event_names_its_cell() {
        let v = cell_event_json(cell(3), &event(4, 0));
        assert_eq!(v["cell"], 3);
        assert_eq!(v["position"], 4);
    }
}
