//! The one error type of the HTTP edge: every refusal becomes `{"code", "message"}` with the status
//! of contract §3, and internal failures become a generic SYSTEM_ERROR whose detail goes to the
//! log only.

use application::books::{FundingError, SpotError};
use application::reads::ProofError;
use application::CoordinatorError;
use application::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use domain::{ErrorCode, ReqId, TransferState};
use serde_json::json;

/// The header on a write's 503 that the partition fence refused (value [`ROUTE_AGAIN_MAP`]):
/// the cell map the request was routed by is older than the cell's, so routing it again under
/// the newer map may reach the user's cell (ADR 0023 §1; `front::map`). `docs/contract.md`.
pub const ROUTE_AGAIN: &str = "ledger-route-again";
/// [`ROUTE_AGAIN`]'s one value.
pub const ROUTE_AGAIN_MAP: &str = "map";

/// Everything a request can end in other than success.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// 401 UNAUTHORIZED: no credentials, or a token that is malformed, forged, expired, not yet
    /// valid, or signed with another algorithm.
    Unauthorized,
    /// 403 FORBIDDEN: a valid token that may not do this (not an admin, or acting for another
    /// user).
    Forbidden,
    /// 404 NOT_FOUND: no such route or resource, or one that belongs to another user (the answer
    /// never says which).
    NotFound,
    /// 400 BAD_REQUEST: the request is malformed (not JSON, not an object, a missing or unknown
    /// field, a field of the wrong type). The message names the problem, never internal text.
    BadRequest(String),
    /// 413 BAD_REQUEST: the body is larger than the route's limit, in bytes.
    PayloadTooLarge(usize),
    /// 415 BAD_REQUEST: the body is not declared as `application/json`.
    UnsupportedMediaType,
    /// 405 BAD_REQUEST: the route exists but not with this method.
    MethodNotAllowed,
    /// 408 BAD_REQUEST: the request (its body included) was not received and answered within
    /// the server's request timeout.
    RequestTimeout,
    /// A refusal with a contract code; the status follows the code (see [`status_of`]): 422 for
    /// business and validation refusals (INSUFFICIENT_BALANCE, SAME_ACCOUNT, INVALID_AMOUNT...),
    /// 409 for IDEMPOTENCY_KEY_REUSED and CONFLICT, 429 with `Retry-After` for
    /// RATE_LIMIT_EXCEEDED, DAILY_LIMIT_EXCEEDED and DAILY_AMOUNT_EXCEEDED, and the statuses
    /// of the variants above for their codes.
    Refused(ErrorCode),
    /// A refusal with a contract code (status as for [`ApiError::Refused`]) whose message says
    /// more than the code's fixed sentence: the admin routes name the state or the resolution
    /// that was refused. The message is written by this crate, never taken from inside.
    RefusedBecause { code: ErrorCode, message: String },
    /// 422 with the refusal code the source account system gave: the transfer exists and ended
    /// FAILED, so the body also carries its `req_id` and `state` for the client to look it up.
    TransferFailed { code: String, req_id: ReqId },
    /// 503 SYSTEM_ERROR: a dependency (spot-core) cannot answer now. The detail is logged only.
    Unavailable(String),
    /// 503 SYSTEM_ERROR, as [`ApiError::Unavailable`], for a write the cell's partition fence
    /// refused (ADR 0023 §2): nothing was written, and the answer also carries
    /// [`ROUTE_AGAIN`]` = map`, so that the front reloads the cell map and sends the request
    /// once more to the user's cell under it. The detail is logged only.
    Fenced(String),
    /// 500 SYSTEM_ERROR: anything else that went wrong inside. The detail is logged only.
    Internal(String),
}

