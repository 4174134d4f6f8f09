//! Resolving a transfer by hand: an operator's confirmed outcome of the pending call, taken only
//! where the account system's own record backs it, recorded as `TransferManuallyResolved`, and
//! driven on under the transfer's lease.

use std::time::Duration;

use domain::{
    invariant, manual_resolution_target, Movement, Operation, Recorded, ReqId, Resolution,
    TransferCommand, TransferData, TransferError, TransferState,
};

use crate::coordinator::{Context, Coordinator, CoordinatorError};
use crate::drive::{Resumed, StillOpen};
use crate::failpoint::FailPoint;
use crate::ports::LeaseRequest;

/// How long a manual resolution holds the transfer's lease (it checks, records and drives once).
const MANUAL_LEASE: Duration = Duration::from_secs(120);

/// Why a manual resolution was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ManualResolutionError {
    #[error("transfer not found")]
    NotFound,
    /// The state does not allow this resolution (terminal, nothing pending, or a fact that
    /// proves nothing), or the operator or reason is empty.
    #[error("refused: {0}")]
    Refused(TransferError),
    /// The account system's own record says otherwise; the operator's claim is not recorded.
    #[error("the account system recorded {0}, which contradicts the resolution")]
    Contradicted(String),
    /// The account system holds the key for another movement (user, asset or amount): nothing is
    /// known about this one, so no resolution may be recorded.
    #[error("the account system recorded the req_id for a different movement: {0}")]
    Mismatch(String),
    /// The account system could not confirm the claim (for NOT_APPLIED: could not durably
    /// cancel the pending call). Only an explicit `force` records it anyway.
    #[error("the account system could not confirm the resolution: {0}")]
    Unavailable(String),
    /// Someone else (a recovery worker, another operator) holds the transfer's lease right now.
    #[error("the transfer is being worked on; try again shortly")]
    Busy,
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
}

impl Coordinator {
    /// Records an operator's confirmed outcome of the pending call (`TransferManuallyResolved`,
    /// with who and why), then drives the transfer on if that leaves it open (SOURCE_DONE goes on
    /// to the deposit, COMPENSATING to the refund). Refused when the state does not allow it, and
    /// when the account system's own record contradicts the operator or holds the key for another
    /// movement. NOT_APPLIED first makes the account system durably refuse the pending call
    /// (`AccountPort::cancel`), so no queued or in-flight copy can land afterwards; where that
    /// cannot be confirmed (or APPLIED cannot be checked) it is refused unless `force`, which is
    /// written into the event's reason. The transfer's lease (`transfer_retries`) is held
    /// throughout, so no recovery worker is mid-call. Once the resolution is committed the answer
    /// is `Ok`: a failing follow-up drive leaves the transfer open (`unknown`) for the worker.
    pub async fn manually_resolve(
        &self,
        req_id: &ReqId,
        resolution: Resolution,
        operator: &str,
        reason: &str,
        force: bool,
    ) -> Result<Resumed, ManualResolutionError> {
        let (ctx, data) = self.load_for_resolution(req_id).await?;
        if manual_resolution_target(data.state, resolution).is_none() {
            // Nothing to check or cancel: the aggregate gives the exact refusal.
            return self
                .record_resolution(ctx, &data, resolution, operator, reason)
                .await;
        }
        let owner = format!("manual:{operator}:{}", self.clock.req_id());
        if !self.take_manual_lease(req_id, data.state, &owner).await? {
            return Err(ManualResolutionError::Busy);
        }
        let result = self
            .resolve_leased(req_id, resolution, operator, reason, force)
            .await;
        if let Err(e) = self.leases.release(req_id, &owner).await {
            // The lease simply expires.
            tracing::warn!(%req_id, error = %e, "could not release the manual resolution's lease");
        }
        result
    }

    /// The transfer's context and state, or `NotFound`.
    async fn load_for_resolution(
        &self,
        req_id: &ReqId,
    ) -> Result<(Context, TransferData), ManualResolutionError> {
        let ctx = match self.load_context(req_id).await {
            Ok(ctx) => ctx,
            Err(CoordinatorError::NotFound) => return Err(ManualResolutionError::NotFound),
            Err(e) => return Err(e.into()),
        };
        let data = ctx
            .aggregate
            .data
            .clone()
            .ok_or(ManualResolutionError::NotFound)?;
        Ok((ctx, data))
    }

    /// Takes the transfer's lease the way a recovery worker does (free or expired only), without
    /// waiting for its retry time.
    async fn take_manual_lease(
        &self,
        req_id: &ReqId,
        state: TransferState,
        owner: &str,
    ) -> Result<bool, CoordinatorError> {
        let taken = self
            .leases
            .take(&LeaseRequest {
                req_id: *req_id,
                state,
                owner,
                lease: MANUAL_LEASE,
                wait_for_retry_time: false,
            })
            .await?;
        Ok(taken.is_some())
    }

