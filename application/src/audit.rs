//! Fund conservation (DESIGN section 6), exact: per asset, FUNDING + SPOT + in-flight equals the
//! external deposits, where in-flight is reconciled from what each account system actually
//! applied, keyed by req_id (the funding journal and spot-core's journal), not guessed from
//! transfer states. Every transfer whose records disagree with its events is reported. A real
//! violation raises a CRITICAL alert and halts new transfers (MON-003) until an admin clears it.
//!
//! Why it cannot raise a false alarm on a transfer caught between an adapter call and its
//! recorded outcome: a movement counts as in flight from the moment its system applied it,
//! whatever the transfer's state says. And the per-transfer check reads the events twice, before
//! and after the journals: what the earlier events say *must* have been applied
//! (`TransferState::requires`) is looked for in the (later) journals, and what the journals show
//! applied must be *allowed* (`TransferState::allows`) by the (later) events, so a transfer
//! moving on during the check is never mistaken for a broken one.

use std::collections::{BTreeMap, HashMap};

use adapters::audit::AppliedMovement;
use adapters::event_store::{self, LogError};
use adapters::{FundingError, FundingLedger, SpotAdapter, SpotError};
use chrono::{DateTime, Utc};
use domain::{Operation, TransferEvent, TransferState};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgPool;

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
    #[error("database")]
    Database(#[from] sqlx::Error),
    #[error("funding ledger")]
    Funding(#[from] FundingError),
    #[error("spot-core")]
    Spot(#[from] SpotError),
    #[error("event log")]
    Log(#[from] LogError),
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

/// Every transfer with a state in `states`, with its details from `TransferCreated`.
async fn transfer_details(
    pool: &PgPool,
    states: &HashMap<String, TransferState>,
) -> Result<HashMap<String, Known>, CheckError> {
    let mut known = HashMap::new();
    for (id, created) in event_store::transfers_created(pool).await? {
        let TransferEvent::TransferCreated {
            user_id,
            from,
            to,
            asset,
            amount,
            ..
        } = created
        else {
            continue;
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

fn entry<'a>(assets: &'a mut BTreeMap<String, AssetReport>, asset: &str) -> &'a mut AssetReport {
    assets
        .entry(asset.to_owned())
        .or_insert_with(|| AssetReport {
            asset: asset.to_owned(),
            ..AssetReport::default()
        })
}

fn op_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Withdraw => "withdraw",
        Operation::Deposit => "deposit",
        Operation::Refund => "refund",
    }
}

/// Runs the check against the database and spot-core. Reads the events first, then the journals,
/// then the events again (see the module's doc for why).
pub async fn check(
    funding: &FundingLedger,
    spot: &SpotAdapter,
) -> Result<InvariantReport, CheckError> {
    let pool = funding.pool();
    let before = event_store::transfer_states(pool).await?;
    let funding = funding.audit_snapshot().await?;
    let spot = spot.audit_snapshot().await?;
    let after = event_store::transfer_states(pool).await?;
    let known = transfer_details(pool, &after).await?;

    let mut assets: BTreeMap<String, AssetReport> = BTreeMap::new();
    for (asset, sum) in &funding.balances {
        entry(&mut assets, asset).funding += *sum;
    }
    for (asset, sum) in &funding.deposits {
        entry(&mut assets, asset).deposits += *sum;
    }
    for (asset, sum) in &spot.totals {
        entry(&mut assets, asset).spot += *sum;
    }
    let mut by_req: BTreeMap<&str, Vec<&AppliedMovement>> = BTreeMap::new();
    for applied in funding.applied.iter().chain(spot.applied.iter()) {
        let a = entry(&mut assets, &applied.asset);
        match applied.operation {
            Operation::Withdraw => a.in_flight += applied.amount,
            Operation::Deposit | Operation::Refund => a.in_flight -= applied.amount,
        }
        by_req
            .entry(applied.req_id.as_str())
            .or_default()
            .push(applied);
    }
    for t in known.values().filter(|t| t.state.is_in_flight()) {
        entry(&mut assets, &t.asset).in_flight_by_state += t.amount;
    }

    let mut disagreements = applied_disagreements(&by_req, &known);
    disagreements.extend(missing_movements(&before, &by_req, &known));

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

/// Every applied movement its transfer's (later) events do not allow, or that names no transfer.
fn applied_disagreements(
    by_req: &BTreeMap<&str, Vec<&AppliedMovement>>,
    known: &HashMap<String, Known>,
) -> Vec<Disagreement> {
    let mut disagreements = Vec::new();
    for (req_id, ops) in by_req {
        let Some(t) = known.get(*req_id) else {
            disagreements.push(Disagreement {
                req_id: (*req_id).to_owned(),
                state: None,
                problem: "money moved under a req_id that names no transfer".into(),
            });
            continue;
        };
        for op in ops {
            let name = op_name(op.operation);
            let expected_system = if op.operation == Operation::Deposit {
                &t.to
            } else {
                &t.from
            };
            let problem = if op.system.as_str() != expected_system {
                Some(format!(
                    "{name} applied in {} instead of {expected_system}",
                    op.system
                ))
            } else if op.user_id != t.user_id || op.asset != t.asset || op.amount != t.amount {
                Some(format!("{name} applied with other user, asset or amount"))
            } else if !t.state.allows(op.operation) {
                Some(format!("{name} applied but the transfer is {}", t.state))
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
    disagreements
}

/// Every movement the (earlier) events require that no journal shows applied.
fn missing_movements(
    before: &HashMap<String, TransferState>,
    by_req: &BTreeMap<&str, Vec<&AppliedMovement>>,
    known: &HashMap<String, Known>,
) -> Vec<Disagreement> {
    let mut disagreements = Vec::new();
    for (req_id, state) in before {
        let Some(t) = known.get(req_id) else { continue };
        let ops = by_req.get(req_id.as_str());
        for op in [Operation::Withdraw, Operation::Deposit, Operation::Refund] {
            let present = ops.is_some_and(|ops| ops.iter().any(|a| a.operation == op));
            if state.requires(op) && !present {
                disagreements.push(Disagreement {
                    req_id: req_id.clone(),
                    state: Some(t.state.as_str().to_owned()),
                    problem: format!("the events say {state}, but no {} was applied", op_name(op)),
                });
            }
        }
    }
    disagreements
}
