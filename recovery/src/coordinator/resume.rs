//! Resuming a transfer someone else left (the recovery worker's entry point) and resolving one by
//! hand. Kept apart from the request path: it asks the account systems what they recorded before
//! retrying a call blind, and it reports why a transfer is still open so the worker can record it.

use cqrs_es::EventStore;
use domain::{
    manual_resolution_target, AccountPort, AdapterOutcome, Movement, Operation, Recorded, ReqId,
    Resolution, TransferCommand, TransferData, TransferError, TransferState,
};

use super::{Coordinator, CoordinatorError, Stepped};
use crate::failpoint::failpoint;

/// Where a resumed transfer stands after one drive.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    pub data: TransferData,
    /// Why it is still open: the unknown outcome of its pending call. `None` when terminal.
    pub unknown: Option<String>,
}

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
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
}

/// Calls the adapter, first asking the account system what it recorded when `lookup_first`:
/// a recorded decision is the call's answer (the same one an idempotent repeat would return),
/// and only an operation never seen, or a system that cannot say, is called again.
pub(super) async fn call_or_lookup(
    port: &dyn AccountPort,
    operation: Operation,
    movement: &Movement,
    lookup_first: bool,
) -> AdapterOutcome {
    if lookup_first {
        match port.lookup(movement, operation).await {
            Recorded::Applied => {
                tracing::info!(req_id = %movement.req_id, ?operation, "lookup: already applied; recording without a new call");
                return AdapterOutcome::Success;
            }
            Recorded::Refused { code, message } => {
                tracing::info!(req_id = %movement.req_id, ?operation, %code, "lookup: already refused");
                return AdapterOutcome::ExplicitFail { code, message };
            }
            Recorded::NotSeen => {}
            Recorded::Unavailable(why) => {
                tracing::debug!(req_id = %movement.req_id, ?operation, %why, "lookup unavailable; retrying the idempotent call");
            }
        }
    }
    match operation {
        Operation::Withdraw => port.withdraw(movement).await,
        Operation::Deposit => port.deposit(movement).await,
        Operation::Refund => port.refund(movement).await,
    }
}

impl Coordinator {
    /// The database the coordinator writes to (the worker keeps its bookkeeping there too).
    pub fn pool(&self) -> &sqlx::PgPool {
        &self.pool
    }

    /// Drives a transfer from whatever state its events say, as the recovery worker does: every
    /// pending call is looked up before it is retried. Stops at a terminal state or at an unknown
    /// outcome, and says which.
    pub async fn resume(&self, req_id: &ReqId) -> Result<Resumed, CoordinatorError> {
        let mut ctx = self.store.load_aggregate(&req_id.to_string()).await?;
        loop {
            let Some(data) = ctx.aggregate.data.clone() else {
                return Err(CoordinatorError::NotFound);
            };
            if data.state.is_terminal() {
                return Ok(Resumed {
                    data,
                    unknown: None,
                });
            }
            match self.step(ctx, &data, true).await? {
                Stepped::Next(next) => ctx = next,
                Stepped::Unknown(why) => {
                    return Ok(Resumed {
                        data,
                        unknown: Some(why),
                    })
                }
            }
        }
    }

    /// Records an operator's confirmed outcome of the pending call (`TransferManuallyResolved`,
    /// with who and why), then drives the transfer on if that leaves it open (SOURCE_DONE goes on
    /// to the deposit, COMPENSATING to the refund). Refused when the state does not allow it, and
    /// when the account system's own record contradicts the operator.
    pub async fn manually_resolve(
        &self,
        req_id: &ReqId,
        resolution: Resolution,
        operator: &str,
        reason: &str,
    ) -> Result<Resumed, ManualResolutionError> {
        let ctx = self
            .store
            .load_aggregate(&req_id.to_string())
            .await
            .map_err(CoordinatorError::from)?;
        let Some(data) = ctx.aggregate.data.clone() else {
            return Err(ManualResolutionError::NotFound);
        };
        if manual_resolution_target(data.state, resolution).is_some() {
            self.check_against_records(&data, resolution).await?;
        }
        let command = TransferCommand::ManuallyResolve {
            resolution,
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            at: (self.clock)(),
        };
        let ctx = match self.execute(ctx, command).await {
            Ok(ctx) => ctx,
            Err(CoordinatorError::Transition(e)) => return Err(ManualResolutionError::Refused(e)),
            Err(e) => return Err(e.into()),
        };
        tracing::warn!(%req_id, from = %data.state, resolution = resolution.as_str(), %operator, %reason, "transfer manually resolved");
        failpoint("after_manual_resolution");
        let Some(now) = ctx.aggregate.data.clone() else {
            return Err(ManualResolutionError::NotFound);
        };
        if now.state.is_terminal() {
            return Ok(Resumed {
                data: now,
                unknown: None,
            });
        }
        Ok(self.resume(req_id).await?)
    }

    /// The operator's word is taken only where the system's record cannot refute it: "applied"
    /// against a record of nothing or a refusal, or "not applied" against an applied record, is
    /// refused. A system that cannot answer leaves the operator's word standing: that is what
    /// manual intervention is for.
    async fn check_against_records(
        &self,
        data: &TransferData,
        resolution: Resolution,
    ) -> Result<(), ManualResolutionError> {
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
            _ => return Ok(()),
        };
        let recorded = port.lookup(&movement, operation).await;
        let contradicts = matches!(
            (&recorded, resolution),
            (Recorded::Applied, Resolution::NotApplied)
                | (
                    Recorded::NotSeen | Recorded::Refused { .. },
                    Resolution::Applied
                )
        );
        if contradicts {
            return Err(ManualResolutionError::Contradicted(format!(
                "{operation:?}: {recorded:?}"
            )));
        }
        Ok(())
    }
}
