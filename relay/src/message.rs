//! One feed event as a JetStream message: its subject, its headers and its body. Pure; the body
//! is exactly the HTTP feed's JSON of the event (`projections::feed::event_json`).

use async_nats::{HeaderMap, HeaderName, Subject};
use bytes::Bytes;
use chrono::SecondsFormat;
use projections::feed::FeedEvent;
use serde::Serialize;

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
/// `ledger.cells.<cell>.events.<event_type>.<user_id>`. Made in one allocation (one per message
/// the relay publishes).
pub fn subject_for(e: &FeedEvent, cell: Option<u16>) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(48 + e.event_type.len());
    match cell {
        None => s.push_str(SUBJECT_PREFIX),
        Some(cell) => {
            let _ = write!(s, "ledger.cells.{cell}.events");
        }
    }
    s.push('.');
    if e.event_type.is_empty() {
        s.push('_');
    } else if e.event_type.bytes().all(subject_safe) {
        s.push_str(&e.event_type);
    } else {
        s.extend(e.event_type.chars().map(|c| {
            if c.is_ascii() && subject_safe(c as u8) {
                c
            } else {
                '_'
            }
        }));
    }
    s.push('.');
    match e.user_id {
        Some(user) => {
            let _ = write!(s, "{user}");
        }
        None => s.push_str(NO_USER_TOKEN),
    }
    s
}

/// A byte an event type keeps in a subject token.
fn subject_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// The headers of one event's message. `expected_last_sequence` is the stream sequence the
/// message must follow; 0 (an empty stream) asks for no check.
pub fn headers(e: &FeedEvent, expected_last_sequence: u64) -> HeaderMap {
    headers_for(e, expected_last_sequence, None)
}

/// [`headers`], with [`HEADER_CELL`] when the event is a cell's.
pub fn headers_for(e: &FeedEvent, expected_last_sequence: u64, cell: Option<u16>) -> HeaderMap {
    header_map(
        HeaderFields {
            event_id: e.event_id.clone(),
            position: e.position,
            aggregate_id: e.aggregate_id.clone(),
            user_id: e.user_id,
            event_type: e.event_type.clone(),
            event_version: e.event_version.clone(),
        },
        expected_last_sequence,
        cell,
    )
}

