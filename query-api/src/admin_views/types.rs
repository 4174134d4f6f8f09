//! The admin views' response shapes (the admin API contract the console is built on, documented
//! in the OpenAPI document) and their conversions from the core's and the read models' values.
//! Amounts are exact decimal text, times RFC 3339 UTC with milliseconds.

use std::collections::BTreeMap;

use application::audit::history::{AssetResult, Run};
use application::audit::Mode;
use application::books::{JournalEntry, SpotError};
use application::reads::{Attempt, TransferRow};
use application::stores::LoggedEvent;
use chrono::{DateTime, Utc};
use domain::{TransferData, TransferEvent, TransferState};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use spot_core::protocol::LookupOp;
use utoipa::{IntoParams, ToSchema};

use edge::error::ApiError;
use edge::render::{money, rfc3339, MergedBalance};
use edge::state::AppState;

/// One transfer as the admin views list it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AdminTransfer {
    #[schema(schema_with = edge::openapi::req_id)]
    pub req_id: String,
    pub user_id: i64,
    pub cid: Option<String>,
    pub from: String,
    pub to: String,
    pub asset: String,
    /// Exact decimal text.
    pub amount: String,
    pub state: String,
    #[schema(schema_with = edge::openapi::date_time)]
    pub created_at: String,
    #[schema(schema_with = edge::openapi::date_time)]
    pub updated_at: String,
    /// Milliseconds since the last change (`updated_at`).
    pub age_ms: i64,
}

fn age_ms(now: DateTime<Utc>, at: DateTime<Utc>) -> i64 {
    (now - at).num_milliseconds().max(0)
}

impl AdminTransfer {
    pub fn from_row(r: &TransferRow, now: DateTime<Utc>) -> Self {
        Self {
            req_id: r.req_id.clone(),
            user_id: r.user_id,
            cid: r.cid.clone(),
            from: r.from_account.clone(),
            to: r.to_account.clone(),
            asset: r.asset.clone(),
            amount: money(r.amount),
            state: r.state.clone(),
            created_at: rfc3339(r.created_at),
            updated_at: rfc3339(r.updated_at),
            age_ms: age_ms(now, r.updated_at),
        }
    }

    pub fn from_data(d: &TransferData, now: DateTime<Utc>) -> Self {
        Self {
            req_id: d.req_id.to_string(),
            user_id: d.user_id.as_i64(),
            cid: d.cid.clone(),
            from: d.from.as_str().to_owned(),
            to: d.to.as_str().to_owned(),
            asset: d.asset.to_string(),
            amount: d.amount.to_string(),
            state: d.state.as_str().to_owned(),
            created_at: rfc3339(d.created_at),
            updated_at: rfc3339(d.updated_at),
            age_ms: age_ms(now, d.updated_at),
        }
    }
}

/// A page of the listing; `next` is the cursor of the following page (`null` on the last).
#[derive(Debug, Serialize, ToSchema)]
pub struct TransferPage {
    pub transfers: Vec<AdminTransfer>,
    pub next: Option<String>,
}

/// One event of a transfer, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimelineEvent {
    /// The event's sequence number within the transfer (1 for `TransferCreated`).
    pub version: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    /// When it happened (the time the event carries).
    #[schema(schema_with = edge::openapi::date_time)]
    pub at: String,
    /// The event's fields as stored.
    #[schema(value_type = Object)]
    pub data: Value,
}

impl TimelineEvent {
    pub fn from_logged(e: &LoggedEvent) -> Self {
        // Stored externally tagged (`{"TransferCreated": {...}}`): the fields are the inside.
        let data = match serde_json::to_value(&e.event) {
            Ok(Value::Object(outer)) if outer.len() == 1 => outer
                .into_iter()
                .next()
                .map_or(Value::Null, |(_, fields)| fields),
            Ok(other) => other,
            Err(_) => Value::Null,
        };
        Self {
            version: e.sequence,
            event_type: e.event_type.clone(),
            at: rfc3339(e.event.at()),
            data,
        }
    }
}

/// One recovery attempt: its outcome and error category, never the raw error text.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptEntry {
    #[schema(schema_with = edge::openapi::date_time)]
    pub at: String,
    #[schema(schema_with = edge::openapi::date_time)]
    pub finished_at: Option<String>,
    /// TERMINAL, UNKNOWN, CONFLICT or ERROR; `null` while running (or if its worker died).
    pub outcome: Option<String>,
    /// TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET, MISMATCH or UNKNOWN; `null` without an error.
    pub error_category: Option<String>,
    /// The states before and after the attempt.
    pub detail: Option<String>,
    pub worker: String,
}

impl AttemptEntry {
    pub fn from_attempt(a: &Attempt) -> Self {
        Self {
            at: rfc3339(a.started_at),
            finished_at: a.finished_at.map(rfc3339),
            outcome: a.outcome.clone(),
            error_category: a.error_category.clone(),
            detail: Some(format!(
                "{} -> {}",
                a.state_before,
                a.state_after.as_deref().unwrap_or("(unchanged)")
            )),
            worker: a.worker.clone(),
        }
    }
}

