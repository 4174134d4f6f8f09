//! A command's request body as the handlers take it apart: declared `application/json`, within
//! the body limit, a JSON object, then field by field (`Fields`), so the checks run in the
//! contract's order (`docs/contract.md`) and every refusal has the contract's code rather than a
//! deserializer's text.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use domain::{ErrorCode, UserId};
use edge::config::BODY_BYTES_MAX;
use edge::error::ApiError;
use serde_json::{Map, Value};

/// Longest field name echoed back in a BAD_REQUEST message.
const FIELD_ECHO_CHARS_MAX: usize = 64;

/// A request body that is declared `application/json`, fits the body limit, parses, and is a JSON
/// object. Its fields are the handler's to check, in the contract's order.
#[derive(Debug)]
pub struct JsonObject(pub Map<String, Value>);

fn declares_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        if !declares_json(request.headers()) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(BODY_BYTES_MAX)
            } else {
                ApiError::BadRequest("could not read the request body".into())
            }
        })?;
        json_object(&bytes).map(Self)
    }
}

/// A request body's bytes as the JSON object every handler takes apart; anything else is
/// BAD_REQUEST.
pub fn json_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|_| ApiError::BadRequest("request body is not valid JSON".into()))?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::BadRequest(
            "request body must be a JSON object".into(),
        )),
    }
}

/// The fields of a JSON object body, taken one by one. `null` counts as absent.
pub(crate) struct Fields(pub(crate) Map<String, Value>);

impl Fields {
    /// Refuses any field not in `allowed`: a misspelt optional field must not be ignored silently.
    pub(crate) fn deny_unknown(&self, allowed: &[&str]) -> Result<(), ApiError> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => {
                let shown: String = key.chars().take(FIELD_ECHO_CHARS_MAX).collect();
                Err(ApiError::BadRequest(format!("unknown field `{shown}`")))
            }
        }
    }

    pub(crate) fn optional(&mut self, name: &str) -> Option<Value> {
        self.0.remove(name).filter(|v| !v.is_null())
    }

    pub(crate) fn required(&mut self, name: &str) -> Result<Value, ApiError> {
        self.optional(name)
            .ok_or_else(|| ApiError::BadRequest(format!("missing field `{name}`")))
    }

    pub(crate) fn required_str(&mut self, name: &str) -> Result<String, ApiError> {
        match self.required(name)? {
            Value::String(s) => Ok(s),
            _ => Err(ApiError::BadRequest(format!("`{name}` must be a string"))),
        }
    }

    pub(crate) fn optional_str(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.optional(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::BadRequest(format!("`{name}` must be a string"))),
        }
    }
}

/// A user id given as a JSON integer or a decimal string.
pub(crate) fn parse_user_id(value: &Value) -> Result<UserId, ErrorCode> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .ok_or(ErrorCode::InvalidUserId)
            .and_then(UserId::new),
        Value::String(s) => s.parse(),
        _ => Err(ErrorCode::InvalidUserId),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_type_allows_parameters_only() {
        let headers = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, value.parse().unwrap());
            h
        };
        assert!(declares_json(&headers("application/json")));
        assert!(declares_json(&headers("application/json; charset=utf-8")));
        assert!(!declares_json(&headers("text/plain")));
        assert!(!declares_json(&headers("application/jsonx")));
        assert!(!declares_json(&HeaderMap::new()));
    }
}
