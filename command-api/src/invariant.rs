//! Fund conservation (DESIGN section 6), exact: per asset, FUNDING + SPOT + in-flight equals the
//! external deposits, where in-flight is reconciled from what each account system actually
//! applied, keyed by req_id (the funding journal and spot-core's journal), not guessed from
//! transfer states. Every transfer whose records disagree with its events is reported. A real
//! violation raises a CRITICAL alert and halts new transfers (MON-003) until an admin clears it.
//!
//! Why it cannot raise a false alarm on a transfer caught between an adapter call and its
//! recorded outcome: a movement counts as in flight from the moment its system applied it,
//! whatever the transfer's state says. And the per-transfer check reads the events twice, before
//! and after the journals: what the earlier events say *must* have been applied is looked for in
//! the (later) journals, and what the journals show applied must be *allowed* by the (later)
//! events, so a transfer moving on during the check is never mistaken for a broken one.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use adapters::SpotAdapter;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use domain::{AccountType, ErrorCode, TransferEvent, TransferState};
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::json;
use spot_core::protocol::{
    JournalRecord, MovementOp, Outcome, Request, Response, MAX_JOURNAL_LIMIT,
};
use sqlx::PgPool;

use crate::app::AppState;
use crate::auth::AdminUser;
use crate::error::ApiError;

/// How often the periodic check runs, unless `LEDGER_INVARIANT_INTERVAL_SECS` says otherwise.
pub const CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// How many times the check re-reads spot-core's totals when operations keep arriving between
/// its journal and its totals.
const SPOT_SNAPSHOT_ATTEMPTS_MAX: usize = 20;

/// The most spot-core journal records one check reads (bounds memory).
const SPOT_JOURNAL_RECORDS_MAX: usize = 10_000_000;

/// The check's routes; merged into the application router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/invariant", get(run_check))
        .route("/api/v1/admin/invariant/clear", post(clear_halt))
}

/// One asset's sums.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AssetReport {
    pub asset: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub deposits: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub funding: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub spot: Decimal,
    /// Reconciled: applied withdraws minus applied deposits and refunds, per req_id, in both
    /// systems.
    #[serde(with = "rust_decimal::serde::str")]
    pub in_flight: Decimal,
    /// Seed 000's estimate from states (SOURCE_DONE, TARGET_PENDING, COMPENSATING), for
    /// comparison; it differs from `in_flight` only for transfers caught mid-step.
    #[serde(with = "rust_decimal::serde::str")]
    pub in_flight_by_state: Decimal,
    /// funding + spot + in_flight - deposits: zero when money is conserved.
    #[serde(with = "rust_decimal::serde::str")]
    pub difference: Decimal,
    pub ok: bool,
}

/// A transfer (or a req_id with no transfer) whose records disagree with its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagreement {
    pub req_id: String,
    pub state: Option<String>,
    pub problem: String,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvariantReport {
    pub ok: bool,
    pub checked_at: DateTime<Utc>,
    pub assets: Vec<AssetReport>,
    pub disagreements: Vec<Disagreement>,
    pub transfers_checked: usize,
}

/// Why a check could not decide.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("spot-core: {0}")]
    Spot(String),
    #[error("event log: {0}")]
    Log(String),
}

/// One applied movement of one system.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    system: AccountType,
    op: &'static str,
    user_id: i64,
    asset: String,
    amount: Decimal,
}

/// A transfer's details and state, from its events.
#[derive(Debug, Clone)]
struct Known {
    user_id: i64,
    from: String,
    to: String,
    asset: String,
    amount: Decimal,
    state: TransferState,
}

/// Every transfer's current state, from the last event of each (the log is the truth).
async fn transfer_states(pool: &PgPool) -> Result<HashMap<String, TransferState>, CheckError> {
    let rows: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT DISTINCT ON (aggregate_id) aggregate_id, payload::jsonb
         FROM events WHERE aggregate_type = 'Transfer'
         ORDER BY aggregate_id, sequence DESC",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(id, payload)| {
            let event: TransferEvent = serde_json::from_value(payload)
                .map_err(|e| CheckError::Log(format!("{id}: {e}")))?;
            Ok((id, event.resulting_state()))
        })
        .collect()
}

