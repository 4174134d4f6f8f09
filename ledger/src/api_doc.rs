//! The OpenAPI description of the REST routes, served at `GET /api/v1/openapi.json`: the edge's
//! part (`/healthz`, the error shape, the bearer scheme) joined with the parts the command and
//! query sides derive from their handlers' `#[utoipa::path]` attributes
//! (`edge::openapi::document`), and this route itself. The tests hold the document to the route
//! table the router is built from (`router::route_table`): the same REST routes, both ways.

use axum::Json;
use serde_json::Value;
use utoipa::OpenApi;

/// `GET /api/v1/openapi.json`: this document (no token needed).
#[utoipa::path(get, path = "/api/v1/openapi.json",
    responses((status = 200, description = "the OpenAPI 3.1 document of every REST route",
        body = Object)))]
pub(crate) async fn openapi_json() -> Json<Value> {
    Json(document())
}

/// The whole document.
pub fn document() -> Value {
    let mut doc = edge::openapi::document([
        Binary::openapi(),
        command_api::openapi::part(),
        query_api::openapi::part(),
    ]);
    // Like `/healthz`, the document is open: an empty security list, not "token optional".
    doc["paths"]["/api/v1/openapi.json"]["get"]["security"] = serde_json::json!([]);
    doc
}

/// The binary's own route.
#[derive(OpenApi)]
#[openapi(paths(openapi_json))]
struct Binary;

#[cfg(test)]
mod tests {
    use super::*;
    use edge::openapi::AMOUNT_PATTERN;
    use edge::routes::Kind;
    use std::collections::BTreeSet;

