//! What an operator reads (the console is built on these; a script can use them as well), all
//! admin-only and read-only:
//!
//! - `GET /api/v1/admin/transfers`: any user's transfers, filtered, newest first, with a keyset
//!   cursor (`next`) that rows created meanwhile never shift;
//! - `GET /api/v1/admin/transfers/{req_id}`: one transfer's whole timeline: its events, the
//!   recovery attempts with their error categories, each account system's record of its req_id
//!   (the funding journal's rows and spot-core's lookup, whose failure is shown, not fatal), and
//!   a manual resolution's who, when and why;
//! - `GET /api/v1/admin/users/{user_id}`: balances per asset, account statuses, latest transfers;
//! - `GET /api/v1/admin/overview`: counts by state, the last minute's rate, the oldest open
//!   transfer, the last conservation check, the halt flag, and the lags of the projector, the
//!   recovery worker and the relay;
//! - `GET /api/v1/admin/invariant/history`: the recent conservation checks, each naming its full
//!   report;
//! - `GET /api/v1/admin/invariant/runs/{id}`: one check's full report, as the check returned it
//!   (404 once pruned).
//!
//! Every handler takes a read turn from `admission.rs` first and runs its queries one by one.
//! The response types are in `admin_views/types.rs`, the query parsing in
//! `admin_views/params.rs`.

mod params;
mod types;

use application::reads::AdminFilter;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::Method;
use axum::Json;
use chrono::Utc;
use domain::ReqId;

use edge::auth::AdminUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

pub use params::{HistoryParams, RunPath, TransfersParams};
pub use types::*;

/// Latest transfers a user view shows.
pub const USER_TRANSFERS_SHOWN: i64 = 20;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Routes {
    Routes::new()
        .api(Method::GET, "/api/v1/admin/transfers", list_transfers)
        .api(
            Method::GET,
            "/api/v1/admin/transfers/{req_id}",
            transfer_timeline,
        )
        .api(Method::GET, "/api/v1/admin/users/{user_id}", user_view)
        .api(Method::GET, "/api/v1/admin/overview", overview)
        .api(
            Method::GET,
            "/api/v1/admin/invariant/history",
            invariant_history,
        )
        .api(
            Method::GET,
            "/api/v1/admin/invariant/runs/{id}",
            invariant_run_report,
        )
}

fn internal<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> ApiError {
    move |e| ApiError::Internal(format!("{what}: {e}"))
}

async fn turn(state: &AppState) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
    state
        .admission
        .read()
        .await
        .map_err(|_| ApiError::Refused(domain::ErrorCode::RateLimitExceeded))
}

/// `GET /api/v1/admin/transfers`: any user's transfers, newest first, filtered, paged.
#[utoipa::path(get, path = "/api/v1/admin/transfers",
    params(TransfersParams),
    responses((status = 200, description = "ok", body = TransferPage),
        edge::openapi::AdminReadRefusals))]
pub async fn list_transfers(
    State(state): State<AppState>,
    _admin: AdminUser,
    query: Result<Query<TransfersParams>, QueryRejection>,
) -> Result<Json<TransferPage>, ApiError> {
    let Ok(Query(query)) = query else {
        return Err(ApiError::BadRequest("malformed query string".into()));
    };
    let (filter, after, limit) = query.parse()?;
    let _turn = turn(&state).await?;
    let view = state.reads.admin();
    let rows = view
        .transfers(&filter, after.as_ref(), limit)
        .await
        .map_err(internal("admin transfers"))?;
    let now = Utc::now();
    let next = if i64::try_from(rows.len()).unwrap_or(i64::MAX) == limit {
        rows.last().map(params::encode_cursor)
    } else {
        None
    };
    Ok(Json(TransferPage {
        transfers: rows
            .iter()
            .map(|r| AdminTransfer::from_row(r, now))
            .collect(),
        next,
    }))
}