async fn transfer_details(
    pool: &PgPool,
    states: &HashMap<String, TransferState>,
) -> Result<HashMap<String, Known>, CheckError> {
    let rows: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT aggregate_id, payload::jsonb FROM events
         WHERE aggregate_type = 'Transfer' AND sequence = 1",
    )
    .fetch_all(pool)
    .await?;
    let mut known = HashMap::new();
    for (id, payload) in rows {
        let event: TransferEvent =
            serde_json::from_value(payload).map_err(|e| CheckError::Log(format!("{id}: {e}")))?;
        let TransferEvent::TransferCreated {
            user_id,
            from,
            to,
            asset,
            amount,
            ..
        } = event
        else {
            return Err(CheckError::Log(format!(
                "{id}: first event is not TransferCreated"
            )));
        };
        let Some(state) = states.get(&id).copied() else {
            continue;
        };
        known.insert(
            id,
            Known {
                user_id: user_id.as_i64(),
                from: from.as_str().to_owned(),
                to: to.as_str().to_owned(),
                asset: asset.as_str().to_owned(),
                amount: amount.value(),
                state,
            },
        );
    }
    Ok(known)
}

/// FUNDING's side in one consistent snapshot: balances, deposits, and applied movements.
struct FundingSnapshot {
    balances: BTreeMap<String, Decimal>,
    deposits: BTreeMap<String, Decimal>,
    applied: Vec<(String, Applied)>,
}

