//! The routes no side owns: `GET /healthz`, and the answers for a route that does not exist or a
//! method a route does not take, in the error shape.

use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;

/// `GET /healthz`: the process is alive.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "alive")))]
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Any route that does not exist.
pub async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// A route that exists, called with the wrong method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
