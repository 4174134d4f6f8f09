//! The OpenAPI description of the REST routes, served at `GET /api/v1/openapi.json`: the edge's
//! part (`/healthz`, the error shape, the bearer scheme) joined with the parts the command and
//! query sides derive from their handlers' `#[utoipa::path]` attributes
//! (`edge::openapi::document`).

use axum::Json;
use serde_json::Value;

pub(crate) async fn openapi_json() -> Json<Value> {
    Json(document())
}

/// The whole document.
pub fn document() -> Value {
    edge::openapi::document([command_api::openapi::part(), query_api::openapi::part()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use edge::openapi::AMOUNT_PATTERN;

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
        for bad in ["-1", "1e5", " 1", "01", ".5", "100000000000"] {
            assert!(domain::Amount::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn path_parameters_are_required_and_only_healthz_is_open() {
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
                if path != "/healthz" {
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

    #[test]
    fn every_route_of_the_app_is_described() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        for path in [
            "/api/v1/internal_transfer",
            "/api/v1/internal_transfers",
            "/api/v1/internal_transfer/{req_id}",
            "/api/v1/balances",
            "/api/v1/admin/deposits",
            "/api/v1/admin/accounts/{user_id}/{account_type}/status",
            "/api/v1/admin/assets/{symbol}",
            "/api/v1/admin/transfers",
            "/api/v1/admin/transfers/{req_id}",
            "/api/v1/admin/users/{user_id}",
            "/api/v1/admin/overview",
            "/api/v1/admin/invariant/history",
            "/api/v1/admin/invariant/runs/{id}",
            "/api/v1/admin/alerts",
        ] {
            assert!(paths.contains_key(path), "{path}");
        }
    }
}