/// One row of the funding journal for the transfer's req_id.
#[derive(Debug, Serialize, ToSchema)]
pub struct FundingEntry {
    /// WITHDRAW, DEPOSIT or REFUND.
    pub operation: String,
    pub amount: String,
    pub asset: String,
    pub user_id: i64,
    /// APPLIED or REFUSED.
    pub state: &'static str,
    /// The refusal's code (CANCELLED for a cancelled call).
    pub code: Option<String>,
    #[schema(schema_with = edge::openapi::date_time)]
    pub at: String,
}

impl FundingEntry {
    pub fn from_journal(j: &JournalEntry) -> Self {
        Self {
            operation: j.operation.to_string(),
            amount: money(j.amount),
            asset: j.asset.clone(),
            user_id: j.user_id,
            state: if j.applied { "APPLIED" } else { "REFUSED" },
            code: j.code.clone(),
            at: rfc3339(j.at),
        }
    }
}

/// One record spot-core keeps for the req_id.
#[derive(Debug, Serialize, ToSchema)]
pub struct SpotRecord {
    /// withdraw, deposit or refund.
    pub op: String,
    pub user_id: u64,
    pub asset: String,
    pub amount: String,
    /// applied or refused.
    pub outcome: String,
    pub code: Option<String>,
    pub seq: u64,
}

/// spot-core's answer to a lookup of the req_id: `found` and its records, or `error` when it
/// could not answer (the rest of the timeline is still shown).
#[derive(Debug, Serialize, ToSchema)]
pub struct SpotLookup {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<Vec<SpotRecord>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn text_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

impl SpotLookup {
    pub fn from_result(result: Result<Vec<LookupOp>, SpotError>) -> Self {
        match result {
            Ok(ops) => Self {
                found: Some(!ops.is_empty()),
                records: Some(
                    ops.iter()
                        .map(|o| SpotRecord {
                            op: text_of(&o.op),
                            user_id: o.user_id,
                            asset: o.asset.clone(),
                            amount: money(o.amount),
                            outcome: text_of(&o.outcome),
                            code: o.code.map(|c| c.as_str().to_owned()),
                            seq: o.seq,
                        })
                        .collect(),
                ),
                error: None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "spot-core lookup for the admin timeline failed");
                let error = match e {
                    SpotError::Transport(_) => "spot-core unreachable or timed out",
                    SpotError::Unexpected(_) => "spot-core could not answer the lookup",
                };
                Self {
                    found: None,
                    records: None,
                    error: Some(error.to_owned()),
                }
            }
        }
    }
}

/// A manual resolution: who, when, why, and what it decided.
#[derive(Debug, Serialize, ToSchema)]
pub struct Resolution {
    /// The operator (`admin:<user id>` for the admin route).
    pub by: String,
    #[schema(schema_with = edge::openapi::date_time)]
    pub at: String,
    pub reason: String,
    /// APPLIED or NOT_APPLIED.
    pub outcome: &'static str,
    pub from_state: &'static str,
    pub to_state: &'static str,
}

/// The last manual resolution among a transfer's events, if any.
pub fn resolution_of(events: &[LoggedEvent]) -> Option<Resolution> {
    events.iter().rev().find_map(|e| match &e.event {
        TransferEvent::TransferManuallyResolved {
            resolution,
            from_state,
            to_state,
            operator,
            reason,
            at,
        } => Some(Resolution {
            by: operator.clone(),
            at: rfc3339(*at),
            reason: reason.clone(),
            outcome: resolution.as_str(),
            from_state: from_state.as_str(),
            to_state: to_state.as_str(),
        }),
        _ => None,
    })
}

/// One transfer with everything known about it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Timeline {
    pub transfer: AdminTransfer,
    /// The trace id (32 hex digits) of the request that created the transfer, when traces were
    /// exported then (`docs/adr/0018-traces.md`): look it up in the tracing backend; recovery
    /// attempts' traces link to it.
    #[schema(example = "4bf92f3577b34da6a3ce929d0e0e4736")]
    pub trace_id: Option<String>,
    pub events: Vec<TimelineEvent>,
    pub attempts: Vec<AttemptEntry>,
    pub funding: Vec<FundingEntry>,
    pub spot: SpotLookup,
    pub resolution: Option<Resolution>,
}

/// The path of `GET /api/v1/admin/users/{user_id}`. Schema only: utoipa reads the field's
/// attribute, no code reads the field.
#[allow(dead_code)]
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct UserPath {
    #[param(schema_with = edge::openapi::user_id)]
    pub user_id: u64,
}

/// One asset's balances of a user.
#[derive(Debug, Serialize, ToSchema)]
pub struct BalanceLine {
    pub asset: String,
    pub funding: String,
    pub spot: String,
    pub in_flight: String,
}

impl From<MergedBalance> for BalanceLine {
    fn from(b: MergedBalance) -> Self {
        Self {
            asset: b.asset,
            funding: money(b.funding),
            spot: money(b.spot),
            in_flight: money(b.in_flight),
        }
    }
}

/// One account (an asset of an account type) and its status.
#[derive(Debug, Serialize, ToSchema)]
pub struct AccountEntry {
    /// FUNDING or SPOT.
    pub account_type: &'static str,
    pub asset: String,
    /// ACTIVE, FROZEN or DISABLED.
    pub status: String,
}

