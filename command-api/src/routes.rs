//! The command routes of `docs/contract.md`: create a transfer, credit a deposit from outside,
//! set an account's status. Each takes its body apart here (`body.rs`), in the contract's check
//! order, and calls one command of the core (`application::Ledger`).

use application::books::AccountStatus;
use application::{AccountError, DepositRequest, NewTransfer, RequestError, TransferRequest};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use domain::{AccountType, AssetRegistry, ErrorCode, TransferData, TransferState, UserId};
use edge::auth::{AdminUser, AuthUser};
use edge::error::{coordinator_error, ApiError};
use edge::render::{money, refusal_code};
use edge::state::AppState;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::body::{parse_user_id, Fields, JsonObject};

/// Takes a transfer request's body apart after authentication, in the order of contract §5.5:
/// authorization (a body `user_id` must be the caller), then the body's shape (known
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
        RequestError::Funding(e) => ApiError::funding(e),
        RequestError::Task(e) => ApiError::Internal(format!("transfer task ended abnormally: {e}")),
        RequestError::Coordinator(e) => coordinator_error(e),
    }
}

/// The answer to a transfer request.
#[derive(Debug, Serialize, ToSchema)]
pub struct TransferResponse {
    pub transfer_id: String,
    pub req_id: String,
    #[schema(schema_with = edge::openapi::account)]
    pub from: &'static str,
    #[schema(schema_with = edge::openapi::account)]
    pub to: &'static str,
    #[schema(schema_with = edge::openapi::asset)]
    pub asset: String,
    pub amount: String,
    pub state: &'static str,
    pub message: String,
    /// Why the target refused, for a transfer that was rolled back (or is being).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    /// The feed positions of the transfer's events so far, in order: its entries in the
    /// tamper-evident log, a receipt to prove later against any checkpoint at least as large
    /// (`GET /api/v1/log/proof/inclusion`). Absent only when they could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<u64>>)]
    pub log_positions: Option<Vec<i64>>,
    /// The cell whose log holds those positions, under a cell map (`?cell=` of the log routes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_cell: Option<u16>,
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
    request_body = edge::openapi::TransferRequest,
    responses((status = 200, description = "ok", body = TransferResponse),
        edge::openapi::TransferRefusals))]
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
    let mut positions = match data.state {
        TransferState::Failed => Default::default(),
        _ => edge::render::log_positions(&state, &[data.req_id.to_string()]).await,
    };
    let receipt = positions.remove(&data.req_id.to_string());
    transfer_answer(data, receipt, state.reads.log().cell())
}

/// The answer for a transfer as submitted: FAILED is the source's refusal with its code (and
/// the req_id, so it can be looked up); any other state is 200 with where the transfer stands and
/// its events' feed positions (`log_positions`).
pub(crate) fn transfer_answer(
    data: TransferData,
    log_positions: Option<Vec<i64>>,
    log_cell: Option<u16>,
) -> Result<Json<TransferResponse>, ApiError> {
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
        log_positions,
        log_cell,
    }))
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
    request_body = edge::openapi::DepositRequest,
    responses((status = 200, description = "ok", body = DepositResponse),
        edge::openapi::DepositRefusals))]
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

    let request = DepositRequest {
        user_id: parse_user_id(&user_id)?,
        asset,
        // Only a JSON string is an amount (see `transfer_request`).
        amount: match amount {
            Value::String(text) => Some(text),
            _ => None,
        },
        external_id,
    };
    let external_id = request.external_id.clone();
    let user_id = request.user_id;
    let deposited = state
        .ledger
        .external_deposit(request)
        .await
        .map_err(account_error)?;
    Ok(Json(DepositResponse {
        external_id,
        user_id: user_id.get(),
        asset: deposited.asset.to_string(),
        amount: deposited.amount.to_string(),
        applied: deposited.receipt.applied_now,
        funding_balance: money(deposited.receipt.balance),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AssetQuery {
    #[param(schema_with = edge::openapi::asset, required = false)]
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
    params(edge::openapi::AccountPath, AssetQuery),
    request_body = edge::openapi::StatusRequest,
    responses((status = 200, description = "ok", body = StatusResponse),
        edge::openapi::StatusRefusals))]
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
    let set = state
        .ledger
        .set_status(user_id, account_type, &asset, status)
        .await
        .map_err(account_error)?;
    Ok(Json(StatusResponse {
        user_id: set.user_id.get(),
        account_type: set.account_type.as_str(),
        asset: set.asset.to_string(),
        status: set.status.as_str(),
    }))
}

/// A refused or failed account command in the error shape.
fn account_error(e: AccountError) -> ApiError {
    match e {
        AccountError::Refused(code) => ApiError::Refused(code),
        AccountError::ExternalId => ApiError::BadRequest(e.to_string()),
        AccountError::Funding(e) => ApiError::funding(e),
        AccountError::Spot(e) => ApiError::spot("set_status", e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::AssetStatus;
    use serde_json::json;

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
}
