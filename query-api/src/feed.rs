//! The event feed for consumers (admin): `GET /api/v1/events?after=N&limit=M` returns events in
//! their dense feed order, each with its `event_id` for de-duplication (contract §8), and
//! `GET /api/v1/events/stream` sends the same as server-sent events.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use application::reads::{event_json, FeedEvent, FEED_PAGE_SIZE_MAX};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;
use utoipa::{IntoParams, ToSchema};

use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

use crate::feed_events::FeedStreamEvent;

/// Page size when `limit` is not given.
pub const FEED_PAGE_SIZE_DEFAULT: i64 = 100;

/// How often a stream with nothing new looks at the feed again.
pub const STREAM_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Events sent per look by a stream.
const STREAM_BATCH_MAX: i64 = 500;

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
    let limit = int_param(&params, "limit", FEED_PAGE_SIZE_DEFAULT)?;
    if limit == 0 || limit > FEED_PAGE_SIZE_MAX {
        return Err(ApiError::BadRequest(format!(
            "`limit` must be between 1 and {FEED_PAGE_SIZE_MAX}"
        )));
    }
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
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|n| *n >= 0);
    let after = match resume {
        Some(n) => n,
        None => int_param(&params, "after", 0)?,
    };
    let follow = match params.get("follow").map(String::as_str) {
        None | Some("true") => true,
        Some("false") => false,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "`follow` must be true or false".into(),
            ))
        }
    };
    let slot = state
        .admission
        .event_stream()
        .map_err(|_| ApiError::Refused(domain::ErrorCode::RateLimitExceeded))?;
    // The stream ends when the token that opened it expires; the client reconnects with a
    // fresh token and `Last-Event-ID`.
    let left = admin
        .expires_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    // Not following: the events there are now, up to the head as read here.
    let until = match follow {
        true => None,
        false => Some(state.reads.feed_head().await.map_err(db_error)?),
    };
    let stream = feed_stream(state, after, until, slot).take_until(tokio::time::sleep(left));
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Feed events after `after` as SSE events, forever, or up to position `until` when given;
/// waits [`STREAM_POLL_INTERVAL`] whenever it has sent everything there is, or the read side is
/// busy. A database error ends the stream (the client reconnects with `Last-Event-ID`). `slot`
/// is held as long as the stream lives.
fn feed_stream(
    app: AppState,
    after: i64,
    until: Option<i64>,
    slot: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = (app, after, Vec::<FeedEvent>::new().into_iter(), slot);
    stream::unfold(Some(state), move |state| async move {
        let (app, mut after, mut pending, slot) = state?;
        loop {
            if let Some(e) = pending.next() {
                if until.is_some_and(|u| e.position > u) {
                    return None;
                }
                after = e.position;
                let event = Event::default()
                    .id(e.position.to_string())
                    .event(e.event_type.clone())
                    .data(event_json(&e).to_string());
                return Some((Ok(event), Some((app, after, pending, slot))));
            }
            if until.is_some_and(|u| after >= u) {
                return None;
            }
            let Ok(_turn) = app.admission.read().await else {
                tokio::time::sleep(STREAM_POLL_INTERVAL).await;
                continue;
            };
            let read = app.reads.feed_after(after, STREAM_BATCH_MAX, None);
            match read.await {
                Ok(rows) if rows.is_empty() => tokio::time::sleep(STREAM_POLL_INTERVAL).await,
                Ok(rows) => pending = rows.into_iter(),
                Err(e) => {
                    tracing::warn!(error = %e, "event stream ends: feed unreadable");
                    return None;
                }
            }
        }
    })
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