async fn funding_snapshot(pool: &PgPool) -> Result<FundingSnapshot, CheckError> {
    let mut tx = pool.begin().await?;
    // One snapshot for all three reads, so balances and journal agree with each other.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let balances: Vec<(String, Decimal)> =
        sqlx::query_as("SELECT asset, SUM(balance) FROM funding_accounts GROUP BY asset")
            .fetch_all(&mut *tx)
            .await?;
    let deposits: Vec<(String, Decimal)> =
        sqlx::query_as("SELECT asset, SUM(amount) FROM external_deposits GROUP BY asset")
            .fetch_all(&mut *tx)
            .await?;
    let journal: Vec<(String, String, i64, String, Decimal)> = sqlx::query_as(
        "SELECT req_id, operation, user_id, asset, amount FROM funding_journal
         WHERE outcome = 'APPLIED'",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let applied = journal
        .into_iter()
        .map(|(req_id, op, user_id, asset, amount)| {
            let op = match op.as_str() {
                "WITHDRAW" => "withdraw",
                "DEPOSIT" => "deposit",
                _ => "refund",
            };
            (
                req_id,
                Applied {
                    system: AccountType::Funding,
                    op,
                    user_id,
                    asset,
                    amount,
                },
            )
        })
        .collect();
    Ok(FundingSnapshot {
        balances: balances.into_iter().collect(),
        deposits: deposits.into_iter().collect(),
        applied,
    })
}

async fn spot_call(spot: &SpotAdapter, request: &Request) -> Result<Response, CheckError> {
    spot.client()
        .call(request)
        .await
        .map_err(|e| CheckError::Spot(e.to_string()))
}

async fn spot_journal_after(
    spot: &SpotAdapter,
    mut after_seq: u64,
    into: &mut Vec<JournalRecord>,
) -> Result<u64, CheckError> {
    loop {
        let request = Request::Journal {
            after_seq,
            limit: MAX_JOURNAL_LIMIT,
        };
        let records = match spot_call(spot, &request).await? {
            Response::Ok {
                records: Some(records),
                ..
            } => records,
            other => return Err(CheckError::Spot(format!("unexpected answer {other:?}"))),
        };
        let Some(last) = records.last() else {
            return Ok(after_seq);
        };
        after_seq = last.seq();
        into.extend(records);
        if into.len() > SPOT_JOURNAL_RECORDS_MAX {
            return Err(CheckError::Spot(
                "journal larger than the check reads".into(),
            ));
        }
    }
}

/// SPOT's side: totals and the journal that produced exactly them. spot-core applies operations
/// one at a time, so totals read with no journal record after the last one read belong to it.
async fn spot_snapshot(
    spot: &SpotAdapter,
) -> Result<(BTreeMap<String, Decimal>, Vec<(String, Applied)>), CheckError> {
    let mut records = Vec::new();
    let mut seq = spot_journal_after(spot, 0, &mut records).await?;
    for _ in 0..SPOT_SNAPSHOT_ATTEMPTS_MAX {
        let totals = match spot_call(spot, &Request::Totals {}).await? {
            Response::Ok {
                totals: Some(totals),
                ..
            } => totals,
            other => return Err(CheckError::Spot(format!("unexpected answer {other:?}"))),
        };
        let before = records.len();
        seq = spot_journal_after(spot, seq, &mut records).await?;
        if records.len() == before {
            let totals = totals.into_iter().map(|t| (t.asset, t.sum)).collect();
            let applied = records
                .iter()
                .filter_map(JournalRecord::as_movement)
                .filter(|(_, m)| m.outcome == Outcome::Applied)
                .map(|(op, m)| {
                    let op = match op {
                        MovementOp::Withdraw => "withdraw",
                        MovementOp::Deposit => "deposit",
                        MovementOp::Refund => "refund",
                    };
                    (
                        m.req_id.clone(),
                        Applied {
                            system: AccountType::Spot,
                            op,
                            user_id: i64::try_from(m.user_id).unwrap_or(i64::MAX),
                            asset: m.asset.clone(),
                            amount: m.amount,
                        },
                    )
                })
                .collect();
            return Ok((totals, applied));
        }
    }
    Err(CheckError::Spot(
        "spot-core kept changing while its totals were read".into(),
    ))
}

/// Which of a transfer's movements its state requires to have been applied, and which it allows.
fn required(state: TransferState, op: &str) -> bool {
    use TransferState as S;
    match op {
        "withdraw" => matches!(
            state,
            S::SourceDone | S::TargetPending | S::Committed | S::Compensating | S::RolledBack
        ),
        "deposit" => state == S::Committed,
        _ => state == S::RolledBack,
    }
}

fn allowed(state: TransferState, op: &str) -> bool {
    use TransferState as S;
    match op {
        "withdraw" => !matches!(state, S::Init | S::Failed),
        "deposit" => matches!(state, S::TargetPending | S::Committed),
        _ => matches!(state, S::Compensating | S::RolledBack),
    }
}

fn entry<'a>(assets: &'a mut BTreeMap<String, AssetReport>, asset: &str) -> &'a mut AssetReport {
    assets
        .entry(asset.to_owned())
        .or_insert_with(|| AssetReport {
            asset: asset.to_owned(),
            ..AssetReport::default()
        })
}