    async fn resolve_leased(
        &self,
        req_id: &ReqId,
        resolution: Resolution,
        operator: &str,
        reason: &str,
        force: bool,
    ) -> Result<Resumed, ManualResolutionError> {
        // Read again under the lease: a worker may have moved it since the first read.
        let (ctx, data) = self.load_for_resolution(req_id).await?;
        let mut reason = reason.to_owned();
        if manual_resolution_target(data.state, resolution).is_some() {
            if let Some(note) = self.check_against_records(&data, resolution, force).await? {
                reason = format!("{reason} {note}");
            }
        }
        self.record_resolution(ctx, &data, resolution, operator, &reason)
            .await
    }

    async fn record_resolution(
        &self,
        ctx: Context,
        data: &TransferData,
        resolution: Resolution,
        operator: &str,
        reason: &str,
    ) -> Result<Resumed, ManualResolutionError> {
        let req_id = data.req_id;
        let command = TransferCommand::ManuallyResolve {
            resolution,
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            at: self.clock.now(),
        };
        let ctx = match self.execute(ctx, command).await {
            Ok(ctx) => ctx,
            Err(CoordinatorError::Transition(e)) => return Err(ManualResolutionError::Refused(e)),
            Err(e) => return Err(e.into()),
        };
        tracing::warn!(%req_id, from = %data.state, resolution = resolution.as_str(), %operator, %reason, "transfer manually resolved");
        self.failpoints.hit(FailPoint::AfterManualResolution);
        let Some(now) = ctx.aggregate.data.clone() else {
            return Err(ManualResolutionError::NotFound);
        };
        // Postcondition: the operator's word took the transfer exactly where the confirmed fact
        // proves, never further (`manual_resolution_target`).
        invariant!(
            Some(now.state) == manual_resolution_target(data.state, resolution),
            "{req_id}: resolved {} from {} to {}",
            resolution.as_str(),
            data.state,
            now.state
        );
        if now.state.is_terminal() {
            return Ok(Resumed {
                data: now,
                unknown: None,
            });
        }
        // The resolution is committed: whatever the follow-up drive comes to, the answer is the
        // resolution's, and a transfer left open is the recovery worker's to finish.
        match self.resume(&req_id).await {
            Ok(resumed) => Ok(resumed),
            Err(e) => {
                tracing::warn!(%req_id, error = %e, "manual resolution recorded; the follow-up drive failed and is left to the recovery worker");
                let data = match self.load(&req_id).await {
                    Ok(Some(latest)) => latest,
                    _ => now,
                };
                let unknown = (!data.state.is_terminal()).then_some(StillOpen::FollowUp(e));
                Ok(Resumed { data, unknown })
            }
        }
    }

    /// The operator's word is taken only where the system's record backs it. NOT_APPLIED first
    /// cancels the pending call in the account system: accepted once the record is a refusal
    /// (the cancel's or an earlier one), refused against an applied record. APPLIED is refused
    /// against a record of nothing or a refusal. A record for another movement refuses both.
    /// Where the system cannot answer, only `force` records the claim, and the returned note
    /// (appended to the reason) says so.
    async fn check_against_records(
        &self,
        data: &TransferData,
        resolution: Resolution,
        force: bool,
    ) -> Result<Option<String>, ManualResolutionError> {
        let movement = Movement {
            req_id: data.req_id,
            user_id: data.user_id,
            asset: data.asset.clone(),
            amount: data.amount,
        };
        let (port, operation) = match data.state {
            TransferState::SourcePending => (self.port(data.from), Operation::Withdraw),
            TransferState::TargetPending => (self.port(data.to), Operation::Deposit),
            TransferState::Compensating => (self.port(data.from), Operation::Refund),
            _ => return Ok(None),
        };
        let recorded = match resolution {
            Resolution::NotApplied => port.cancel(&movement, operation).await,
            Resolution::Applied => port.lookup(&movement, operation).await,
        };
        match (recorded, resolution) {
            (Recorded::Applied, Resolution::Applied)
            | (Recorded::Refused { .. }, Resolution::NotApplied) => Ok(None),
            (recorded @ Recorded::Applied, Resolution::NotApplied)
            | (recorded @ (Recorded::NotSeen | Recorded::Refused { .. }), Resolution::Applied) => {
                Err(ManualResolutionError::Contradicted(format!(
                    "{operation:?}: {recorded:?}"
                )))
            }
            (Recorded::Mismatch(why), _) => {
                tracing::error!(req_id = %data.req_id, ?operation, %why, "manual resolution refused: req_id recorded for a different movement");
                Err(ManualResolutionError::Mismatch(format!("{operation:?}")))
            }
            (unconfirmed @ (Recorded::Unavailable(_) | Recorded::NotSeen), _) => {
                // (NotSeen here answers a cancel: it should have left a record.)
                let why = match unconfirmed {
                    Recorded::Unavailable(why) => why,
                    _ => "the cancel left no record".to_owned(),
                };
                tracing::warn!(req_id = %data.req_id, ?operation, %why, force, "account system could not confirm a manual resolution");
                if force {
                    Ok(Some(format!(
                        "[FORCED by operator: the account system could not confirm {} of {operation:?}]",
                        resolution.as_str()
                    )))
                } else {
                    Err(ManualResolutionError::Unavailable(format!("{operation:?}")))
                }
            }
        }
    }
}
