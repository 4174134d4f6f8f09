//! The SSE feed's events as the OpenAPI document gives them (`FeedStreamEvent`): one schema per
//! event type, each naming its SSE `event` (the type), its `id` (the event's position) and its
//! `data`, the event's JSON text (`contentMediaType` `application/json`) whose `contentSchema`
//! is the feed's `FeedEvent` with that `event_type` and a payload keyed by it, so a
//! schema-driven client can check every event it reads off `GET /api/v1/events/stream`.

use std::borrow::Cow;

use serde_json::json;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// Every `event_type` of the feed: a transfer's events (`domain::TransferEvent`'s variants) and
/// an external deposit's one (contract §8).
pub const FEED_EVENT_TYPES: [&str; 10] = [
    "TransferCreated",
    "SourceWithdrawStarted",
    "SourceWithdrawn",
    "TransferFailed",
    "TargetDepositStarted",
    "TransferCommitted",
    "CompensationStarted",
    "TransferRolledBack",
    "TransferManuallyResolved",
    "ExternalDeposited",
];

/// One server-sent event of `GET /api/v1/events/stream`, as the document's schema (never built:
/// the stream writes `axum`'s `Event`s).
pub struct FeedStreamEvent;

impl PartialSchema for FeedStreamEvent {
    fn schema() -> RefOr<Schema> {
        let one_of = FEED_EVENT_TYPES
            .iter()
            .fold(OneOfBuilder::new(), |all, t| all.item(event_schema(t)));
        one_of
            .description(Some(
                "One server-sent event of the feed: `id` its position, `event` its type, `data` \
                 its JSON text (the event as `GET /api/v1/events` lists it). One schema per \
                 event type; comments (keep-alives) are not events.",
            ))
            .into()
    }
}

impl ToSchema for FeedStreamEvent {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("FeedStreamEvent")
    }
}

/// The SSE event of `event_type`.
fn event_schema(event_type: &str) -> Schema {
    let mut content = Extensions::default();
    content.insert(
        "contentSchema".to_owned(),
        json!({
            "allOf": [
                {"$ref": "#/components/schemas/FeedEvent"},
                {
                    "type": "object",
                    "properties": {
                        "event_type": {"enum": [event_type]},
                        "payload": {
                            "type": "object",
                            "required": [event_type],
                            "properties": {event_type: {"type": "object"}},
                            "additionalProperties": false
                        }
                    }
                }
            ]
        }),
    );
    let data = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .content_media_type("application/json")
        .description(Some(format!(
            "the {event_type} event as `GET /api/v1/events` lists it, as JSON text"
        )))
        .extensions(Some(content));
    let id = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .pattern(Some("^[0-9]+$"))
        .description(Some(
            "the event's feed position (under a cell map, the stream's cursor)",
        ));
    let event = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .enum_values(Some([event_type]));
    ObjectBuilder::new()
        .title(Some(event_type))
        .schema_type(SchemaType::new(Type::Object))
        .property("id", id)
        .property("event", event)
        .property("data", data)
        .required("id")
        .required("event")
        .required("data")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_type_has_its_schema_with_its_data_schema() {
        let schema = serde_json::to_value(FeedStreamEvent::schema()).unwrap();
        let items = schema["oneOf"].as_array().unwrap();
        assert_eq!(items.len(), FEED_EVENT_TYPES.len());
        for (item, t) in items.iter().zip(FEED_EVENT_TYPES) {
            assert_eq!(item["properties"]["event"]["enum"], json!([t]));
            let data = &item["properties"]["data"];
            assert_eq!(data["type"], "string");
            assert_eq!(data["contentMediaType"], "application/json");
            let content = &data["contentSchema"]["allOf"];
            assert_eq!(content[0]["$ref"], "#/components/schemas/FeedEvent");
            assert_eq!(content[1]["properties"]["event_type"]["enum"], json!([t]));
            assert_eq!(content[1]["properties"]["payload"]["required"], json!([t]));
        }
    }
}