/// One user: balances per asset, accounts, the latest transfers (newest first).
#[derive(Debug, Serialize, ToSchema)]
pub struct UserView {
    pub user_id: u64,
    pub balances: Vec<BalanceLine>,
    pub accounts: Vec<AccountEntry>,
    pub transfers: Vec<AdminTransfer>,
}

/// A conservation check in brief.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckSummary {
    #[schema(schema_with = edge::openapi::date_time)]
    pub at: String,
    pub ok: bool,
    pub duration_ms: i64,
    /// incremental or full.
    pub mode: &'static str,
    /// Assets out of balance plus transfers whose records disagree with their events.
    pub violations: i32,
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Incremental => "incremental",
        Mode::Full => "full",
    }
}

impl CheckSummary {
    pub fn from_run(r: &Run) -> Self {
        Self {
            at: rfc3339(r.checked_at),
            ok: r.ok,
            duration_ms: r.duration_ms,
            mode: mode_name(r.mode),
            violations: r.violations,
        }
    }
}

/// The lags of what follows the event log.
#[derive(Debug, Serialize, ToSchema)]
pub struct Lag {
    /// Events appended and not yet applied by the read models' projector.
    pub projector_positions: i64,
    /// Age of the oldest event not yet applied (0 when none).
    pub projector_seconds: f64,
    /// Milliseconds since a recovery worker last finished a pass (`null`: never).
    pub recovery_last_pass_age_ms: Option<i64>,
    /// The JetStream relay's feed positions not yet acknowledged (`null`: no relay ever ran;
    /// the largest over streams).
    pub relay_positions: Option<i64>,
    /// Age of the oldest event not yet relayed (`null`: no relay ever ran).
    pub relay_seconds: Option<f64>,
}

impl Lag {
    pub async fn read(state: &AppState) -> Result<Self, ApiError> {
        let internal = |e| ApiError::store("lags", e);
        let projector = state
            .reads
            .admin()
            .projector_lag()
            .await
            .map_err(internal)?;
        let heartbeat = state.reads.heartbeat().await.map_err(internal)?;
        let relays = state.reads.relay_status().await.map_err(internal)?;
        Ok(Self {
            projector_positions: projector.positions,
            projector_seconds: projector.seconds,
            recovery_last_pass_age_ms: heartbeat.map(|h| h.age_ms),
            relay_positions: relays.iter().map(|r| r.lag_positions).max(),
            relay_seconds: relays.iter().map(|r| r.lag_seconds).reduce(f64::max),
        })
    }
}

/// The system at a glance.
#[derive(Debug, Serialize, ToSchema)]
pub struct Overview {
    /// Transfers per state name (every state, 0 included).
    pub by_state: BTreeMap<String, i64>,
    /// Transfers created in the last 60 seconds.
    pub rate_last_minute: i64,
    /// Milliseconds since the oldest open transfer last changed (`null`: none open).
    pub oldest_open_age_ms: Option<i64>,
    pub oldest_open_req_id: Option<String>,
    pub last_check: Option<CheckSummary>,
    pub halted: bool,
    pub halt_reason: Option<String>,
    pub lag: Lag,
}

/// Every state with its count, 0 for a state not counted yet.
pub fn by_state(counts: Vec<(String, i64)>) -> BTreeMap<String, i64> {
    let mut all: BTreeMap<String, i64> = TransferState::ALL
        .iter()
        .map(|s| (s.as_str().to_owned(), 0))
        .collect();
    for (state, count) in counts {
        *all.entry(state).or_default() += count;
    }
    all
}

/// One conservation check with its per-asset results.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckEntry {
    /// The run's id.
    pub id: i64,
    #[schema(schema_with = edge::openapi::date_time)]
    pub at: String,
    pub ok: bool,
    pub duration_ms: i64,
    pub mode: &'static str,
    pub violations: i32,
    pub assets: Vec<AssetLine>,
    /// Where its full report is served (`GET /api/v1/admin/invariant/runs/{id}`); absent once
    /// the report has been pruned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
}

/// One asset's result in a check.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssetLine {
    pub asset: String,
    pub ok: bool,
    /// funding + spot + in_flight - deposits (exact decimal text); present when not 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl CheckEntry {
    pub fn from_run(r: &Run) -> Self {
        Self {
            at: rfc3339(r.checked_at),
            ok: r.ok,
            duration_ms: r.duration_ms,
            mode: mode_name(r.mode),
            violations: r.violations,
            assets: r.assets.iter().map(AssetLine::from_result).collect(),
            report: r
                .has_report
                .then(|| format!("/api/v1/admin/invariant/runs/{}", r.id)),
            id: r.id,
        }
    }
}

impl AssetLine {
    fn from_result(a: &AssetResult) -> Self {
        Self {
            asset: a.asset.clone(),
            ok: a.ok,
            detail: (!a.ok).then(|| format!("difference {}", a.difference)),
        }
    }
}

/// The recent checks, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckHistory {
    pub checks: Vec<CheckEntry>,
}