/// Runs the check against the database and spot-core. Reads the events first, then the journals,
/// then the events again (see the module's doc for why).
pub async fn check(pool: &PgPool, spot: &SpotAdapter) -> Result<InvariantReport, CheckError> {
    let before = transfer_states(pool).await?;
    let funding = funding_snapshot(pool).await?;
    let (spot_totals, spot_applied) = spot_snapshot(spot).await?;
    let after = transfer_states(pool).await?;
    let known = transfer_details(pool, &after).await?;

    let mut assets: BTreeMap<String, AssetReport> = BTreeMap::new();
    for (asset, sum) in &funding.balances {
        entry(&mut assets, asset).funding += *sum;
    }
    for (asset, sum) in &funding.deposits {
        entry(&mut assets, asset).deposits += *sum;
    }
    for (asset, sum) in &spot_totals {
        entry(&mut assets, asset).spot += *sum;
    }
    let mut by_req: BTreeMap<&str, Vec<&Applied>> = BTreeMap::new();
    for (req_id, applied) in funding.applied.iter().chain(spot_applied.iter()) {
        let a = entry(&mut assets, &applied.asset);
        match applied.op {
            "withdraw" => a.in_flight += applied.amount,
            _ => a.in_flight -= applied.amount,
        }
        by_req.entry(req_id.as_str()).or_default().push(applied);
    }
    for t in known.values().filter(|t| t.state.is_in_flight()) {
        entry(&mut assets, &t.asset).in_flight_by_state += t.amount;
    }

    let mut disagreements = Vec::new();
    for (req_id, ops) in &by_req {
        let Some(t) = known.get(*req_id) else {
            disagreements.push(Disagreement {
                req_id: (*req_id).to_owned(),
                state: None,
                problem: "money moved under a req_id that names no transfer".into(),
            });
            continue;
        };
        for op in ops {
            let expected_system = if op.op == "deposit" { &t.to } else { &t.from };
            let problem = if op.system.as_str() != expected_system {
                Some(format!(
                    "{} applied in {} instead of {expected_system}",
                    op.op, op.system
                ))
            } else if op.user_id != t.user_id || op.asset != t.asset || op.amount != t.amount {
                Some(format!(
                    "{} applied with other user, asset or amount",
                    op.op
                ))
            } else if !allowed(t.state, op.op) {
                Some(format!("{} applied but the transfer is {}", op.op, t.state))
            } else {
                None
            };
            if let Some(problem) = problem {
                disagreements.push(Disagreement {
                    req_id: (*req_id).to_owned(),
                    state: Some(t.state.as_str().to_owned()),
                    problem,
                });
            }
        }
    }
    for (req_id, state) in &before {
        let Some(t) = known.get(req_id) else { continue };
        let ops = by_req.get(req_id.as_str());
        for op in ["withdraw", "deposit", "refund"] {
            let present = ops.is_some_and(|ops| ops.iter().any(|a| a.op == op));
            if required(*state, op) && !present {
                disagreements.push(Disagreement {
                    req_id: req_id.clone(),
                    state: Some(t.state.as_str().to_owned()),
                    problem: format!("the events say {state}, but no {op} was applied"),
                });
            }
        }
    }

    let mut assets: Vec<AssetReport> = assets.into_values().collect();
    for a in &mut assets {
        a.difference = a.funding + a.spot + a.in_flight - a.deposits;
        a.ok = a.difference.is_zero();
        a.deposits = a.deposits.normalize();
        a.funding = a.funding.normalize();
        a.spot = a.spot.normalize();
        a.in_flight = a.in_flight.normalize();
        a.in_flight_by_state = a.in_flight_by_state.normalize();
        a.difference = a.difference.normalize();
    }
    let ok = assets.iter().all(|a| a.ok) && disagreements.is_empty();
    Ok(InvariantReport {
        ok,
        checked_at: Utc::now(),
        assets,
        disagreements,
        transfers_checked: known.len(),
    })
}

/// Runs the check, records it, and on a violation raises the CRITICAL alert and halts new
/// transfers. Returns the report and whether transfers are halted now.
pub async fn check_and_enforce(
    pool: &PgPool,
    spot: &SpotAdapter,
) -> Result<(InvariantReport, bool), CheckError> {
    let report = check(pool, spot).await?;
    let report_json = serde_json::to_value(&report).unwrap_or_else(|_| json!({}));
    sqlx::query("INSERT INTO invariant_checks (ok, report) VALUES ($1, $2)")
        .bind(report.ok)
        .bind(&report_json)
        .execute(pool)
        .await?;
    if !report.ok {
        tracing::error!(
            alert = "CRITICAL",
            code = "FUND_CONSERVATION_VIOLATED",
            report = %report_json,
            "CRITICAL: fund conservation violated; new transfers are halted until an admin clears it"
        );
        halt(pool, "fund conservation violated").await?;
    }
    let halted = is_halted(pool).await?;
    Ok((report, halted))
}

/// Sets the halt flag (kept in PostgreSQL, so every serving process sees it).
pub async fn halt(pool: &PgPool, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE service_halt SET halted = true, reason = $1, halted_at = now() WHERE NOT halted",
    )
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn is_halted(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT halted FROM service_halt")
        .fetch_one(pool)
        .await
}

