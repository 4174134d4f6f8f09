//! The event feed for consumers (admin): `GET /api/v1/events?after=N&limit=M` returns events in
//! their dense feed order, each with its `event_id` for de-duplication (contract §8), and
//! `GET /api/v1/events/stream` sends the same as server-sent events.

use std::collections::HashMap;
use std::convert::Infallible;

use application::reads::event_json;
use async_trait::async_trait;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::sse::{Event, Sse};
use axum::Json;
use futures_util::stream::Stream;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::reads::ReadSide;
use edge::routes::Routes;
use edge::state::AppState;

use crate::feed_events::FeedStreamEvent;
use crate::feed_stream::{self, page_limit, Sent, StreamSource, STREAM_BATCH_MAX};

/// The feed's routes; merged into the application router.
pub fn routes() -> Routes {
    Routes::new()
        .api(Method::GET, "/api/v1/events", events)
        .api(Method::GET, "/api/v1/events/stream", stream_events)
}

/// A non-negative integer query parameter, or BAD_REQUEST naming it.
fn int_param(params: &HashMap<String, String>, name: &str, default: i64) -> Result<i64, ApiError> {
    match params.get(name) {
        None => Ok(default),
        Some(text) => text.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::BadRequest(format!("`{name}` must be a non-negative integer"))
        }),
    }
}

fn db_error(e: application::StoreError) -> ApiError {
    ApiError::store("feed", e)
}

/// `GET /api/v1/events?after=N&limit=M` (admin): events with `position > N`, in order, at most
/// `M` (1..=1000, default 100). `next_after` is what to ask with next; `head` is the last
/// position handed out so far.
#[utoipa::path(get, path = "/api/v1/events",
    params(FeedParams),
    responses((status = 200, description = "ok", body = FeedPage),
        edge::openapi::AdminListRefusals))]
async fn events(
    State(state): State<AppState>,
    _admin: AdminUser,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let after = int_param(&params, "after", 0)?;
    let limit = page_limit(&params)?;
    let rows = state
        .reads
        .feed_after(after, limit, None)
        .await
        .map_err(db_error)?;
    let head = state.reads.feed_head().await.map_err(db_error)?;
    let next_after = rows.last().map_or(after, |e| e.position);
    Ok(Json(json!({
        "events": rows.iter().map(event_json).collect::<Vec<_>>(),
        "next_after": next_after,
        "head": head,
    })))
}

/// `GET /api/v1/events/stream?after=N&follow=B` (admin): server-sent events from `position > N`
/// (or after the `Last-Event-ID` a reconnecting client sends), each with `id` = its position and
/// `event` = its type, then new events as they are projected; with `follow=false`, the events up
/// to the feed's head as the request found it, and then the stream ends.
#[utoipa::path(get, path = "/api/v1/events/stream",
    params(StreamParams,
        ("Last-Event-ID" = Option<String>, Header,
            description = "the last position a reconnecting client received (wins over `after`); \
            under a cell map the cursor it received")),
    responses((status = 200, description = "server-sent events (`text/event-stream`), endless \
        unless `follow=false`: each event's `id` is its position, its `event` its type (one of \
        `FeedStreamEvent`'s `event` values) and its `data` the event as `GET /api/v1/events` \
        lists it, as JSON text (`FeedStreamEvent` gives each event's fields, one schema per \
        event type); comments keep the connection alive; the stream ends when the token \
        expires",
        content_type = "text/event-stream", body = FeedStreamEvent),
        edge::openapi::StreamRefusals))]
async fn stream_events(
    State(state): State<AppState>,
    admin: AdminUser,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let resume = feed_stream::last_event_id(&headers)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|n| *n >= 0);
    let after = match resume {
        Some(n) => n,
        None => int_param(&params, "after", 0)?,
    };
    // Not following: the events there are now, up to the head as read here.
    let until = match feed_stream::follow(&params)? {
        true => None,
        false => Some(state.reads.feed_head().await.map_err(db_error)?),
    };
    let source = Positions {
        reads: state.reads.clone(),
        after,
        until,
    };
    feed_stream::serve(source, state.admission.clone(), &admin)
}

/// One database's feed for a stream: its dense positions after `after` (up to `until` when the
/// stream does not follow), each event's id its position.
struct Positions {
    reads: ReadSide,
    after: i64,
    until: Option<i64>,
}

#[async_trait]
impl StreamSource for Positions {
    async fn next_batch(&mut self) -> Result<Option<Vec<Sent>>, String> {
        if self.until.is_some_and(|u| self.after >= u) {
            return Ok(None);
        }
        let mut rows = self
            .reads
            .feed_after(self.after, STREAM_BATCH_MAX, None)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(until) = self.until {
            rows.retain(|e| e.position <= until);
        }
        if let Some(last) = rows.last() {
            self.after = last.position;
        }
        Ok(Some(
            rows.iter()
                .map(|e| Sent {
                    id: e.position.to_string(),
                    event: e.event_type.clone(),
                    data: event_json(e),
                })
                .collect(),
        ))
    }
}

// ---- the schema-only types of the OpenAPI document (`crate::openapi`): utoipa reads their
// fields' attributes, no code reads the fields.

/// `GET /api/v1/events`' query.
#[allow(dead_code)]
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FeedParams {
    /// Events with a position above this one (0 when absent). Under a cell map a cursor of one
    /// position per cell instead, `1:5120,2:4987,3:5011` (contract §8.1).
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Events per page: 1 to 1000 (100 when absent).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// `GET /api/v1/events/stream`' query.
#[allow(dead_code)]
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamParams {
    /// Events with a position above this one (0 when absent; `Last-Event-ID` wins). Under a cell
    /// map a cursor of one position per cell, `1:5120,2:4987,3:5011` (contract §8.1).
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// `true` (the default): after the events there are, wait for new ones, endlessly. `false`:
    /// the events up to the feed's head as the request finds it, then the stream ends.
    pub follow: Option<bool>,
}

/// A page of the feed.
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
pub struct FeedPage {
    pub events: Vec<FeedEventView>,
    /// What to ask with next (`after`). Under a cell map a cursor string, `1:5120,2:4987`.
    pub next_after: i64,
    /// The last position handed out so far. Under a cell map a cursor string of every cell's.
    pub head: i64,
}

/// One event of the global, gap-free, ordered feed (under a cell map: of its cell's feed).
#[allow(dead_code)]
#[derive(Debug, ToSchema)]
#[schema(as = FeedEvent)]
pub struct FeedEventView {
    pub position: i64,
    pub event_id: String,
    /// `Transfer` (a transfer's event; `aggregate_id` is its req_id) or `Deposit` (an external
    /// deposit's one `ExternalDeposited` event; `aggregate_id` is its external_id).
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: serde_json::Value,
    pub user_id: Option<i64>,
    pub occurred_at: String,
    /// Under a cell map only: the cell whose feed the event is in (`position` is that cell's).
    pub cell: Option<i64>,
}
