//! The OpenAPI description of the REST routes, served at `GET /api/v1/openapi.json`, derived by
//! `utoipa` from the handlers' `#[utoipa::path]` attributes and the response types' `ToSchema`.
//! The request bodies are parsed field by field (so checks run in the contract's order), so
//! their documented shapes are the schema-only types of [`schemas`]. The amount pattern and bounds are
//! the parser's own (`domain::Amount`), so a schema-driven fuzzer (scripts/schemathesis) can
//! tell valid input from invalid and check that every invalid request is refused with a 4xx.

pub mod schemas;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;

use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::Required;
use utoipa::{Modify, OpenApi};

use crate::state::AppState;
use schemas::ErrorBody;

pub fn routes() -> Router<AppState> {
    Router::new().route("/api/v1/openapi.json", get(openapi_json))
}

async fn openapi_json() -> Json<Value> {
    Json(document())
}

/// The document. Every route needs a bearer token except `/healthz` and this document.
pub fn document() -> Value {
    serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes")
}

#[derive(OpenApi)]
#[openapi(
    info(title = "ledger internal transfers", version = "1"),
    paths(
        crate::routes::healthz,
        crate::routes::create_transfer,
        crate::routes::get_transfer,
        crate::routes::balances,
        crate::routes::admin_deposit,
        crate::routes::admin_set_status,
        crate::admin_assets::list_assets,
        crate::admin_assets::put_asset,
        crate::admin_views::list_transfers,
        crate::admin_views::transfer_timeline,
        crate::admin_views::user_view,
        crate::admin_views::overview,
        crate::admin_views::invariant_history,
        crate::admin_alerts::list_alerts,
    ),
    components(schemas(ErrorBody)),
    security(("bearer" = [])),
    modifiers(&Finish),
)]
struct ApiDoc;

/// What the derive does not say: the bearer JWT scheme (required by every route unless the
/// route says otherwise); path parameters required (utoipa drops `required` for a parameter
/// with a `schema_with`); no tags (utoipa names them after the handlers' modules) and no
/// license or description (utoipa fills them from the package, where they are empty).
struct Finish;

impl Modify for Finish {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi.info.license = None;
        openapi.info.description = None;
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.put, &mut item.post]
                .into_iter()
                .flatten()
            {
                operation.tags = None;
                for param in operation.parameters.iter_mut().flatten() {
                    if param.parameter_in == ParameterIn::Path {
                        param.required = Required::True;
                    }
                }
            }
        }
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(scheme));
        // `/healthz` needs no token: an empty list, not utoipa's `[{}]` ("token optional").
        if let Some(get) = openapi
            .paths
            .paths
            .get_mut("/healthz")
            .and_then(|item| item.get.as_mut())
        {
            get.security = Some(Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::schemas::AMOUNT_PATTERN;
    use super::*;

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
    fn every_route_of_the_app_is_described() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        for path in [
            "/api/v1/internal_transfer",
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
            "/api/v1/admin/alerts",
        ] {
            assert!(paths.contains_key(path), "{path}");
        }
    }
}
