//! Repairing a transfer a PostgreSQL failover lost (`docs/adr/0009-postgres-failover.md`).
//!
//! With asynchronous replication a promoted standby may lack commits the old primary had
//! acknowledged. spot-core keeps its own durable record, so it can hold a movement under a
//! req_id whose events are gone: the audit reports it ("money moved under a req_id that names
//! no transfer"), raises the CRITICAL alert and halts new transfers. The operator's repair
//! re-records the transfer from spot-core's record: the same req_id, user, asset, amount and the
//! direction the applied movement implies (a SPOT withdraw: SPOT → FUNDING; a SPOT deposit:
//! FUNDING → SPOT), then drives it through the ordinary commands, every pending call looked up
//! first. The SPOT movement is found applied (the same details, so its repeat is answered from
//! spot-core's record and never applied twice) and the FUNDING side is applied now, so the
//! records agree and conservation is exact again. The request is recorded first in
//! `stores::RepairRecords` (PostgreSQL's `failover_repairs`, migration 0019: who, why, from which record, how it ended); a repeat
//! answers from that row and drives the transfer on if it is still open. A transfer the event
//! log still knows is not repaired here: the recovery worker resumes it with lookups, and
//! manual resolution covers the rest.

use chrono::{DateTime, Utc};
use domain::{AccountType, Amount, AssetSymbol, Operation, ReqId, TransferData, UserId};
use rust_decimal::Decimal;
use serde::Serialize;

use crate::books::{FundingBook, SpotBook};
use crate::coordinator::{Coordinator, CoordinatorError, NewTransfer};
use crate::error::StoreError;
use crate::stores::{RepairRecords, RepairRequest, RepairRow as Row};

/// How many times a re-record's creation is tried when the store's answer is unknown.
const CREATE_ATTEMPTS: u32 = 5;

/// Why a repair was refused or could not run.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The event log knows the transfer and no repair created it: recovery or manual
    /// resolution is the way, not a re-record.
    #[error("the ledger knows this transfer ({0}); it is not a lost one")]
    Known(String),
    /// spot-core applied nothing under the req_id: no money moved there, nothing to repair.
    #[error("spot-core applied nothing under this req_id")]
    NothingApplied,
    /// spot-core's record is not one movement a transfer could have made alone (a refund, or
    /// a withdraw and a deposit together): left to an engineer.
    #[error("spot-core's record is not one re-recordable movement: {0}")]
    NotRepairable(String),
    /// Re-recording a FUNDING → SPOT transfer withdraws from FUNDING now; the account cannot
    /// pay it, and a refused withdraw would leave the SPOT deposit standing against a FAILED
    /// transfer. Nothing is recorded; credit the account first.
    #[error("the FUNDING account holds {available}, the repair must withdraw {amount}")]
    InsufficientFunding { available: Decimal, amount: Decimal },
    /// The req_id is older than spot-core's idempotency horizon: spot-core has forgotten its
    /// records and refuses it for good, so no repair of it can ever read what moved. Not
    /// worth a retry; left to an engineer, from the audit's report and spot-core's archived WAL.
    #[error(
        "the req_id is older than spot-core's idempotency horizon ({horizon_ms} ms): spot-core \
         has forgotten its records, so no repair can ever re-record it"
    )]
    PastHorizon { horizon_ms: u64 },
    /// spot-core could not answer (down, or an unexpected answer); a retry may succeed.
    #[error("spot-core could not answer: {0}")]
    SpotUnavailable(String),
    #[error("the operator and the reason must not be empty")]
    MissingReason,
    #[error("database")]
    Database(#[from] StoreError),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
}

/// What a repair did (or, repeated, had done).
#[derive(Debug, Clone, Serialize)]
pub struct RepairOutcome {
    pub req_id: String,
    pub action: &'static str,
    pub user_id: i64,
    pub from: String,
    pub to: String,
    pub asset: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
    /// The transfer's state now.
    pub state: String,
    /// True when an earlier request had already recorded this repair.
    pub repeated: bool,
    pub operator: String,
    pub reason: String,
    pub requested_at: DateTime<Utc>,
}

