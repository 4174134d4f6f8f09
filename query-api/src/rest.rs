//! The query routes of REST: one transfer as its owner sees it, and the caller's balances. Both
//! read through the core's queries and the read models; neither changes anything.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;
use domain::ReqId;
use edge::auth::AuthUser;
use edge::error::{coordinator_error, ApiError};
use edge::render::{money, refusal_code, rfc3339};
use edge::state::AppState;
use serde::Serialize;
use utoipa::ToSchema;

/// One transfer as `GET /api/v1/internal_transfer/{req_id}` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TransferDetail {
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
    #[schema(schema_with = edge::openapi::date_time)]
    pub created_at: String,
    #[schema(schema_with = edge::openapi::date_time)]
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// The feed positions of the transfer's events so far, in order: its entries in the
    /// tamper-evident log (a receipt; `GET /api/v1/log/proof/inclusion` proves each). Absent only
    /// when they could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<u64>>)]
    pub log_positions: Option<Vec<i64>>,
    /// The cell whose log holds those positions, under a cell map (`?cell=` of the log routes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_cell: Option<u16>,
}

/// `GET /api/v1/internal_transfer/{req_id}`: the owner's transfer, folded from its events.
#[utoipa::path(get, path = "/api/v1/internal_transfer/{req_id}",
    params(edge::openapi::TransferPath),
    responses((status = 200, description = "ok", body = TransferDetail),
        edge::openapi::LookupRefusals))]
pub(crate) async fn get_transfer(
    State(state): State<AppState>,
    user: AuthUser,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TransferDetail>, ApiError> {
    let Ok(Path(raw)) = path else {
        return Err(ApiError::NotFound);
    };
    let req_id = ReqId::parse(&raw).map_err(|_| ApiError::NotFound)?;
    // Another user's transfer is indistinguishable from a missing one (the core's decision).
    let data = state
        .ledger
        .users_transfer(user.user_id, &req_id)
        .await
        .map_err(coordinator_error)?
        .ok_or(ApiError::NotFound)?;
    let (failure_code, failure_message) = match &data.failure {
        Some((code, _)) => {
            let code = refusal_code(code);
            // The message is rebuilt from the code: an account system's own text stays inside.
            let message = match edge::error::parse_code(&code) {
                Some(known) => edge::error::describe(known).to_owned(),
                None => "refused by the account system".to_owned(),
            };
            (Some(code), Some(message))
        }
        None => (None, None),
    };
    let req_id = data.req_id.to_string();
    let log_positions = edge::render::log_positions(&state, std::slice::from_ref(&req_id))
        .await
        .remove(&req_id);
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
        log_positions,
        log_cell: state.reads.log().cell(),
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
        edge::openapi::BalancesRefusals))]
pub(crate) async fn balances(
    State(state): State<AppState>,
    user: AuthUser,
) -> Result<Json<BalancesResponse>, ApiError> {
    let balances = edge::render::user_balances(&state, user.user_id)
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
