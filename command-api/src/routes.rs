//! The HTTP handlers of DESIGN section 5. Request bodies are read as raw JSON objects and checked
//! field by field, so the checks run in seed 000's order (section 1.5.8) and every refusal has the
//! contract's code rather than a deserializer's text. (About 520 lines of handlers and their
//! body parsing, then the unit tests of that parsing; kept together because the tests pin the
//! check order of exactly these functions.)

use adapters::{AccountStatus, FundingError};
use application::{CoordinatorError, NewTransfer, RequestError, TransferRequest};
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use domain::{
    AccountType, Amount, AssetRegistry, AssetStatus, ErrorCode, ReqId, TransferData, TransferState,
    UserId,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::auth::{AdminUser, AuthUser};
use crate::error::ApiError;
use crate::render::{money, rfc3339};
use crate::state::AppState;

/// Longest external deposit id.
pub(crate) const EXTERNAL_ID_CHARS_MAX: usize = 128;

/// Longest field name echoed back in a BAD_REQUEST message.
const FIELD_ECHO_CHARS_MAX: usize = 64;

/// Longest refusal code passed through from an account system.
const REFUSAL_CODE_CHARS_MAX: usize = 64;

/// A request body that is declared `application/json`, fits the body limit, parses, and is a JSON
/// object. Its fields are the handler's to check, in the contract's order.
#[derive(Debug)]
pub(crate) struct JsonObject(pub(crate) Map<String, Value>);

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
                ApiError::PayloadTooLarge(crate::config::BODY_BYTES_MAX)
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
struct Fields(Map<String, Value>);

impl Fields {
    /// Refuses any field not in `allowed`: a misspelt optional field must not be ignored silently.
    fn deny_unknown(&self, allowed: &[&str]) -> Result<(), ApiError> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => {
                let shown: String = key.chars().take(FIELD_ECHO_CHARS_MAX).collect();
                Err(ApiError::BadRequest(format!("unknown field `{shown}`")))
            }
        }
    }

    fn optional(&mut self, name: &str) -> Option<Value> {
        self.0.remove(name).filter(|v| !v.is_null())
    }

    fn required(&mut self, name: &str) -> Result<Value, ApiError> {
        self.optional(name)
            .ok_or_else(|| ApiError::BadRequest(format!("missing field `{name}`")))
    }

    fn required_str(&mut self, name: &str) -> Result<String, ApiError> {
        match self.required(name)? {
            Value::String(s) => Ok(s),
            _ => Err(ApiError::BadRequest(format!("`{name}` must be a string"))),
        }
    }

    fn optional_str(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.optional(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::BadRequest(format!("`{name}` must be a string"))),
        }
    }
}

