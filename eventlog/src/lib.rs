//! The one crate that knows the `events` table: its SQL and its stored form. Every statement
//! that reads or writes `events` is here, named for its job; everyone else (the event store's
//! appender and reads in `adapters`, the projector and the replay in `projections`, the
//! tamper-evident log's follower, routes and `verify` in `tlog-follower`, recovery's stuck
//! listing and first trace, the feed and the relay's status) calls these functions and never
//! names the table (`scripts/one-event-reader` checks it).
//!
//! The stored form: one row per event, keyed by (`aggregate_type`, `aggregate_id`, `sequence`),
//! with `event_type`, `event_version`, the domain event's JSON `payload` (decoded through
//! `domain::stored`, which refuses a version without an upcaster: [`decode_transfer`]), the
//! envelope's `metadata` (the owner under [`OWNER_METADATA_KEY`], a traced creation's first trace
//! under [`TRACE_METADATA_KEY`]; never part of the tamper-evident leaf), the owner copied to
//! `user_id`, the domain time `occurred_at`, the dense `feed_position` handed out at append, the
//! appending transaction's `tx_id` (an `xid8`, read as text and cast: commit order is
//! `(tx_id, global_position)` below the commit watermark) and `recorded_at`.
//!
//! The views `feed` and `feed_head` (migrations 0013, 0015) are the same rows at their dense
//! feed positions; their reads are here too, so the feed, the relay and GraphQL's subscription
//! (through `projections::feed`) read the log through this crate as well.
//!
//! By job: `append` (the group commit's one INSERT) → `transfers` (one transfer's events, its
//! first trace, the audit's and the stuck listing's reads), `batches` (the projector's reads in
//! commit order), `entries` (reads by feed position for the tamper-evident log), `feed` (the
//! consumer feed) and `lag` (how far a reader of the log is behind). No module imports another
//! but through this root.
//! The statements' text is what it was where it came from: plans were measured on it.

pub mod append;
pub mod batches;
pub mod copies;
pub mod entries;
pub mod feed;
pub mod lag;
pub mod transfers;

use serde_json::Value;

/// The aggregate type of transfers (`events.aggregate_type`).
pub use application::reads::TRANSFER_AGGREGATE;

/// The metadata key under which a commit names its transfer's owner (a user id, as text).
pub const OWNER_METADATA_KEY: &str = "user_id";

/// The metadata key of a traced creation's first trace (a W3C traceparent).
pub const TRACE_METADATA_KEY: &str = "traceparent";

/// The user an event's metadata names as its owner ([`OWNER_METADATA_KEY`]), stored in
/// `user_id`; none for an event of no user.
pub fn owner(metadata: &Value) -> Option<i64> {
    metadata
        .get(OWNER_METADATA_KEY)
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
}

/// The domain time an event's payload carries (`at` in its one variant's fields), stored in
/// `occurred_at`; none when it carries none (the database's `now()` is stored then).
pub fn occurred_at(payload: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    let fields = payload.as_object()?.values().next()?;
    let at = fields.get("at")?.as_str()?;
    chrono::DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// A stored transfer payload as its event, through the log's one decoder (`domain::stored`,
/// with the version check).
pub fn decode_transfer(
    event_version: &str,
    payload: Value,
) -> Result<domain::TransferEvent, domain::stored::PayloadError> {
    domain::stored::decode_value(event_version, payload)
}