    #[test]
    fn the_amount_pattern_agrees_with_the_parser_on_samples() {
        // No regex crate here: the samples pin the pattern's intent against `Amount::parse`.
        let doc = document();
        let pattern = doc["components"]["schemas"]["TransferRequest"]["properties"]["amount"]
            ["pattern"]
            .as_str()
            .unwrap();
        assert_eq!(pattern, AMOUNT_PATTERN);
        for ok in ["1", "0.5", "99999999999.99999999", "100.50"] {
            assert!(domain::Amount::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "-1",
            "1e5",
            " 1",
            "01",
            ".5",
            "100000000000",
            "0",
            "0.0",
            "1.",
        ] {
            assert!(domain::Amount::parse(bad).is_err(), "{bad}");
        }
        // The pattern's own spelling of "above zero" and of trailing zeros, pinned literally.
        for part in [
            r"^([1-9][0-9]{0,10}(\.[0-9]{1,18}0*)?|0\.(",
            r"|0{17}[1-9][0-9]{0,0})0*)$",
        ] {
            assert!(pattern.contains(part), "{pattern}");
        }
    }

    #[test]
    fn path_parameters_are_required_and_only_healthz_and_the_document_are_open() {
        let doc = document();
        assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"],
            serde_json::json!({"type": "http", "scheme": "bearer", "bearerFormat": "JWT"})
        );
        assert_eq!(
            doc["paths"]["/healthz"]["get"]["security"],
            serde_json::json!([])
        );
        for (path, item) in doc["paths"].as_object().unwrap() {
            for operation in item.as_object().unwrap().values() {
                if path != "/healthz" && path != "/api/v1/openapi.json" {
                    assert!(operation.get("security").is_none(), "{path}");
                }
                for param in operation["parameters"].as_array().into_iter().flatten() {
                    if param["in"] == "path" {
                        assert_eq!(param["required"], true, "{path} {param}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_bulk_route_says_a_batch_is_not_one_transaction() {
        let doc = document();
        let post = &doc["paths"]["/api/v1/internal_transfers"]["post"];
        let said = format!("{} {}", post["summary"], post["description"]);
        assert!(said.contains("NOT one transaction"), "{said}");
        assert!(said.contains("admin"), "{said}");
        let item = &doc["components"]["schemas"]["BulkItem"]["properties"];
        assert!(item["user_id"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("Admin tokens only")));
    }

    /// Every (method, path) of the document, e.g. ("GET", "/api/v1/balances").
    fn documented() -> BTreeSet<(String, String)> {
        let doc = document();
        let mut operations = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                operations.insert((method.to_uppercase(), path.clone()));
            }
        }
        operations
    }

    /// The route-completeness check. axum's `Router` cannot list its routes, so the router is
    /// built from a route table (`edge::routes::Routes`, `router::route_table`) that lists every
    /// (method, path) as it adds it; a side has no other way to hand its routes to `build_app`
    /// than that table (its `router()` returns a `Routes`, not an axum `Router`). Here the
    /// table's REST routes and the document's operations must be the same set, both ways: a
    /// route added to a router and forgotten in the document fails this test, as does a
    /// documented route nobody serves. Pages (console, GraphQL, `/metrics`) are not REST and
    /// never under `/api/`. The table is taken with `/metrics` on the API's address, so every
    /// route the binary can serve is seen.
    #[test]
    fn the_document_names_every_route_the_router_serves_and_no_other() {
        let table = crate::router::route_table(1_000, &crate::startup::Serving::default());
        let mut served = BTreeSet::new();
        for route in table.listed() {
            match route.kind {
                Kind::Api => {
                    let fresh = served.insert((route.method.to_string(), route.path.to_owned()));
                    assert!(fresh, "{} {} listed twice", route.method, route.path);
                }
                Kind::Page => assert!(
                    !route.path.starts_with("/api/"),
                    "{} {} is under /api/ but not a REST route of the document",
                    route.method,
                    route.path
                ),
            }
        }
        let documented = documented();
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let unserved: Vec<_> = documented.difference(&served).collect();
        assert!(
            undocumented.is_empty(),
            "served but not in the OpenAPI document: {undocumented:?}"
        );
        assert!(
            unserved.is_empty(),
            "documented but not served: {unserved:?}"
        );
    }

    #[test]
    fn every_route_has_its_refusals_and_the_feed_stream_is_event_stream() {
        let doc = document();
        for (method, path) in documented() {
            let operation = &doc["paths"][&path][method.to_lowercase()];
            let responses = operation["responses"].as_object().unwrap();
            assert!(responses.contains_key("200"), "{method} {path}");
            let open = ["/healthz", "/api/v1/openapi.json"].contains(&path.as_str());
            if !open {
                assert!(responses.contains_key("401"), "{method} {path} without 401");
            }
            if path.starts_with("/api/v1/admin/") || path.starts_with("/api/v1/events") {
                assert!(responses.contains_key("403"), "{method} {path} without 403");
            }
        }
        let stream = &doc["paths"]["/api/v1/events/stream"]["get"]["responses"]["200"];
        assert!(
            stream["content"]["text/event-stream"].is_object(),
            "{stream}"
        );
    }

    #[test]
    fn the_feed_streams_events_are_documented_as_events() {
        let doc = document();
        let get = &doc["paths"]["/api/v1/events/stream"]["get"];
        let content = &get["responses"]["200"]["content"]["text/event-stream"]["schema"];
        assert_eq!(
            content["$ref"], "#/components/schemas/FeedStreamEvent",
            "{content}"
        );
        let events = doc["components"]["schemas"]["FeedStreamEvent"]["oneOf"]
            .as_array()
            .unwrap();
        let names: Vec<_> = events
            .iter()
            .map(|e| e["properties"]["event"]["enum"][0].as_str().unwrap())
            .collect();
        assert!(names.contains(&"TransferCommitted") && names.contains(&"ExternalDeposited"));
        for event in events {
            let data = &event["properties"]["data"]["contentSchema"]["allOf"][0]["$ref"];
            let name = data.as_str().unwrap().rsplit('/').next().unwrap();
            assert!(doc["components"]["schemas"][name].is_object(), "{name}");
        }
        // The stream ends when asked not to follow: what a schema-driven client (and
        // scripts/schemathesis) reads to the end.
        let follow = get["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "follow")
            .unwrap();
        assert_eq!(follow["in"], "query");
    }

    #[test]
    fn the_schema_says_what_the_server_checks() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        let transfer = &schemas["TransferRequest"]["properties"];
        for field in ["from", "to"] {
            let said = transfer[field]["description"].as_str().unwrap();
            assert!(said.contains("SAME_ACCOUNT"), "{field}: {said}");
            assert_eq!(
                transfer[field]["enum"],
                serde_json::json!(["FUNDING", "SPOT"])
            );
        }
        let asset = transfer["asset"]["description"].as_str().unwrap();
        assert!(asset.contains("run time"), "{asset}");
        // A bulk body takes no field but `transfers`.
        assert_eq!(
            schemas["BulkRequest"]["additionalProperties"],
            serde_json::json!(false)
        );
        let state = &doc["paths"]["/api/v1/admin/transfers"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "state")
            .unwrap()["schema"]["enum"];
        assert!(state
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("OPEN")));
        assert!(state
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("ROLLED_BACK")));
    }
}
