//! The OpenAPI 3.0 description of the REST routes, served at `GET /api/v1/openapi.json`. Written by
//! hand next to the handlers it describes; the amount pattern and bounds are the parser's own
//! (`domain::Amount`), so a schema-driven fuzzer (scripts/schemathesis) can tell valid input
//! from invalid and check that every invalid request is refused with a 4xx.

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::app::AppState;

/// Plain decimal text: no sign, exponent, whitespace or redundant leading zero; below 10^11 and
/// at most 18 fractional digits (an asset's own precision may allow fewer).
pub const AMOUNT_PATTERN: &str = r"^(0|[1-9][0-9]{0,10})(\.[0-9]{1,18})?$";

pub fn routes() -> Router<AppState> {
    Router::new().route("/api/v1/openapi.json", get(openapi_json))
}

async fn openapi_json() -> Json<Value> {
    Json(document())
}

fn error_responses(codes: &[u16]) -> Value {
    let mut out = serde_json::Map::new();
    for code in codes {
        out.insert(
            code.to_string(),
            json!({"description": "refused", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
    }
    Value::Object(out)
}

fn with(mut base: Value, ok: Value) -> Value {
    base["200"] = ok;
    base
}

fn ok(schema: &str) -> Value {
    json!({"description": "ok", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

/// The document. Every route needs a bearer token except `/healthz` and this document.
pub fn document() -> Value {
    let amount = json!({"type": "string", "pattern": AMOUNT_PATTERN, "minLength": 1, "maxLength": 31,
        "description": "plain decimal string, > 0 and < 10^11; within the asset's precision and bounds"});
    let asset = json!({"type": "string", "pattern": "^[A-Z0-9]{1,16}$"});
    let account = json!({"type": "string", "enum": ["FUNDING", "SPOT"]});
    let user_id = json!({"type": "integer", "minimum": 1, "maximum": i64::MAX});
    let body = |schema: &str| json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
    let user_errors = [400, 401, 403, 404, 409, 413, 415, 422, 429, 503];
    json!({
        "openapi": "3.0.3",
        "info": {"title": "ledger internal transfers", "version": "1"},
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"security": [], "responses": {"200": {"description": "alive"}}}},
            "/api/v1/internal_transfer": {"post": {
                "requestBody": body("TransferRequest"),
                "responses": with(error_responses(&user_errors), ok("TransferResponse"))
            }},
            "/api/v1/internal_transfer/{req_id}": {"get": {
                "parameters": [{"name": "req_id", "in": "path", "required": true,
                    "schema": {"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"}}],
                "responses": with(error_responses(&[401, 404, 503]), ok("TransferDetail"))
            }},
            "/api/v1/balances": {"get": {
                "responses": with(error_responses(&[401, 503]), ok("Balances"))
            }},
            "/api/v1/admin/deposits": {"post": {
                "requestBody": body("DepositRequest"),
                "responses": with(error_responses(&[400, 401, 403, 409, 413, 415, 422, 503]), ok("Deposit"))
            }},
            "/api/v1/admin/accounts/{user_id}/{account_type}/status": {"put": {
                "parameters": [
                    {"name": "user_id", "in": "path", "required": true, "schema": user_id},
                    {"name": "account_type", "in": "path", "required": true, "schema": account},
                    {"name": "asset", "in": "query", "required": false, "schema": asset}
                ],
                "requestBody": body("StatusRequest"),
                "responses": with(error_responses(&[400, 401, 403, 404, 413, 415, 422, 503]), ok("Status"))
            }},
            "/api/v1/admin/assets": {"get": {
                "responses": with(error_responses(&[401, 403]), json!({"description": "ok",
                    "content": {"application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/Asset"}}}}}))
            }},
            "/api/v1/admin/assets/{symbol}": {"put": {
                "parameters": [{"name": "symbol", "in": "path", "required": true, "schema": asset}],
                "requestBody": body("AssetRequest"),
                "responses": with(error_responses(&[400, 401, 403, 404, 413, 415, 422]), ok("Asset"))
            }}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": {
                "Error": {"type": "object", "required": ["code", "message"], "properties": {
                    "code": {"type": "string", "pattern": "^[A-Z_]+$"}, "message": {"type": "string"},
                    "req_id": {"type": "string"}, "state": {"type": "string"}}},
                "TransferRequest": {"type": "object", "additionalProperties": false,
                    "required": ["from", "to", "asset", "amount"], "properties": {
                    "from": account, "to": account, "asset": asset, "amount": amount,
                    "cid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                    "user_id": user_id}},
                "TransferResponse": {"type": "object",
                    "required": ["transfer_id", "req_id", "from", "to", "asset", "amount", "state", "message"],
                    "properties": {"transfer_id": {"type": "string"}, "req_id": {"type": "string"},
                    "from": account, "to": account, "asset": asset, "amount": {"type": "string"},
                    "state": {"type": "string"}, "message": {"type": "string"}, "failure_code": {"type": "string"}}},
                "TransferDetail": {"type": "object",
                    "required": ["transfer_id", "req_id", "from", "to", "asset", "amount", "state", "created_at", "updated_at"],
                    "properties": {"transfer_id": {"type": "string"}, "req_id": {"type": "string"},
                    "from": account, "to": account, "asset": asset, "amount": {"type": "string"},
                    "state": {"type": "string"}, "created_at": {"type": "string", "format": "date-time"},
                    "updated_at": {"type": "string", "format": "date-time"},
                    "failure_code": {"type": "string"}, "failure_message": {"type": "string"}}},
                "Balances": {"type": "object", "required": ["user_id", "balances"], "properties": {
                    "user_id": {"type": "integer"}, "balances": {"type": "array", "items": {"type": "object",
                    "required": ["asset", "funding", "spot", "in_flight"], "properties": {
                        "asset": {"type": "string"}, "funding": {"type": "string"},
                        "spot": {"type": "string"}, "in_flight": {"type": "string"}}}}}},
                "DepositRequest": {"type": "object", "additionalProperties": false,
                    "required": ["user_id", "asset", "amount", "external_id"], "properties": {
                    "user_id": user_id, "asset": asset, "amount": amount,
                    "external_id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"}}},
                "Deposit": {"type": "object", "required": ["external_id", "user_id", "asset", "amount", "applied", "funding_balance"],
                    "properties": {"external_id": {"type": "string"}, "user_id": {"type": "integer"},
                    "asset": {"type": "string"}, "amount": {"type": "string"}, "applied": {"type": "boolean"},
                    "funding_balance": {"type": "string"}}},
                "StatusRequest": {"type": "object", "additionalProperties": false, "required": ["status"],
                    "properties": {"status": {"type": "string", "enum": ["ACTIVE", "FROZEN", "DISABLED"]}, "asset": asset}},
                "Status": {"type": "object", "required": ["user_id", "account_type", "asset", "status"],
                    "properties": {"user_id": {"type": "integer"}, "account_type": {"type": "string"},
                    "asset": {"type": "string"}, "status": {"type": "string"}}},
                "AssetRequest": {"type": "object", "additionalProperties": false,
                    "required": ["precision", "min_transfer_amount", "max_transfer_amount", "status", "internal_transfer_enabled"],
                    "properties": {"symbol": asset, "precision": {"type": "integer", "minimum": 0, "maximum": 18},
                    "min_transfer_amount": amount, "max_transfer_amount": amount,
                    "status": {"type": "string", "enum": ["ACTIVE", "SUSPENDED"]},
                    "internal_transfer_enabled": {"type": "boolean"}}},
                "Asset": {"type": "object", "required": ["symbol", "precision", "min_transfer_amount", "max_transfer_amount", "status", "internal_transfer_enabled"],
                    "properties": {"symbol": {"type": "string"}, "precision": {"type": "integer"},
                    "min_transfer_amount": {"type": "string"}, "max_transfer_amount": {"type": "string"},
                    "status": {"type": "string"}, "internal_transfer_enabled": {"type": "boolean"}}}
            }
        }
    })
}

#[cfg(test)]
mod tests {
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
        ] {
            assert!(paths.contains_key(path), "{path}");
        }
    }
}