/// Why spot-core's record of `req_id` could not be read: the req_id is past spot-core's
/// idempotency horizon (as spot-core's status says it now; a repair that can never succeed), or
/// spot-core could not answer (one that may, later).
async fn lookup_failed(
    spot: &dyn SpotBook,
    req_id: &str,
    e: crate::books::SpotError,
) -> RepairError {
    let created_ms = crate::horizon::ulid_time_ms(req_id);
    match spot.core_status().await {
        Ok(status) if created_ms.is_some_and(|ms| ms < status.horizon_ms) => {
            RepairError::PastHorizon {
                horizon_ms: status.horizon_ms,
            }
        }
        _ => RepairError::SpotUnavailable(e.to_string()),
    }
}

/// The transfer spot-core's applied movement implies.
struct Implied {
    transfer: NewTransfer,
    record: serde_json::Value,
}

/// What a repair reads and records besides the coordinator's log: its own rows, spot-core's
/// record of the req_id, and the FUNDING balance a re-record would withdraw from.
#[derive(Clone, Copy)]
pub struct RepairDesk<'a> {
    pub records: &'a dyn RepairRecords,
    pub spot: &'a dyn SpotBook,
    pub funding: &'a dyn FundingBook,
}

impl Coordinator {
    /// Repairs one lost transfer (see the module's documentation); idempotent by req_id.
    pub async fn repair_lost(
        &self,
        desk: RepairDesk<'_>,
        req_id: &ReqId,
        operator: &str,
        reason: &str,
    ) -> Result<RepairOutcome, RepairError> {
        if operator.trim().is_empty() || reason.trim().is_empty() {
            return Err(RepairError::MissingReason);
        }
        if let Some(row) = desk.records.find(req_id).await? {
            return self.finish_repair(desk, req_id, row, true).await;
        }
        if let Some(known) = self.load(req_id).await? {
            return Err(RepairError::Known(known.state.as_str().to_owned()));
        }
        let implied = implied_transfer(desk.spot, req_id).await?;
        check_funding(desk.funding, &implied.transfer).await?;
        let t = &implied.transfer;
        let inserted = desk
            .records
            .insert(&RepairRequest {
                req_id,
                user_id: t.user_id.as_i64(),
                from_type: t.from.as_str(),
                to_type: t.to.as_str(),
                asset: t.asset.as_str(),
                amount: t.amount.value(),
                spot_record: &implied.record,
                operator,
                reason,
            })
            .await?;
        let repeated = !inserted;
        if !repeated {
            tracing::warn!(
                %req_id, operator, reason,
                user_id = %implied.transfer.user_id, from = %implied.transfer.from,
                to = %implied.transfer.to, asset = %implied.transfer.asset,
                amount = %implied.transfer.amount,
                "failover repair: re-recording a transfer spot-core applied and the event log lost"
            );
            self.create_repaired(req_id, &implied.transfer).await?;
        }
        let row = desk
            .records
            .find(req_id)
            .await?
            .ok_or_else(|| CoordinatorError::invariant("repair row vanished"))?;
        self.finish_repair(desk, req_id, row, repeated).await
    }

    /// Creates the transfer if a repair row exists without it (a repair interrupted between
    /// the two), drives it with lookups first, and records where it ended.
    async fn finish_repair(
        &self,
        desk: RepairDesk<'_>,
        req_id: &ReqId,
        row: Row,
        repeated: bool,
    ) -> Result<RepairOutcome, RepairError> {
        if self.load(req_id).await?.is_none() {
            let transfer = row_transfer(&row)?;
            self.create_repaired(req_id, &transfer).await?;
        }
        let data = self.drive_repaired(req_id).await?;
        if data.state.is_terminal() {
            desk.records.finish(req_id, data.state).await?;
        }
        Ok(RepairOutcome {
            req_id: req_id.to_string(),
            action: "RE_RECORD",
            user_id: row.user_id,
            from: row.from_type,
            to: row.to_type,
            asset: row.asset,
            amount: row.amount.normalize(),
            state: data.state.as_str().to_owned(),
            repeated,
            operator: row.operator,
            reason: row.reason,
            requested_at: row.requested_at,
        })
    }