/// The status a contract code is answered with.
pub fn status_of(code: ErrorCode) -> StatusCode {
    use ErrorCode as C;
    match code {
        C::Unauthorized => StatusCode::UNAUTHORIZED,
        C::Forbidden => StatusCode::FORBIDDEN,
        C::NotFound => StatusCode::NOT_FOUND,
        C::RateLimitExceeded | C::DailyLimitExceeded | C::DailyAmountExceeded => {
            StatusCode::TOO_MANY_REQUESTS
        }
        C::SystemError => StatusCode::INTERNAL_SERVER_ERROR,
        C::ServiceHalted => StatusCode::SERVICE_UNAVAILABLE,
        C::BadRequest => StatusCode::BAD_REQUEST,
        C::IdempotencyKeyReused
        | C::Conflict
        | C::DuplicateRequest
        | C::TransferBusy
        | C::ReqIdMismatch
        | C::TransferKnown
        | C::NothingToRepair
        | C::NotRepairable
        | C::InsufficientFunding => StatusCode::CONFLICT,
        C::AccountSystemUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        C::SameAccount
        | C::InvalidAccountType
        | C::UnsupportedAccountType
        | C::InvalidAmount
        | C::PrecisionOverflow
        | C::AmountTooSmall
        | C::AmountTooLarge
        | C::Overflow
        | C::InvalidAsset
        | C::AssetSuspended
        | C::TransferNotAllowed
        | C::InvalidUserId
        | C::InvalidStatus
        | C::SourceAccountNotFound
        | C::TargetAccountNotFound
        | C::AccountFrozen
        | C::AccountDisabled
        | C::InsufficientBalance
        | C::InvalidIdempotencyKey => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// A fixed, client-safe sentence for each code. Messages never carry text from inside (SQL,
/// adapter errors), so a refusal cannot leak anything.
pub fn describe(code: ErrorCode) -> &'static str {
    use ErrorCode as C;
    match code {
        C::Unauthorized => "missing or invalid credentials",
        C::Forbidden => "not allowed for this caller",
        C::NotFound => "not found",
        C::RateLimitExceeded => "too many requests; slow down",
        C::DailyLimitExceeded => "daily transfer count exceeded",
        C::DailyAmountExceeded => "daily transfer amount exceeded",
        C::SystemError => "internal error; retry later",
        C::BadRequest => "malformed request",
        C::SameAccount => "from and to must be different account types",
        C::InvalidAccountType => "unknown account type",
        C::UnsupportedAccountType => "account type is not supported yet",
        C::InvalidAmount => "amount must be a positive decimal in a JSON string",
        C::PrecisionOverflow => "amount has more decimal places than the asset allows",
        C::AmountTooSmall => "amount is below the asset's minimum",
        C::AmountTooLarge => "amount is above the asset's maximum",
        C::Overflow => "amount is too large",
        C::InvalidAsset => "unknown asset",
        C::AssetSuspended => "asset is suspended",
        C::TransferNotAllowed => "internal transfers are not enabled for this asset",
        C::InvalidUserId => "user id must be a positive integer",
        C::InvalidStatus => "status must be ACTIVE, FROZEN or DISABLED",
        C::SourceAccountNotFound => "source account does not exist",
        C::TargetAccountNotFound => "target account does not exist",
        C::AccountFrozen => "account is frozen",
        C::AccountDisabled => "account is disabled",
        C::InsufficientBalance => "balance is below the amount",
        C::DuplicateRequest => "request was already processed",
        C::IdempotencyKeyReused => "idempotency key was already used with different details",
        C::InvalidIdempotencyKey => "idempotency key must be 1 to 64 characters [A-Za-z0-9_-]",
        C::ServiceHalted => "transfers are halted; retry later",
        C::Conflict => "the resource was changed concurrently; retry",
        C::TransferBusy => {
            "a recovery worker or another operator is working this transfer; try again shortly"
        }
        C::ReqIdMismatch => "the account system holds this req_id for a different movement",
        C::AccountSystemUnavailable => "the account system could not answer; nothing was recorded",
        C::TransferKnown => "the ledger knows this transfer; it needs no repair",
        C::NothingToRepair => "the account system applied nothing under this req_id",
        C::NotRepairable => "the account system's record is not one transfer's movement",
        C::InsufficientFunding => "the FUNDING account cannot pay this repair now",
    }
}

/// Reads a code an account system gave as text; `None` for a code outside the contract.
pub fn parse_code(text: &str) -> Option<ErrorCode> {
    serde_json::from_value(serde_json::Value::String(text.to_owned())).ok()
}

impl ApiError {
    /// A refusal with `code` and a sentence of this crate's own in place of the code's fixed one.
    pub fn because(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::RefusedBecause {
            code,
            message: message.into(),
        }
    }

    /// A failed spot-core call that is not a movement (status, balances): out of reach is 503
    /// (retry later); an answer the adapter did not expect is a bug or a configuration mismatch
    /// between the two systems, so 500. The logged detail says whether the call may have taken
    /// effect there ([`SpotError::outcome_unknown`]): an operator reads a status back before
    /// repeating it.
    pub fn spot(call: &str, e: SpotError) -> Self {
        let effect = if e.outcome_unknown() {
            "may have taken effect"
        } else {
            "never reached spot-core"
        };
        match e {
            SpotError::Transport(_) => Self::Unavailable(format!("spot {call} ({effect}): {e}")),
            SpotError::Unexpected(_) => Self::Internal(format!("spot {call} ({effect}): {e}")),
        }
    }

    /// A funding ledger's refusal or failure: a reused external id and an overflow are the
    /// contract's codes, a missing account NOT_FOUND, a write the partition fence refused the
    /// 503 to route again, a store failure a 500 whose detail (the whole cause chain) goes to
    /// the log.
    pub fn funding(e: FundingError) -> Self {
        match e {
            FundingError::ExternalIdReused => Self::Refused(ErrorCode::IdempotencyKeyReused),
            FundingError::AccountNotFound => Self::NotFound,
            FundingError::Overflow => Self::Refused(ErrorCode::Overflow),
            FundingError::Store(e) if e.is_fenced() => Self::Fenced(e.to_string()),
            FundingError::Store(e) => {
                Self::Internal(format!("funding ledger: {}", application::error_chain(&e)))
            }
        }
    }

    /// A read of the read side (`application::reads`) that could not be made: a 500 whose
    /// detail, what was read and why it failed, goes to the log.
    pub fn store(what: &str, e: StoreError) -> Self {
        Self::Internal(format!("{what}: {e}"))
    }

    /// A tamper-evident log proof that cannot be given: a tree that has not grown to the size
    /// asked is NOT_FOUND (yet), a range outside it BAD_REQUEST, a failed read a 500.
    pub fn proof(e: ProofError) -> Self {
        match e {
            ProofError::BeyondTree { size } => Self::because(
                ErrorCode::NotFound,
                format!("the tree has {size} entries so far"),
            ),
            ProofError::OutOfRange => Self::BadRequest("the range is not inside the tree".into()),
            ProofError::Store(e) => Self::store("tamper-evident log", e),
        }
    }

    /// The status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Refused(code) | Self::RefusedBecause { code, .. } => status_of(*code),
            Self::TransferFailed { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) | Self::Fenced(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The wire code.
    pub fn code(&self) -> String {
        let code = match self {
            Self::Unauthorized => ErrorCode::Unauthorized,
            Self::Forbidden => ErrorCode::Forbidden,
            Self::NotFound => ErrorCode::NotFound,
            Self::BadRequest(_)
            | Self::PayloadTooLarge(_)
            | Self::UnsupportedMediaType
            | Self::MethodNotAllowed
            | Self::RequestTimeout => ErrorCode::BadRequest,
            Self::Refused(code) | Self::RefusedBecause { code, .. } => *code,
            Self::TransferFailed { code, .. } => return code.clone(),
            Self::Unavailable(_) | Self::Fenced(_) | Self::Internal(_) => ErrorCode::SystemError,
        };
        code.as_str().to_owned()
    }

    /// The client-facing message.
    pub fn message(&self) -> String {
        match self {
            Self::BadRequest(message) => message.clone(),
            Self::PayloadTooLarge(limit) => {
                format!("request body is larger than {limit} bytes")
            }
            Self::UnsupportedMediaType => "request body must be application/json".to_owned(),
            Self::MethodNotAllowed => "method not allowed on this route".to_owned(),
            Self::RequestTimeout => {
                "the request was not read and answered within the request timeout (LEDGER_HTTP_REQUEST_TIMEOUT_MS)".to_owned()
            }
            Self::Refused(code) => describe(*code).to_owned(),
            Self::RefusedBecause { message, .. } => message.clone(),
            Self::TransferFailed { code, .. } => match parse_code(code) {
                Some(code) => format!("transfer failed: {}", describe(code)),
                None => "transfer failed: the source account refused it".to_owned(),
            },
            Self::Unavailable(_) | Self::Fenced(_) => {
                "a backing service is unavailable; retry later".to_owned()
            }
            Self::Unauthorized => describe(ErrorCode::Unauthorized).to_owned(),
            Self::Forbidden => describe(ErrorCode::Forbidden).to_owned(),
            Self::NotFound => describe(ErrorCode::NotFound).to_owned(),
            Self::Internal(_) => describe(ErrorCode::SystemError).to_owned(),
        }
    }

    /// The JSON body: `{"code", "message"}`, plus `req_id` and `state` for a failed transfer.
    pub fn body(&self) -> serde_json::Value {
        let mut body = json!({ "code": self.code(), "message": self.message() });
        if let Self::TransferFailed { req_id, .. } = self {
            body["req_id"] = json!(req_id.to_string());
            body["state"] = json!(TransferState::Failed.as_str());
        }
        body
    }
}

/// A coordinator's failure as either side answers it: a refusal keeps its code, anything else
/// is internal (its detail goes to the log).
pub fn coordinator_error(e: CoordinatorError) -> ApiError {
    match e {
        CoordinatorError::Refused(code) => ApiError::Refused(code),
        CoordinatorError::Conflict => ApiError::Refused(ErrorCode::Conflict),
        CoordinatorError::NotFound => {
            ApiError::Internal("transfer not found right after it was created".into())
        }
        CoordinatorError::Transition(e) => ApiError::Internal(format!("transition refused: {e}")),
        // The user's partition is frozen for a move or moved (ADR 0023 §2): nothing was
        // written; the client retries shortly, and the front routes it under the new map.
        e @ CoordinatorError::OutcomeUnknown(_) if e.is_fenced() => {
            ApiError::Fenced(format!("partition fence: {}", application::error_chain(&e)))
        }
        e @ CoordinatorError::OutcomeUnknown(_) => {
            ApiError::Internal(format!("event store: {}", application::error_chain(&e)))
        }
        e @ CoordinatorError::Invariant(_) => ApiError::Internal(application::error_chain(&e)),
    }
}

impl From<ErrorCode> for ApiError {
    fn from(code: ErrorCode) -> Self {
        Self::Refused(code)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // The detail of an internal failure is for operators; the client gets a generic message.
        match &self {
            Self::Internal(detail) => tracing::error!(%detail, "request failed inside"),
            Self::Unavailable(detail) | Self::Fenced(detail) => {
                tracing::warn!(%detail, "backing service unavailable")
            }
            _ => {}
        }
        // A limit refusal says when to come back: the next second, or the next UTC day.
        let retry_after = match &self {
            Self::Refused(ErrorCode::RateLimitExceeded) => Some(1),
            Self::Refused(ErrorCode::DailyLimitExceeded | ErrorCode::DailyAmountExceeded) => {
                Some(application::daily::secs_until_next_day(chrono::Utc::now()))
            }
            // A backing service or a partition's move: worth trying again in a second.
            Self::Unavailable(_) | Self::Fenced(_) => Some(1),
            _ => None,
        };
        let fenced = matches!(self, Self::Fenced(_));
        let mut response = (self.status(), Json(self.body())).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        if fenced {
            response.headers_mut().insert(
                ROUTE_AGAIN,
                axum::http::HeaderValue::from_static(ROUTE_AGAIN_MAP),
            );
        }
        response
    }
}

/// A handler panic still answers in the error shape; the panic text goes to the log only (the
/// catch-panic layer of every router: each cell's, and the merged feed's under a cell map).
pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("non-text panic");
    ApiError::Internal(format!("handler panicked: {detail}")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    async fn rendered(error: ApiError) -> (StatusCode, serde_json::Value) {
        let response = error.into_response();
        let status = response.status();
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(content_type, "application/json");
        let bytes = to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_write_refused_at_the_partition_fence_is_a_503_to_retry_in_a_second() {
        let fenced = CoordinatorError::OutcomeUnknown(std::sync::Arc::new(
            application::error::Fenced("partition 7 is FROZEN".into()),
        ));
        let response = coordinator_error(fenced).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(response.headers()[ROUTE_AGAIN], ROUTE_AGAIN_MAP);
        let other = ApiError::Unavailable("spot-core".into()).into_response();
        assert!(
            other.headers().get(ROUTE_AGAIN).is_none(),
            "only the fence's"
        );
        let lost = CoordinatorError::outcome_unknown("connection reset");
        let (status, body) = rendered(coordinator_error(lost)).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    }

    #[tokio::test]
    async fn each_variant_renders_its_status_and_code() {
        let cases = [
            (ApiError::Unauthorized, 401, "UNAUTHORIZED"),
            (ApiError::Forbidden, 403, "FORBIDDEN"),
            (ApiError::NotFound, 404, "NOT_FOUND"),
            (
                ApiError::BadRequest("missing field `from`".into()),
                400,
                "BAD_REQUEST",
            ),
            (ApiError::PayloadTooLarge(16_384), 413, "BAD_REQUEST"),
            (ApiError::UnsupportedMediaType, 415, "BAD_REQUEST"),
            (ApiError::MethodNotAllowed, 405, "BAD_REQUEST"),
            (ApiError::RequestTimeout, 408, "BAD_REQUEST"),
            (
                ApiError::Refused(ErrorCode::RateLimitExceeded),
                429,
                "RATE_LIMIT_EXCEEDED",
            ),
            (
                ApiError::Refused(ErrorCode::InsufficientBalance),
                422,
                "INSUFFICIENT_BALANCE",
            ),
            (
                ApiError::Refused(ErrorCode::SameAccount),
                422,
                "SAME_ACCOUNT",
            ),
            (
                ApiError::Refused(ErrorCode::InvalidAmount),
                422,
                "INVALID_AMOUNT",
            ),
            (
                ApiError::Refused(ErrorCode::IdempotencyKeyReused),
                409,
                "IDEMPOTENCY_KEY_REUSED",
            ),
            (ApiError::Refused(ErrorCode::Forbidden), 403, "FORBIDDEN"),
            (
                ApiError::Refused(ErrorCode::TransferBusy),
                409,
                "TRANSFER_BUSY",
            ),
            (
                ApiError::because(ErrorCode::ReqIdMismatch, "held for another movement"),
                409,
                "REQ_ID_MISMATCH",
            ),
            (
                ApiError::because(ErrorCode::AccountSystemUnavailable, "could not confirm"),
                503,
                "ACCOUNT_SYSTEM_UNAVAILABLE",
            ),
            (
                ApiError::Refused(ErrorCode::TransferKnown),
                409,
                "TRANSFER_KNOWN",
            ),
            (
                ApiError::Refused(ErrorCode::NothingToRepair),
                409,
                "NOTHING_TO_REPAIR",
            ),
            (
                ApiError::Refused(ErrorCode::NotRepairable),
                409,
                "NOT_REPAIRABLE",
            ),
            (
                ApiError::Refused(ErrorCode::InsufficientFunding),
                409,
                "INSUFFICIENT_FUNDING",
            ),
            (
                ApiError::Unavailable("spot down".into()),
                503,
                "SYSTEM_ERROR",
            ),
            (ApiError::Internal("boom".into()), 500, "SYSTEM_ERROR"),
        ];
        for (error, status, code) in cases {
            let (got_status, body) = rendered(error.clone()).await;
            assert_eq!(got_status.as_u16(), status, "{error:?}");
            assert_eq!(body["code"], code, "{error:?}");
            assert!(
                body["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{error:?}"
            );
            let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
            assert_eq!(keys.len(), 2, "only code and message: {body}");
        }
    }

    #[tokio::test]
    async fn internal_detail_never_reaches_the_client() {
        let secret = "relation \"funding_accounts\" does not exist";
        for error in [
            ApiError::Internal(secret.into()),
            ApiError::Unavailable(secret.into()),
        ] {
            let (_, body) = rendered(error).await;
            assert!(!body.to_string().contains("funding_accounts"), "{body}");
        }
    }

    #[tokio::test]
    async fn read_port_failures_map_to_the_contracts_codes_and_keep_their_detail_inside() {
        let secret = "relation \"tlog_state\" does not exist";
        let cases = [
            (ProofError::BeyondTree { size: 3 }, StatusCode::NOT_FOUND),
            (ProofError::OutOfRange, StatusCode::BAD_REQUEST),
            (
                ProofError::Store(StoreError::msg(secret)),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (proof, status) in cases {
            let (got, body) = rendered(ApiError::proof(proof)).await;
            assert_eq!(got, status);
            assert!(!body.to_string().contains("tlog_state"), "{body}");
        }
        let feed = ApiError::store("feed", StoreError::msg(secret));
        assert!(matches!(&feed, ApiError::Internal(d) if d == &format!("feed: {secret}")));
        let (got, body) = rendered(feed).await;
        assert_eq!(got, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!body.to_string().contains("tlog_state"), "{body}");
    }

    #[tokio::test]
    async fn failed_transfer_carries_its_req_id_and_state() {
        let req_id = ReqId::generate();
        let (status, body) = rendered(ApiError::TransferFailed {
            code: "INSUFFICIENT_BALANCE".into(),
            req_id,
        })
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(body["code"], "INSUFFICIENT_BALANCE");
        assert_eq!(body["req_id"], req_id.to_string());
        assert_eq!(body["state"], "FAILED");
    }

    #[tokio::test]
    async fn an_unknown_refusal_code_gets_a_generic_message() {
        let (_, body) = rendered(ApiError::TransferFailed {
            code: "SOMETHING_NEW".into(),
            req_id: ReqId::generate(),
        })
        .await;
        assert_eq!(body["code"], "SOMETHING_NEW");
        assert_eq!(
            body["message"],
            "transfer failed: the source account refused it"
        );
    }

    #[test]
    fn codes_parse_from_their_wire_names() {
        assert_eq!(parse_code("ACCOUNT_FROZEN"), Some(ErrorCode::AccountFrozen));
        assert_eq!(parse_code("nope"), None);
    }
}
