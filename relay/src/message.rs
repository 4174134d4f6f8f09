//! One feed event as a JetStream message: its subject, its headers and its body. Pure; the body
//! is exactly the HTTP feed's JSON of the event (`projections::feed::event_json`).

use async_nats::HeaderMap;
use bytes::Bytes;
use projections::feed::{event_json, FeedEvent};

/// Every subject the relay publishes on starts with this; the stream captures `ledger.events.>`.
pub const SUBJECT_PREFIX: &str = "ledger.events";

/// The user token of an event that belongs to no user.
pub const NO_USER_TOKEN: &str = "system";

/// The feed position of the event (dense, gap-free, 1, 2, 3, ...).
pub const HEADER_POSITION: &str = "Ledger-Position";
/// The aggregate id: for a transfer, its `req_id`; for a deposit, its `external_id`.
pub const HEADER_REQ_ID: &str = "Ledger-Req-Id";
/// The event's user id; absent when the event has none.
pub const HEADER_USER_ID: &str = "Ledger-User-Id";
/// The event type, e.g. `TransferCommitted`.
pub const HEADER_EVENT_TYPE: &str = "Ledger-Event-Type";
/// The event's schema version, e.g. `1`.
pub const HEADER_EVENT_VERSION: &str = "Ledger-Event-Version";
/// JetStream's de-duplication key: the event's `event_id`.
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";
/// JetStream refuses the message unless the stream's last sequence is this one: the fence that
/// keeps the stream in feed order whatever happens to the relay, its connection or its lock.
pub const HEADER_EXPECTED_LAST_SEQUENCE: &str = "Nats-Expected-Last-Sequence";

/// The cell whose feed a message carries (ADR 0017 §8); absent without a cell map.
pub const HEADER_CELL: &str = "Ledger-Cell";

/// The subjects the relay's stream is made of.
pub fn stream_subjects() -> String {
    stream_subjects_for(None)
}

/// The subjects of a cell's stream: `ledger.cells.<cell>.events.>` (so no two cells' streams,
/// nor the one-cell stream's `ledger.events.>`, overlap on one NATS server); without a cell,
/// today's.
pub fn stream_subjects_for(cell: Option<u16>) -> String {
    format!("{}.>", subject_prefix(cell))
}

/// `ledger.events`, or `ledger.cells.<cell>.events` for a cell's feed.
pub fn subject_prefix(cell: Option<u16>) -> String {
    match cell {
        None => SUBJECT_PREFIX.to_owned(),
        Some(cell) => format!("ledger.cells.{cell}.events"),
    }
}

/// `ledger.events.<event_type>.<user_id>`, or `.system` for an event without a user. Anything in
/// the event type a NATS subject token cannot hold (`.`, `*`, `>`, white space, ...) becomes `_`.
pub fn subject(e: &FeedEvent) -> String {
    subject_for(e, None)
}

/// [`subject`] under a cell's prefix ([`subject_prefix`]):
/// `ledger.cells.<cell>.events.<event_type>.<user_id>`.
pub fn subject_for(e: &FeedEvent, cell: Option<u16>) -> String {
    let prefix = subject_prefix(cell);
    let event_type: String = e
        .event_type
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let event_type = if event_type.is_empty() {
        "_".to_owned()
    } else {
        event_type
    };
    match e.user_id {
        Some(user) => format!("{prefix}.{event_type}.{user}"),
        None => format!("{prefix}.{event_type}.{NO_USER_TOKEN}"),
    }
}

/// The headers of one event's message. `expected_last_sequence` is the stream sequence the
/// message must follow; 0 (an empty stream) asks for no check.
pub fn headers(e: &FeedEvent, expected_last_sequence: u64) -> HeaderMap {
    headers_for(e, expected_last_sequence, None)
}