    /// Creates the re-recorded transfer. A store error is an unknown outcome (right after a
    /// failover, the first commit through a connection kept from the old primary fails): it is
    /// tried again a few times, and an existing transfer is success.
    async fn create_repaired(&self, req_id: &ReqId, t: &NewTransfer) -> Result<(), RepairError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.create_for_repair(*req_id, t).await {
                Ok(()) | Err(CoordinatorError::Conflict) => return Ok(()),
                Err(CoordinatorError::OutcomeUnknown(_)) if attempt < CREATE_ATTEMPTS => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    if self.load(req_id).await.ok().flatten().is_some() {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Drives with every pending call looked up first; a concurrent driver (the recovery
    /// worker) winning a step is no failure: the state then is what the log says. A transfer
    /// still open after the attempts is answered as it stands; the recovery worker finishes it.
    async fn drive_repaired(&self, req_id: &ReqId) -> Result<TransferData, RepairError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.resume(req_id).await {
                // An unknown outcome (a connection kept from the old primary) is looked up and
                // retried, as the recovery worker would, a few times before answering.
                Ok(resumed) if resumed.unknown.is_some() && attempt < CREATE_ATTEMPTS => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Ok(resumed) => return Ok(resumed.data),
                Err(CoordinatorError::Conflict) => {
                    return self
                        .load(req_id)
                        .await?
                        .ok_or_else(|| CoordinatorError::NotFound.into())
                }
                Err(CoordinatorError::OutcomeUnknown(_)) if attempt < CREATE_ATTEMPTS => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A FUNDING → SPOT re-record withdraws from FUNDING: refused up front when the account cannot
/// pay it.
async fn check_funding(funding: &dyn FundingBook, t: &NewTransfer) -> Result<(), RepairError> {
    if t.from != AccountType::Funding {
        return Ok(());
    }
    let available = match funding.balance(t.user_id, &t.asset).await {
        Ok(balance) => balance.unwrap_or_default(),
        Err(crate::books::FundingError::Store(e)) => return Err(RepairError::Database(e)),
        Err(e) => return Err(RepairError::Database(StoreError::new(e.to_string()))),
    };
    if available < t.amount.value() {
        return Err(RepairError::InsufficientFunding {
            available: available.normalize(),
            amount: t.amount.value(),
        });
    }
    Ok(())
}

fn row_transfer(row: &Row) -> Result<NewTransfer, CoordinatorError> {
    let bad = |what: &str| CoordinatorError::invariant(format!("repair row: bad {what}"));
    Ok(NewTransfer {
        user_id: u64::try_from(row.user_id)
            .ok()
            .and_then(|u| UserId::new(u).ok())
            .ok_or_else(|| bad("user"))?,
        from: AccountType::parse(&row.from_type).map_err(|_| bad("from"))?,
        to: AccountType::parse(&row.to_type).map_err(|_| bad("to"))?,
        asset: AssetSymbol::parse(&row.asset).map_err(|_| bad("asset"))?,
        amount: Amount::parse(&row.amount.normalize().to_string()).map_err(|_| bad("amount"))?,
        cid: None,
    })
}

/// What spot-core applied under `req_id`, as the transfer that made it.
async fn implied_transfer(spot: &dyn SpotBook, req_id: &ReqId) -> Result<Implied, RepairError> {
    let text = req_id.to_string();
    let record = match spot.record_of(&text).await {
        Ok(record) => record,
        Err(e) => return Err(lookup_failed(spot, &text, e).await),
    };
    let (op, (from, to)) = match record.applied.as_slice() {
        [] => return Err(RepairError::NothingApplied),
        [one] => match one.operation {
            Operation::Withdraw => (one, (AccountType::Spot, AccountType::Funding)),
            Operation::Deposit => (one, (AccountType::Funding, AccountType::Spot)),
            Operation::Refund => return Err(RepairError::NotRepairable("a refund alone".into())),
        },
        more => {
            return Err(RepairError::NotRepairable(format!(
                "{} applied movements",
                more.len()
            )))
        }
    };
    let bad = |what: &str| RepairError::NotRepairable(format!("spot-core's {what}"));
    let transfer = NewTransfer {
        user_id: u64::try_from(op.user_id)
            .ok()
            .and_then(|u| UserId::new(u).ok())
            .ok_or_else(|| bad("user"))?,
        from,
        to,
        asset: AssetSymbol::parse(&op.asset).map_err(|_| bad("asset"))?,
        amount: Amount::parse(&op.amount.normalize().to_string()).map_err(|_| bad("amount"))?,
        cid: None,
    };
    Ok(Implied {
        transfer,
        record: record.raw,
    })
}