/// `GET /api/v1/admin/transfers/{req_id}`: one transfer with its whole timeline.
#[utoipa::path(get, path = "/api/v1/admin/transfers/{req_id}",
    params(edge::openapi::TransferPath),
    responses((status = 200, description = "ok", body = Timeline),
        edge::openapi::AdminLookupRefusals))]
pub async fn transfer_timeline(
    State(state): State<AppState>,
    _admin: AdminUser,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Timeline>, ApiError> {
    let Ok(Path(raw)) = path else {
        return Err(ApiError::NotFound);
    };
    let req_id = ReqId::parse(&raw).map_err(|_| ApiError::NotFound)?;
    let _turn = turn(&state).await?;
    let ledger = &state.ledger;
    let logged = ledger
        .transfer_events(&req_id)
        .await
        .map_err(|e| ApiError::Internal(format!("transfer events: {e}")))?;
    let data = ledger
        .transfer(&req_id)
        .await
        .map_err(|e| ApiError::Internal(format!("load transfer: {e}")))?
        .ok_or(ApiError::NotFound)?;
    let attempts = state
        .reads
        .attempts(&req_id)
        .await
        .map_err(internal("recovery attempts"))?;
    let funding = state
        .queries
        .funding_records(&req_id)
        .await
        .map_err(|e| ApiError::Internal(format!("funding journal: {e}")))?;
    let spot = SpotLookup::from_result(state.queries.spot_records(&req_id).await);
    let trace_id = state
        .reads
        .first_trace_id(&req_id)
        .await
        .map_err(internal("first trace"))?;
    Ok(Json(Timeline {
        trace_id,
        transfer: AdminTransfer::from_data(&data, Utc::now()),
        events: logged.iter().map(TimelineEvent::from_logged).collect(),
        attempts: attempts.iter().map(AttemptEntry::from_attempt).collect(),
        funding: funding.iter().map(FundingEntry::from_journal).collect(),
        spot,
        resolution: resolution_of(&logged),
    }))
}

/// `GET /api/v1/admin/users/{user_id}`: one user's balances, accounts and latest transfers.
#[utoipa::path(get, path = "/api/v1/admin/users/{user_id}",
    params(UserPath),
    responses((status = 200, description = "ok", body = UserView),
        edge::openapi::AdminUserRefusals))]
pub async fn user_view(
    State(state): State<AppState>,
    _admin: AdminUser,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<UserView>, ApiError> {
    let user = path
        .ok()
        .and_then(|Path(raw)| raw.parse::<u64>().ok())
        .and_then(|n| domain::UserId::new(n).ok())
        .ok_or_else(|| ApiError::BadRequest("user id must be a positive integer".into()))?;
    let _turn = turn(&state).await?;
    let merged = edge::render::user_balances(&state, user).await?;
    let mut accounts = Vec::new();
    let funding = state
        .queries
        .funding_balances(user)
        .await
        .map_err(|e| ApiError::Internal(format!("funding accounts: {e}")))?;
    accounts.extend(funding.into_iter().map(|b| AccountEntry {
        account_type: "FUNDING",
        asset: b.asset,
        status: b.status,
    }));
    let spot = state
        .queries
        .spot_balances(user)
        .await
        .map_err(|e| ApiError::Unavailable(format!("spot accounts: {e}")))?;
    accounts.extend(spot.into_iter().map(|b| AccountEntry {
        account_type: "SPOT",
        asset: b.asset,
        status: b.status,
    }));
    let filter = AdminFilter {
        user_id: Some(user.as_i64()),
        ..AdminFilter::default()
    };
    let rows = state
        .reads
        .admin()
        .transfers(&filter, None, USER_TRANSFERS_SHOWN)
        .await
        .map_err(internal("user transfers"))?;
    let now = Utc::now();
    Ok(Json(UserView {
        user_id: user.get(),
        balances: merged.into_iter().map(BalanceLine::from).collect(),
        accounts,
        transfers: rows
            .iter()
            .map(|r| AdminTransfer::from_row(r, now))
            .collect(),
    }))
}

/// `GET /api/v1/admin/overview`: the system at a glance.
#[utoipa::path(get, path = "/api/v1/admin/overview",
    responses((status = 200, description = "ok", body = Overview),
        edge::openapi::AdminReadRefusals))]