/// An amount must arrive as a JSON string: a JSON number has already passed through a float in
/// many clients, so it is refused rather than guessed at.
fn parse_amount(value: &Value) -> Result<Amount, ApiError> {
    match value {
        Value::String(text) => Ok(Amount::parse(text)?),
        _ => Err(ApiError::Refused(ErrorCode::InvalidAmount)),
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

/// Takes a transfer request's body apart after authentication, in seed 000's order (section
/// 1.5.8): authorization (a body `user_id` must be the caller), then the body's shape (known
/// fields, strings where strings belong). The values are the core's to check
/// ([`TransferRequest::parse`]).
pub fn transfer_request(
    body: Map<String, Value>,
    caller: UserId,
) -> Result<TransferRequest, ApiError> {
    let mut fields = Fields(body);

    // ATK-001/002: a body naming another user is refused before anything else is looked at.
    if let Some(claimed) = fields.optional("user_id") {
        if parse_user_id(&claimed) != Ok(caller) {
            return Err(ApiError::Forbidden);
        }
    }

    fields.deny_unknown(&["from", "to", "asset", "amount", "cid"])?;
    let from = fields.required_str("from")?;
    let to = fields.required_str("to")?;
    let asset = fields.required_str("asset")?;
    // An amount must arrive as a JSON string: a JSON number has already passed through a float
    // in many clients, so it is refused (INVALID_AMOUNT, in its turn) rather than guessed at.
    let amount = match fields.required("amount")? {
        Value::String(text) => Some(text),
        _ => None,
    };
    let cid = fields.optional_str("cid")?;
    Ok(TransferRequest {
        user_id: caller,
        from,
        to,
        asset,
        amount,
        cid,
    })
}

/// The body's shape and then its values, as `POST /internal_transfer` checks them before any
/// gate: what the request would create.
pub fn parse_transfer(
    body: Map<String, Value>,
    caller: UserId,
    assets: &AssetRegistry,
) -> Result<NewTransfer, ApiError> {
    Ok(transfer_request(body, caller)?.parse(assets)?)
}

pub(crate) fn request_error(e: RequestError) -> ApiError {
    match e {
        RequestError::Refused(code) => ApiError::Refused(code),
        // Unknown halt state: refused (fail closed) as unavailable, not as an internal fault.
        RequestError::HaltUnknown(e) => ApiError::Unavailable(format!("halt flag: {e}")),
        RequestError::Funding(e) => funding_error(e),
        RequestError::Task(e) => ApiError::Internal(format!("transfer task ended abnormally: {e}")),
        RequestError::Coordinator(e) => coordinator_error(e),
    }
}

fn coordinator_error(e: CoordinatorError) -> ApiError {
    match e {
        CoordinatorError::Refused(code) => ApiError::Refused(code),
        CoordinatorError::Conflict => ApiError::Refused(ErrorCode::Conflict),
        CoordinatorError::NotFound => {
            ApiError::Internal("transfer not found right after it was created".into())
        }
        CoordinatorError::Transition(e) => ApiError::Internal(format!("transition refused: {e}")),
        e @ CoordinatorError::OutcomeUnknown(_) => {
            ApiError::Internal(format!("event store: {}", application::error_chain(&e)))
        }
        e @ CoordinatorError::Invariant(_) => ApiError::Internal(application::error_chain(&e)),
    }
}

/// A refusal code from an account system, passed on only if it looks like a code; anything else
/// could be internal text.
fn refusal_code(code: &str) -> String {
    let plausible = !code.is_empty()
        && code.len() <= REFUSAL_CODE_CHARS_MAX
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if plausible {
        code.to_owned()
    } else {
        "REFUSED".to_owned()
    }
}

/// The answer to a transfer request.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TransferResponse {
    pub transfer_id: String,
    pub req_id: String,
    #[schema(schema_with = crate::openapi::schemas::account)]
    pub from: &'static str,
    #[schema(schema_with = crate::openapi::schemas::account)]
    pub to: &'static str,
    #[schema(schema_with = crate::openapi::schemas::asset)]
    pub asset: String,
    pub amount: String,
    pub state: &'static str,
    pub message: String,
    /// Why the target refused, for a transfer that was rolled back (or is being).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
}

fn state_message(data: &TransferData) -> String {
    let code = data.failure.as_ref().map(|(c, _)| refusal_code(c));
    match data.state {
        TransferState::Committed => "transfer committed".to_owned(),
        TransferState::RolledBack => format!(
            "the target account refused the transfer ({}); the amount was returned to the source account",
            code.unwrap_or_else(|| "REFUSED".into())
        ),
        TransferState::Compensating => format!(
            "the target account refused the transfer ({}); the amount is being returned to the source account",
            code.unwrap_or_else(|| "REFUSED".into())
        ),
        TransferState::Failed => "transfer failed".to_owned(),
        TransferState::Init
        | TransferState::SourcePending
        | TransferState::SourceDone
        | TransferState::TargetPending => format!(
            "transfer accepted and in progress; query GET /api/v1/internal_transfer/{} for its outcome",
            data.req_id
        ),
    }
}

/// `POST /api/v1/internal_transfer`: the body taken apart here, everything else is the core's
/// one command (`Ledger::request_transfer`).
#[utoipa::path(post, path = "/api/v1/internal_transfer",
    request_body = crate::openapi::schemas::TransferRequest,
    responses((status = 200, description = "ok", body = TransferResponse),
        crate::openapi::schemas::TransferRefusals))]
pub(crate) async fn create_transfer(
    State(state): State<AppState>,
    user: AuthUser,
    JsonObject(body): JsonObject,
) -> Result<Json<TransferResponse>, ApiError> {
    let request = transfer_request(body, user.user_id)?;
    let data = state
        .ledger
        .request_transfer(request)
        .await
        .map_err(request_error)?;
    transfer_answer(data)
}