/// One event's message as the relay publishes it.
#[derive(Debug, Clone)]
pub struct Message {
    pub subject: Subject,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The message of `e`: [`subject_for`], [`headers_for`] and [`body_for`], made from the event
/// itself, whose strings move into the headers rather than being copied (what the relay does
/// with each event it publishes).
pub fn message_for(e: FeedEvent, expected_last_sequence: u64, cell: Option<u16>) -> Message {
    let subject = Subject::from(subject_for(&e, cell));
    let body = body_for(&e, cell);
    let fields = HeaderFields {
        event_id: e.event_id,
        position: e.position,
        aggregate_id: e.aggregate_id,
        user_id: e.user_id,
        event_type: e.event_type,
        event_version: e.event_version,
    };
    Message {
        subject,
        headers: header_map(fields, expected_last_sequence, cell),
        body,
    }
}

/// What the headers carry of an event.
struct HeaderFields {
    event_id: String,
    position: i64,
    aggregate_id: String,
    user_id: Option<i64>,
    event_type: String,
    event_version: String,
}

/// The headers of one message. The names are static (no allocation, no check per message); each
/// value is one string, the event's own where it has one.
fn header_map(f: HeaderFields, expected_last_sequence: u64, cell: Option<u16>) -> HeaderMap {
    const CELL: HeaderName = HeaderName::from_static(HEADER_CELL);
    const MSG_ID: HeaderName = HeaderName::from_static(HEADER_MSG_ID);
    const POSITION: HeaderName = HeaderName::from_static(HEADER_POSITION);
    const REQ_ID: HeaderName = HeaderName::from_static(HEADER_REQ_ID);
    const USER_ID: HeaderName = HeaderName::from_static(HEADER_USER_ID);
    const EVENT_TYPE: HeaderName = HeaderName::from_static(HEADER_EVENT_TYPE);
    const EVENT_VERSION: HeaderName = HeaderName::from_static(HEADER_EVENT_VERSION);
    const EXPECTED: HeaderName = HeaderName::from_static(HEADER_EXPECTED_LAST_SEQUENCE);
    let mut h = HeaderMap::new();
    if let Some(cell) = cell {
        h.insert(CELL, cell.to_string());
    }
    h.insert(MSG_ID, f.event_id);
    h.insert(POSITION, f.position.to_string());
    h.insert(REQ_ID, f.aggregate_id);
    if let Some(user) = f.user_id {
        h.insert(USER_ID, user.to_string());
    }
    h.insert(EVENT_TYPE, f.event_type);
    h.insert(EVENT_VERSION, f.event_version);
    if expected_last_sequence > 0 {
        h.insert(EXPECTED, expected_last_sequence.to_string());
    }
    h
}

/// The body: the event's JSON as `GET /api/v1/events` shows it.
pub fn body(e: &FeedEvent) -> Bytes {
    body_for(e, None)
}

/// [`body`]; a cell's event also names its `cell`, as the merged HTTP feed of a cell map shows
/// it. Written straight from the event (no `serde_json::Value` built, the payload not copied),
/// byte for byte what `event_json(e)` (with `cell` added) prints: the same keys, in the order a
/// `serde_json::Map` keeps them (sorted; the test `the_body_is_the_http_feeds_json_byte_for_byte`
/// holds it to that).
pub fn body_for(e: &FeedEvent, cell: Option<u16>) -> Bytes {
    let body = Body {
        aggregate_id: &e.aggregate_id,
        aggregate_type: &e.aggregate_type,
        cell,
        event_id: &e.event_id,
        event_type: &e.event_type,
        event_version: &e.event_version,
        occurred_at: e.occurred_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        payload: &e.payload,
        position: e.position,
        sequence: e.sequence,
        user_id: e.user_id,
    };
    let mut out = Vec::with_capacity(BODY_CAPACITY);
    // Writing into a Vec fails only if a serializer does, and these cannot.
    serde_json::to_writer(&mut out, &body).expect("a feed event serializes");
    Bytes::from(out)
}

/// Room for a typical body at once (they are a few hundred bytes).
const BODY_CAPACITY: usize = 512;

/// The fields of `event_json`, in `serde_json::Map`'s (sorted) order, with the cell's.
#[derive(Serialize)]
struct Body<'a> {
    aggregate_id: &'a str,
    aggregate_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cell: Option<u16>,
    event_id: &'a str,
    event_type: &'a str,
    event_version: &'a str,
    occurred_at: String,
    payload: &'a serde_json::Value,
    position: i64,
    sequence: i64,
    user_id: Option<i64>,
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
    use projections::feed::event_json;

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
            origin: None,
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
    fn the_body_is_the_http_feeds_json_byte_for_byte() {
        let mut e = event("SourceWithdrawn", Some(7));
        e.payload = serde_json::json!({
            "TransferCreated": {"z": [1, 2.5, null, true], "a": "quote \" é \\ \n \u{1}",
                "m": {"y": {}, "b": []}, "amount": "100.50000000"}
        });
        let printed = |e: &FeedEvent, cell: Option<u16>| {
            let mut v = event_json(e);
            if let Some(cell) = cell {
                v["cell"] = serde_json::json!(cell);
            }
            v.to_string()
        };
        for cell in [None, Some(0), Some(3)] {
            assert_eq!(body_for(&e, cell), printed(&e, cell).as_bytes());
            e.user_id = None;
            assert_eq!(body_for(&e, cell), printed(&e, cell).as_bytes());
            e.user_id = Some(i64::MAX);
        }
    }

    #[test]
    fn a_whole_message_is_its_parts() {
        let e = event("SourceWithdrawn", Some(7));
        for cell in [None, Some(2)] {
            let m = message_for(e.clone(), 41, cell);
            assert_eq!(m.subject.as_str(), subject_for(&e, cell));
            assert_eq!(m.headers, headers_for(&e, 41, cell));
            assert_eq!(m.body, body_for(&e, cell));
        }
    }

    #[test]
    fn subjects_under_a_cell_and_unsafe_types() {
        let mut e = event("TransferCommitted", Some(12));
        assert_eq!(
            subject_for(&e, Some(4)),
            "ledger.cells.4.events.TransferCommitted.12"
        );
        e.event_type = "é.x".into();
        e.user_id = None;
        assert_eq!(subject_for(&e, Some(0)), "ledger.cells.0.events.__x.system");
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