/// How long a read of the halt flag is trusted. The flag is in PostgreSQL so every process sees
/// it; reading it for every transfer cost one round trip per request, a fifth of the database's
/// transactions under load. A halt set by another process (or the periodic check) therefore
/// takes effect here within this long; one set or cleared through this process's routes at once.
pub const HALT_CACHE_TTL: std::time::Duration = std::time::Duration::from_millis(100);

/// The last halt flag read by this process and when, per database (one per `AppState`).
#[derive(Debug, Default)]
pub struct HaltCache {
    last: std::sync::Mutex<Option<(std::time::Instant, bool)>>,
}

impl HaltCache {
    fn fresh(&self) -> Option<bool> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.filter(|(at, _)| at.elapsed() < HALT_CACHE_TTL)
            .map(|(_, halted)| halted)
    }

    fn store(&self, halted: bool) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((std::time::Instant::now(), halted));
    }

    /// Forgets the cached value, so the next request reads the flag.
    pub fn invalidate(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Refuses with SERVICE_HALTED while transfers are halted (MON-003).
pub async fn refuse_if_halted(pool: &PgPool, cache: &HaltCache) -> Result<(), ApiError> {
    let halted = match cache.fresh() {
        Some(halted) => halted,
        None => match is_halted(pool).await {
            Ok(halted) => {
                cache.store(halted);
                halted
            }
            // Unknown halt state: refuse (fail closed) as unavailable, not as an internal fault.
            Err(e) => return Err(ApiError::Unavailable(format!("halt flag: {e}"))),
        },
    };
    if halted {
        return Err(ApiError::Refused(ErrorCode::ServiceHalted));
    }
    Ok(())
}

fn check_error(e: CheckError) -> ApiError {
    match e {
        CheckError::Spot(detail) => ApiError::Unavailable(format!("invariant check: {detail}")),
        other => ApiError::Internal(format!("invariant check: {other}")),
    }
}

/// `GET /api/v1/admin/invariant`: runs the check now and reports per asset.
async fn run_check(
    State(state): State<AppState>,
    _admin: AdminUser,
) -> Result<Json<serde_json::Value>, ApiError> {
    let pool = state.funding.pool();
    let checked = check_and_enforce(pool, &state.spot).await;
    state.halt.invalidate();
    let (report, halted) = checked.map_err(check_error)?;
    let mut body =
        serde_json::to_value(&report).map_err(|e| ApiError::Internal(format!("report: {e}")))?;
    body["halted"] = json!(halted);
    Ok(Json(body))
}

/// `POST /api/v1/admin/invariant/clear`: an admin lifts the halt (after looking into the cause).
async fn clear_halt(
    State(state): State<AppState>,
    admin: AdminUser,
) -> Result<Json<serde_json::Value>, ApiError> {
    let pool = state.funding.pool();
    sqlx::query("UPDATE service_halt SET halted = false, cleared_at = now(), cleared_by = $1")
        .bind(admin.user_id.as_i64())
        .execute(pool)
        .await
        .map_err(|e| ApiError::Internal(format!("clear halt: {e}")))?;
    state.halt.invalidate();
    tracing::warn!(admin = %admin.user_id, "transfer halt cleared by an admin");
    Ok(Json(json!({ "halted": false })))
}

/// Runs the check every `LEDGER_INVARIANT_INTERVAL_SECS` (default 60 s) forever. A check that
/// cannot decide (spot-core down) is logged and retried at the next tick; it never halts.
pub async fn monitor(state: AppState) {
    let interval = std::env::var("LEDGER_INVARIANT_INTERVAL_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(CHECK_INTERVAL_DEFAULT, Duration::from_secs);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once; skip it so a process starting up is not checked half-wired.
    ticker.tick().await;
    loop {
        ticker.tick().await;
        match check_and_enforce(state.funding.pool(), &state.spot).await {
            Ok((report, _)) if report.ok => tracing::debug!("fund conservation holds"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "fund-conservation check could not run"),
        }
    }
}