/// The answer for a transfer as submitted: FAILED is the source's refusal with its code (and
/// the req_id, so it can be looked up); any other state is 200 with where the transfer stands.
pub(crate) fn transfer_answer(data: TransferData) -> Result<Json<TransferResponse>, ApiError> {
    if data.state == TransferState::Failed {
        let code = data
            .failure
            .as_ref()
            .map_or_else(|| "REFUSED".to_owned(), |(c, _)| refusal_code(c));
        return Err(ApiError::TransferFailed {
            code,
            req_id: data.req_id,
        });
    }
    let failure_code = match data.state {
        TransferState::RolledBack | TransferState::Compensating => {
            data.failure.as_ref().map(|(c, _)| refusal_code(c))
        }
        _ => None,
    };
    Ok(Json(TransferResponse {
        transfer_id: data.req_id.to_string(),
        req_id: data.req_id.to_string(),
        from: data.from.as_str(),
        to: data.to.as_str(),
        asset: data.asset.to_string(),
        amount: data.amount.to_string(),
        state: data.state.as_str(),
        message: state_message(&data),
        failure_code,
    }))
}

/// One transfer as `GET /api/v1/internal_transfer/{req_id}` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TransferDetail {
    pub transfer_id: String,
    pub req_id: String,
    #[schema(schema_with = crate::openapi::schemas::account)]
    pub from: &'static str,
    #[schema(schema_with = crate::openapi::schemas::account)]
    pub to: &'static str,
    #[schema(schema_with = crate::openapi::schemas::asset)]
    pub asset: String,
    pub amount: String,
    pub state: &'static str,
    #[schema(schema_with = crate::openapi::schemas::date_time)]
    pub created_at: String,
    #[schema(schema_with = crate::openapi::schemas::date_time)]
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
}

/// `GET /api/v1/internal_transfer/{req_id}`: the owner's transfer, folded from its events.
#[utoipa::path(get, path = "/api/v1/internal_transfer/{req_id}",
    params(crate::openapi::schemas::TransferPath),
    responses((status = 200, description = "ok", body = TransferDetail),
        crate::openapi::schemas::LookupRefusals))]
pub(crate) async fn get_transfer(
    State(state): State<AppState>,
    user: AuthUser,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TransferDetail>, ApiError> {
    let Ok(Path(raw)) = path else {
        return Err(ApiError::NotFound);
    };
    let req_id = ReqId::parse(&raw).map_err(|_| ApiError::NotFound)?;
    let data = state
        .ledger
        .coordinator()
        .load(&req_id)
        .await
        .map_err(coordinator_error)?
        .ok_or(ApiError::NotFound)?;
    // Another user's transfer is indistinguishable from a missing one.
    if data.user_id != user.user_id {
        return Err(ApiError::NotFound);
    }
    let (failure_code, failure_message) = match &data.failure {
        Some((code, _)) => {
            let code = refusal_code(code);
            // The message is rebuilt from the code: an account system's own text stays inside.
            let message = match crate::error::parse_code(&code) {
                Some(known) => crate::error::describe(known).to_owned(),
                None => "refused by the account system".to_owned(),
            };
            (Some(code), Some(message))
        }
        None => (None, None),
    };
    Ok(Json(TransferDetail {
        transfer_id: data.req_id.to_string(),
        req_id: data.req_id.to_string(),
        from: data.from.as_str(),
        to: data.to.as_str(),
        asset: data.asset.to_string(),
        amount: data.amount.to_string(),
        state: data.state.as_str(),
        created_at: rfc3339(data.created_at),
        updated_at: rfc3339(data.updated_at),
        failure_code,
        failure_message,
    }))
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub(crate) struct BalanceEntry {
    pub asset: String,
    pub funding: String,
    pub spot: String,
    pub in_flight: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Balances)]
pub(crate) struct BalancesResponse {
    pub user_id: u64,
    pub balances: Vec<BalanceEntry>,
}

/// `GET /api/v1/balances`: FUNDING, SPOT and in-flight amounts per asset for the caller. If
/// spot-core cannot answer, the whole request fails: a missing SPOT balance must never read as
/// zero.
#[utoipa::path(get, path = "/api/v1/balances",
    responses((status = 200, description = "ok", body = BalancesResponse),
        crate::openapi::schemas::BalancesRefusals))]