/// [`headers`], with [`HEADER_CELL`] when the event is a cell's.
pub fn headers_for(e: &FeedEvent, expected_last_sequence: u64, cell: Option<u16>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(cell) = cell {
        h.insert(HEADER_CELL, cell.to_string().as_str());
    }
    h.insert(HEADER_MSG_ID, e.event_id.as_str());
    h.insert(HEADER_POSITION, e.position.to_string().as_str());
    h.insert(HEADER_REQ_ID, e.aggregate_id.as_str());
    if let Some(user) = e.user_id {
        h.insert(HEADER_USER_ID, user.to_string().as_str());
    }
    h.insert(HEADER_EVENT_TYPE, e.event_type.as_str());
    h.insert(HEADER_EVENT_VERSION, e.event_version.as_str());
    if expected_last_sequence > 0 {
        h.insert(
            HEADER_EXPECTED_LAST_SEQUENCE,
            expected_last_sequence.to_string().as_str(),
        );
    }
    h
}

/// The body: the event's JSON as `GET /api/v1/events` shows it.
pub fn body(e: &FeedEvent) -> Bytes {
    body_for(e, None)
}

/// [`body`]; a cell's event also names its `cell`, as the merged HTTP feed of a cell map shows
/// it.
pub fn body_for(e: &FeedEvent, cell: Option<u16>) -> Bytes {
    let mut v = event_json(e);
    if let Some(cell) = cell {
        v["cell"] = serde_json::json!(cell);
    }
    Bytes::from(v.to_string())
}

/// The feed position a stored message carries in its `Ledger-Position` header, if any.
pub fn position_of(headers: &HeaderMap) -> Option<i64> {
    headers
        .get(HEADER_POSITION)
        .and_then(|v| v.as_str().trim().parse::<i64>().ok())
        .filter(|p| *p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn event(event_type: &str, user_id: Option<i64>) -> FeedEvent {
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        FeedEvent {
            position: 42,
            event_id: "Transfer:01JABC:3".into(),
            global_position: 99,
            aggregate_type: "Transfer".into(),
            aggregate_id: "01JABC".into(),
            sequence: 3,
            event_type: event_type.into(),
            event_version: "1".into(),
            payload: serde_json::json!({"SourceWithdrawn": {"at": "2026-01-02T03:04:05Z"}}),
            user_id,
            occurred_at: at,
            recorded_at: at,
        }
    }

    #[test]
    fn subjects_filter_by_type_and_user() {
        assert_eq!(
            subject(&event("SourceWithdrawn", Some(7))),
            "ledger.events.SourceWithdrawn.7"
        );
        assert_eq!(
            subject(&event("AssetChanged", None)),
            "ledger.events.AssetChanged.system"
        );
        // A type that would break the subject's tokens cannot.
        assert_eq!(
            subject(&event("a.b *>c", Some(1))),
            "ledger.events.a_b___c.1"
        );
        assert_eq!(subject(&event("", Some(1))), "ledger.events._.1");
        assert_eq!(stream_subjects(), "ledger.events.>");
    }

    #[test]
    fn headers_carry_id_position_req_user_type_version_and_the_fence() {
        let h = headers(&event("SourceWithdrawn", Some(7)), 41);
        let get = |name: &str| h.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(get("Nats-Msg-Id").as_deref(), Some("Transfer:01JABC:3"));
        assert_eq!(get("Ledger-Position").as_deref(), Some("42"));
        assert_eq!(get("Ledger-Req-Id").as_deref(), Some("01JABC"));
        assert_eq!(get("Ledger-User-Id").as_deref(), Some("7"));
        assert_eq!(get("Ledger-Event-Type").as_deref(), Some("SourceWithdrawn"));
        assert_eq!(get("Ledger-Event-Version").as_deref(), Some("1"));
        assert_eq!(get("Nats-Expected-Last-Sequence").as_deref(), Some("41"));
        assert_eq!(position_of(&h), Some(42));

        let h = headers(&event("AssetChanged", None), 0);
        assert!(h.get("Ledger-User-Id").is_none());
        assert!(h.get("Nats-Expected-Last-Sequence").is_none());
        assert_eq!(position_of(&HeaderMap::new()), None);
    }

    #[test]
    fn the_body_is_the_http_feeds_json() {
        let e = event("SourceWithdrawn", Some(7));
        let parsed: serde_json::Value = serde_json::from_slice(&body(&e)).unwrap();
        assert_eq!(parsed, event_json(&e));
        assert_eq!(parsed["position"], 42);
        assert_eq!(parsed["event_id"], "Transfer:01JABC:3");
        assert_eq!(parsed["occurred_at"], "2026-01-02T03:04:05.000000Z");
    }
}