pub async fn overview(
    State(state): State<AppState>,
    _admin: AdminUser,
) -> Result<Json<Overview>, ApiError> {
    let _turn = turn(&state).await?;
    let view = state.reads.admin();
    let counts = view
        .state_counts()
        .await
        .map_err(internal("state counts"))?;
    let rate = view
        .created_since(Utc::now() - chrono::TimeDelta::seconds(60))
        .await
        .map_err(internal("rate"))?;
    let oldest = state
        .reads
        .stuck(std::time::Duration::ZERO, 1)
        .await
        .map_err(internal("oldest open transfer"))?
        .into_iter()
        .next();
    let last_check = state
        .queries
        .last_check()
        .await
        .map_err(internal("last check"))?;
    let (halted, halt_reason) = state
        .ledger
        .halt_status()
        .await
        .map_err(internal("halt flag"))?;
    let lag = Lag::read(&state).await?;
    Ok(Json(Overview {
        by_state: by_state(counts),
        rate_last_minute: rate,
        oldest_open_age_ms: oldest.as_ref().map(|o| o.age_ms),
        oldest_open_req_id: oldest.map(|o| o.req_id),
        last_check: last_check.as_ref().map(CheckSummary::from_run),
        halted,
        halt_reason,
        lag,
    }))
}

/// `GET /api/v1/admin/invariant/history?limit=N`: the recent conservation checks, newest first.
#[utoipa::path(get, path = "/api/v1/admin/invariant/history",
    params(HistoryParams),
    responses((status = 200, description = "ok", body = CheckHistory),
        edge::openapi::HistoryRefusals))]
pub async fn invariant_history(
    State(state): State<AppState>,
    _admin: AdminUser,
    query: Result<Query<HistoryParams>, QueryRejection>,
) -> Result<Json<CheckHistory>, ApiError> {
    let Ok(Query(query)) = query else {
        return Err(ApiError::BadRequest("malformed query string".into()));
    };
    let limit = query.limit()?;
    let cell = query.cell.map(|c| c.to_string());
    state.reads.check_cell(cell.as_deref(), "check history")?;
    let _turn = turn(&state).await?;
    let runs = state
        .queries
        .check_history(limit)
        .await
        .map_err(internal("check history"))?;
    Ok(Json(CheckHistory {
        checks: runs.iter().map(CheckEntry::from_run).collect(),
    }))
}

/// `GET /api/v1/admin/invariant/runs/{id}`: one check's full report (`invariant_checks`), as
/// `GET /api/v1/admin/invariant` returned it without `halted`: per asset its figures, the
/// disagreeing transfers, the positions read. 404 when there is no such run or its report has
/// been pruned.
///
/// A run's id is its cell's own: under a cell map `?cell=N` names the cell (the front router
/// requires it and sends the request there); here it must name this cell (without a map, cell
/// 1; absent, this one).
#[utoipa::path(get, path = "/api/v1/admin/invariant/runs/{id}",
    params(RunPath, edge::openapi::CheckCell),
    responses((status = 200, description = "ok", body = Object),
        edge::openapi::RunRefusals))]
pub async fn invariant_run_report(
    State(state): State<AppState>,
    _admin: AdminUser,
    path: Result<Path<RunPath>, PathRejection>,
    Query(params): Query<std::collections::HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Ok(Path(RunPath { id })) = path else {
        return Err(ApiError::NotFound);
    };
    state
        .reads
        .check_cell(params.get("cell").map(String::as_str), "check run")?;
    let _turn = turn(&state).await?;
    let report = state
        .queries
        .check_report(id)
        .await
        .map_err(internal("check report"))?;
    report.map(Json).ok_or(ApiError::NotFound)
}