pub(crate) async fn balances(
    State(state): State<AppState>,
    user: AuthUser,
) -> Result<Json<BalancesResponse>, ApiError> {
    let balances = crate::render::user_balances(&state, user.user_id)
        .await?
        .into_iter()
        .map(|b| BalanceEntry {
            asset: b.asset,
            funding: money(b.funding),
            spot: money(b.spot),
            in_flight: money(b.in_flight),
        })
        .collect();
    Ok(Json(BalancesResponse {
        user_id: user.user_id.get(),
        balances,
    }))
}

fn funding_error(e: FundingError) -> ApiError {
    match e {
        FundingError::ExternalIdReused => ApiError::Refused(ErrorCode::IdempotencyKeyReused),
        FundingError::AccountNotFound => ApiError::NotFound,
        FundingError::Overflow => ApiError::Refused(ErrorCode::Overflow),
        FundingError::Database(e) => ApiError::Internal(format!("funding ledger: {e}")),
    }
}

fn check_external_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= EXTERNAL_ID_CHARS_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "external_id must be 1 to {EXTERNAL_ID_CHARS_MAX} characters of [A-Za-z0-9_.:-]"
        )))
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Deposit)]
pub(crate) struct DepositResponse {
    pub external_id: String,
    pub user_id: u64,
    pub asset: String,
    pub amount: String,
    /// False when this `external_id` had been applied before and nothing changed now.
    pub applied: bool,
    pub funding_balance: String,
}

/// `POST /api/v1/admin/deposits`: credits FUNDING from outside, once per `external_id`.
#[utoipa::path(post, path = "/api/v1/admin/deposits",
    request_body = crate::openapi::schemas::DepositRequest,
    responses((status = 200, description = "ok", body = DepositResponse),
        crate::openapi::schemas::DepositRefusals))]
