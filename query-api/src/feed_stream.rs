//! What every feed route shares, whichever feed it serves: one database's dense positions
//! (`feed.rs`), or under a cell map every cell's feed merged behind a cursor (`front::feed`).
//! The page size rule of `GET /api/v1/events`, and the whole of `GET /api/v1/events/stream`
//! but its reads: where a reconnecting client resumes (`Last-Event-ID` wins over `after`), the
//! stream's slot, its read turns, its polling when there is nothing new, `follow=false`'s end at
//! the head, and its end when the token that opened it expires (the client reconnects with a fresh one). A feed gives only its
//! cursor and its next batch ([`StreamSource`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;

use application::reads::FEED_PAGE_SIZE_MAX;
use edge::admission::Admission;
use edge::auth::AdminUser;
use edge::error::ApiError;

/// Page size when `limit` is not given.
pub const FEED_PAGE_SIZE_DEFAULT: i64 = 100;

/// How often a stream with nothing new looks at the feed again.
pub const STREAM_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Events a stream asks for per look (of each cell, under a map).
pub const STREAM_BATCH_MAX: i64 = 500;

/// `GET /api/v1/events`' `limit`: 1 to [`FEED_PAGE_SIZE_MAX`], [`FEED_PAGE_SIZE_DEFAULT`] when
/// absent; anything else is BAD_REQUEST naming it.
pub fn page_limit(params: &HashMap<String, String>) -> Result<i64, ApiError> {
    let limit = match params.get("limit") {
        None => FEED_PAGE_SIZE_DEFAULT,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ApiError::BadRequest("`limit` must be a non-negative integer".to_owned())
            })?,
    };
    if limit == 0 || limit > FEED_PAGE_SIZE_MAX {
        return Err(ApiError::BadRequest(format!(
            "`limit` must be between 1 and {FEED_PAGE_SIZE_MAX}"
        )));
    }
    Ok(limit)
}

/// One event as a stream sends it.
pub struct Sent {
    /// The cursor right after this event: what `Last-Event-ID` resumes from.
    pub id: String,
    /// The event's type (the SSE `event` field).
    pub event: String,
    /// The event as `GET /api/v1/events` lists it.
    pub data: Value,
}

/// A feed as a stream reads it: it keeps its own position and moves it past each batch.
#[async_trait]
pub trait StreamSource: Send + 'static {
    /// The next events after the position, at most [`STREAM_BATCH_MAX`] (of each cell), in
    /// feed order; empty when there is nothing new yet; `None` when a stream that does not
    /// follow has sent everything up to the head it was opened at. An error ends the stream (the
    /// client reconnects with `Last-Event-ID`, so nothing is skipped).
    async fn next_batch(&mut self) -> Result<Option<Vec<Sent>>, String>;
}

/// The stream's `follow`: `true` (the default) keeps it open for new events; `false` ends it
/// at the head it found when it was opened. Anything else is BAD_REQUEST.
pub fn follow(params: &HashMap<String, String>) -> Result<bool, ApiError> {
    match params.get("follow").map(String::as_str) {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(_) => Err(ApiError::BadRequest(
            "`follow` must be true or false".into(),
        )),
    }
}

/// The `Last-Event-ID` a reconnecting client sent, if any.
pub fn last_event_id(headers: &HeaderMap) -> Option<&str> {
    headers.get("last-event-id").and_then(|v| v.to_str().ok())
}

/// `source` as server-sent events for `admin`, forever: it takes one of `admission`'s stream
/// slots (429 RATE_LIMIT_EXCEEDED when none is free) and holds it as long as it lives, takes a
/// read turn for each look, waits [`STREAM_POLL_INTERVAL`] when there is nothing new or the
/// read side is busy, and ends when the admin's token expires.
pub fn serve<S: StreamSource>(
    source: S,
    admission: Arc<Admission>,
    admin: &AdminUser,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let slot = admission
        .event_stream()
        .map_err(|_| ApiError::Refused(domain::ErrorCode::RateLimitExceeded))?;
    let left = admin
        .expires_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    let stream = events(source, admission, slot).take_until(tokio::time::sleep(left));
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// What a stream holds between events.
struct Streaming<S> {
    source: S,
    admission: Arc<Admission>,
    pending: std::vec::IntoIter<Sent>,
    _slot: OwnedSemaphorePermit,
}

fn events<S: StreamSource>(
    source: S,
    admission: Arc<Admission>,
    slot: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = Streaming {
        source,
        admission,
        pending: Vec::new().into_iter(),
        _slot: slot,
    };
    stream::unfold(Some(state), |state| async move {
        let mut st = state?;
        loop {
            if let Some(sent) = st.pending.next() {
                let event = Event::default()
                    .id(sent.id)
                    .event(sent.event)
                    .data(sent.data.to_string());
                return Some((Ok(event), Some(st)));
            }
            let admission = Arc::clone(&st.admission);
            let Ok(_turn) = admission.read().await else {
                tokio::time::sleep(STREAM_POLL_INTERVAL).await;
                continue;
            };
            match st.source.next_batch().await {
                Ok(None) => return None,
                Ok(Some(batch)) if batch.is_empty() => {
                    tokio::time::sleep(STREAM_POLL_INTERVAL).await;
                }
                Ok(Some(batch)) => st.pending = batch.into_iter(),
                Err(e) => {
                    tracing::warn!(error = %e, "event stream ends: feed unreadable");
                    return None;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(limit: Option<&str>) -> HashMap<String, String> {
        limit
            .map(|l| HashMap::from([("limit".to_owned(), l.to_owned())]))
            .unwrap_or_default()
    }

    #[test]
    fn a_page_is_one_to_the_most_and_the_default_when_absent() {
        assert_eq!(page_limit(&params(None)).ok(), Some(FEED_PAGE_SIZE_DEFAULT));
        assert_eq!(page_limit(&params(Some("7"))).ok(), Some(7));
        let most = FEED_PAGE_SIZE_MAX.to_string();
        assert_eq!(
            page_limit(&params(Some(&most))).ok(),
            Some(FEED_PAGE_SIZE_MAX)
        );
        for bad in ["0", "-1", "x", "1001", ""] {
            assert!(page_limit(&params(Some(bad))).is_err(), "{bad}");
        }
    }
}