pub(crate) async fn admin_deposit(
    State(state): State<AppState>,
    _admin: AdminUser,
    JsonObject(body): JsonObject,
) -> Result<Json<DepositResponse>, ApiError> {
    let mut fields = Fields(body);
    fields.deny_unknown(&["user_id", "asset", "amount", "external_id"])?;
    let user_id = fields.required("user_id")?;
    let asset = fields.required_str("asset")?;
    let amount = fields.required("amount")?;
    let external_id = fields.required_str("external_id")?;

    let user_id = parse_user_id(&user_id)?;
    let config = state.ledger.assets().get(&asset)?;
    // A delisted asset takes no new money in; internal_transfer_enabled is about transfers only.
    if config.status != AssetStatus::Active {
        return Err(ErrorCode::AssetSuspended.into());
    }
    let amount = parse_amount(&amount)?;
    config.check_precision(amount)?;
    check_external_id(&external_id)?;

    let receipt = state
        .ledger
        .funding()
        .external_deposit(&external_id, user_id, &config.symbol, amount)
        .await
        .map_err(funding_error)?;
    tracing::info!(%external_id, %user_id, asset = %config.symbol, %amount, applied = receipt.applied_now, "external deposit");
    Ok(Json(DepositResponse {
        external_id,
        user_id: user_id.get(),
        asset: config.symbol.to_string(),
        amount: amount.to_string(),
        applied: receipt.applied_now,
        funding_balance: money(receipt.balance),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AssetQuery {
    #[param(schema_with = crate::openapi::schemas::asset, required = false)]
    pub asset: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Status)]
pub(crate) struct StatusResponse {
    pub user_id: u64,
    pub account_type: &'static str,
    pub asset: String,
    pub status: &'static str,
}

/// `PUT /api/v1/admin/accounts/{user_id}/{account_type}/status`: body `{status, asset?}`, the
/// asset in the body or as `?asset=` (the body wins).
#[utoipa::path(put, path = "/api/v1/admin/accounts/{user_id}/{account_type}/status",
    params(crate::openapi::schemas::AccountPath, AssetQuery),
    request_body = crate::openapi::schemas::StatusRequest,
    responses((status = 200, description = "ok", body = StatusResponse),
        crate::openapi::schemas::StatusRefusals))]
pub(crate) async fn admin_set_status(
    State(state): State<AppState>,
    _admin: AdminUser,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<AssetQuery>, QueryRejection>,
    JsonObject(body): JsonObject,
) -> Result<Json<StatusResponse>, ApiError> {
    let Ok(Path((user_id, account_type))) = path else {
        return Err(ApiError::NotFound);
    };
    let Ok(Query(query)) = query else {
        return Err(ApiError::BadRequest("malformed query string".into()));
    };
    let user_id: UserId = user_id.parse()?;
    let account_type = AccountType::parse(&account_type)?;
    if !account_type.is_supported() {
        return Err(ErrorCode::UnsupportedAccountType.into());
    }

    let mut fields = Fields(body);
    fields.deny_unknown(&["status", "asset"])?;
    let status = fields.required_str("status")?;
    let body_asset = fields.optional_str("asset")?;
    // Given in both places, they must agree: a malformed or different `?asset=` is refused,
    // never silently ignored (found by scripts/schemathesis).
    if let (Some(in_body), Some(in_query)) = (&body_asset, &query.asset) {
        if in_body != in_query {
            return Err(ApiError::BadRequest(
                "`asset` in the body and in the query differ".into(),
            ));
        }
    }
    let asset = body_asset.or(query.asset).ok_or_else(|| {
        ApiError::BadRequest("`asset` is required, in the body or as ?asset=".into())
    })?;
    let status = AccountStatus::parse(&status).ok_or(ErrorCode::InvalidStatus)?;
    let config = state.ledger.assets().get(&asset)?;

    match account_type {
        AccountType::Funding => state
            .ledger
            .funding()
            .set_status(user_id, &config.symbol, status)
            .await
            .map_err(funding_error)?,
        AccountType::Spot => state
            .ledger
            .spot()
            .set_status(user_id, &config.symbol, status)
            .await
            .map_err(|e| ApiError::spot("set_status", e))?,
        AccountType::Future | AccountType::Margin => {
            unreachable!("unsupported account types were refused above")
        }
    }
    tracing::info!(%user_id, %account_type, asset = %config.symbol, status = status.as_str(), "account status set");
    Ok(Json(StatusResponse {
        user_id: user_id.get(),
        account_type: account_type.as_str(),
        asset: config.symbol.to_string(),
        status: status.as_str(),
    }))
}

/// `GET /healthz`: the process is alive.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "alive")))]
pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Any route that does not exist.
pub(crate) async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// A route that exists, called with the wrong method.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(n: u64) -> UserId {
        UserId::new(n).unwrap()
    }

    fn body(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn parse(value: Value) -> Result<NewTransfer, ApiError> {
        parse_transfer(body(value), user(7), &AssetRegistry::default_assets())
    }

    fn refused(code: ErrorCode) -> Result<NewTransfer, ApiError> {
        Err(ApiError::Refused(code))
    }

    #[test]
    fn a_good_request_becomes_a_new_transfer() {
        let parsed = parse(json!({
            "from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "100.50",
            "cid": "c-1", "user_id": 7
        }))
        .unwrap();
        assert_eq!(parsed.user_id, user(7));
        assert_eq!(parsed.from, AccountType::Funding);
        assert_eq!(parsed.to, AccountType::Spot);
        assert_eq!(parsed.asset.as_str(), "USDT");
        assert_eq!(parsed.amount.to_string(), "100.5");
        assert_eq!(parsed.cid.as_deref(), Some("c-1"));
        assert!(parse(
            json!({"from": "SPOT", "to": "FUNDING", "asset": "BTC", "amount": "1", "user_id": "7"})
        )
        .is_ok());
    }

    #[test]
    fn atk_002_another_users_id_is_forbidden_before_anything_else() {
        assert_eq!(
            parse(json!({"user_id": 8, "from": "X", "amount": 5, "extra": 1})).unwrap_err(),
            ApiError::Forbidden
        );
        for other in [json!("8"), json!(-7), json!("07"), json!(true), json!(7.0)] {
            assert_eq!(
                parse(json!({"user_id": other, "from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"})).unwrap_err(),
                ApiError::Forbidden,
                "{other}"
            );
        }
    }

    #[test]
    fn malformed_requests_are_bad_request() {
        let bad = |v: Value| matches!(parse(v), Err(ApiError::BadRequest(_)));
        assert!(bad(
            json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1", "memo": "x"})
        ));
        assert!(bad(json!({"to": "SPOT", "asset": "USDT", "amount": "1"})));
        assert!(bad(
            json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT"})
        ));
        assert!(bad(
            json!({"from": 1, "to": "SPOT", "asset": "USDT", "amount": "1"})
        ));
        assert!(bad(
            json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1", "cid": 5})
        ));
    }

    #[test]
    fn atk_007_008_account_types_are_checked_in_order() {
        assert_eq!(
            parse(json!({"from": "INVALID", "to": "INVALID", "asset": "NOPE", "amount": "-1"})),
            refused(ErrorCode::InvalidAccountType)
        );
        assert_eq!(
            parse(json!({"from": "SPOT", "to": "SPOT", "asset": "NOPE", "amount": "-1"})),
            refused(ErrorCode::SameAccount)
        );
        assert_eq!(
            parse(json!({"from": "FUNDING", "to": "FUTURE", "asset": "NOPE", "amount": "-1"})),
            refused(ErrorCode::UnsupportedAccountType)
        );
    }

    #[test]
    fn atk_009_an_unknown_asset_is_checked_before_the_amount() {
        assert_eq!(
            parse(json!({"from": "FUNDING", "to": "SPOT", "asset": "999999", "amount": "-1"})),
            refused(ErrorCode::InvalidAsset)
        );
        assert_eq!(
            parse(json!({"from": "FUNDING", "to": "SPOT", "asset": "usdt", "amount": "1"})),
            refused(ErrorCode::InvalidAsset)
        );
    }

    #[test]
    fn atk_003_to_006_amounts_are_refused_with_their_codes() {
        let with = |amount: Value| {
            parse(json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": amount}))
        };
        assert_eq!(with(json!("-100")), refused(ErrorCode::InvalidAmount));
        assert_eq!(with(json!("0")), refused(ErrorCode::InvalidAmount));
        assert_eq!(with(json!(100)), refused(ErrorCode::InvalidAmount));
        assert_eq!(with(json!(1.5)), refused(ErrorCode::InvalidAmount));
        assert_eq!(with(json!("1e3")), refused(ErrorCode::InvalidAmount));
        assert_eq!(
            with(json!("0.000000001")),
            refused(ErrorCode::PrecisionOverflow)
        );
        assert_eq!(
            with(json!("18446744073709551616")),
            refused(ErrorCode::Overflow)
        );
        assert_eq!(with(json!("100000001")), refused(ErrorCode::AmountTooLarge));
    }

    #[test]
    fn suspended_and_untransferable_assets_are_refused() {
        let mut assets = AssetRegistry::default_assets();
        let mut btc = assets.get("BTC").unwrap().clone();
        btc.status = AssetStatus::Suspended;
        assets.upsert(btc);
        let mut eth = assets.get("ETH").unwrap().clone();
        eth.internal_transfer_enabled = false;
        assets.upsert(eth);
        let request = |asset: &str| {
            parse_transfer(
                body(json!({"from": "FUNDING", "to": "SPOT", "asset": asset, "amount": "1"})),
                user(7),
                &assets,
            )
        };
        assert_eq!(request("BTC"), refused(ErrorCode::AssetSuspended));
        assert_eq!(request("ETH"), refused(ErrorCode::TransferNotAllowed));
    }

    #[test]
    fn only_plausible_refusal_codes_pass_through() {
        assert_eq!(refusal_code("INSUFFICIENT_BALANCE"), "INSUFFICIENT_BALANCE");
        assert_eq!(
            refusal_code("ERROR: relation \"x\" does not exist"),
            "REFUSED"
        );
        assert_eq!(refusal_code(""), "REFUSED");
    }

    #[test]
    fn external_ids_are_bounded_and_plain() {
        assert!(check_external_id("chain:tx-0x1.2_3").is_ok());
        assert!(check_external_id("").is_err());
        assert!(check_external_id(&"a".repeat(EXTERNAL_ID_CHARS_MAX + 1)).is_err());
        assert!(check_external_id("a b").is_err());
        assert!(check_external_id("a/b").is_err());
    }

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
