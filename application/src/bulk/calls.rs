//! One round of a batch's drive: every lane waiting on the same call made in one
//! `AccountPort::movements` per account system, and the definite outcomes committed in one
//! append.

use domain::{
    invariant, AccountPort, AccountType, AdapterOutcome, Movement, Operation, TransferCommand,
    TransferData, TransferState,
};

use super::{Lane, Moved, Route};
use crate::coordinator::Coordinator;
use crate::drive::definite;
use crate::failpoint::FailPoint;

impl Coordinator {
    /// One step for every lane waiting on `operation`: the calls (one per account system), then
    /// the definite outcomes committed in one append. An unknown outcome (and a refund not
    /// applied, which is never given up) records nothing: that lane stops where it is.
    pub(super) async fn call_round(
        &self,
        group: Vec<Lane>,
        operation: Operation,
        route: Route,
    ) -> Vec<Moved> {
        let (before, after) = call_points(operation);
        let datas = lanes_data(&group, operation);
        self.failpoints.hit(before);
        let outcomes = self.calls(operation, &datas, route).await;
        self.failpoints.hit(after);
        if operation == Operation::Withdraw && planted!(PersistAfterCall) {
            for (data, outcome) in datas.iter().zip(&outcomes) {
                if *outcome == AdapterOutcome::Success {
                    // Planted: the deposit is called before its announcement is durable.
                    let _ = self.port(data.to).deposit(&movement_of(data)).await;
                }
            }
        }
        let mut moved = Vec::with_capacity(group.len());
        let mut steps = Vec::new();
        let mut stepping = Vec::new();
        for ((lane, data), outcome) in group.into_iter().zip(datas).zip(outcomes) {
            match self.record_command(&data, operation, outcome) {
                Some((command, through)) => {
                    steps.push((lane.ctx, command, through));
                    stepping.push((lane.index, data));
                }
                None => moved.push(Moved::Stop(lane.index, data)),
            }
        }
        let committed = self.commit_many_funded(steps).await;
        invariant!(
            committed.len() == stepping.len(),
            "{} steps committed, {} answered",
            stepping.len(),
            committed.len()
        );
        let mut deposit_announced = false;
        for ((index, data), ctx) in stepping.into_iter().zip(committed) {
            match ctx {
                Ok(ctx) => {
                    // Postcondition: a recorded outcome moves the lane on along the table.
                    invariant!(
                        ctx.aggregate.state().is_some_and(|next| next != data.state),
                        "{}: a {operation:?} outcome left it in {}",
                        data.req_id,
                        data.state
                    );
                    deposit_announced |=
                        ctx.aggregate.state() == Some(TransferState::TargetPending);
                    moved.push(Moved::Next(Lane { index, ctx }));
                }
                Err(e) => moved.push(Moved::Broke(index, data, e)),
            }
        }
        if deposit_announced {
            self.failpoints.hit(FailPoint::AfterWithdrawnDepositStarted);
        }
        moved
    }

    /// The command recording `outcome`, and whether it goes through to the next call-free step
    /// (a withdraw's outcome takes the deposit's announcement into the same commit); `None` when
    /// the outcome records nothing.
    fn record_command(
        &self,
        data: &TransferData,
        operation: Operation,
        outcome: AdapterOutcome,
    ) -> Option<(TransferCommand, bool)> {
        let at = self.clock.now();
        match operation {
            Operation::Withdraw => {
                let outcome = definite(data, operation, outcome).ok()?;
                Some((TransferCommand::RecordSourceOutcome { outcome, at }, true))
            }
            Operation::Deposit => {
                let outcome = definite(data, operation, outcome).ok()?;
                Some((TransferCommand::RecordTargetOutcome { outcome, at }, false))
            }
            // A refund is never given up: it stays COMPENSATING until it succeeds.
            Operation::Refund => match outcome {
                AdapterOutcome::Success => Some((TransferCommand::RecordRefund { at }, false)),
                other => {
                    tracing::error!(req_id = %data.req_id, outcome = ?other, "refund not applied; transfer stays COMPENSATING");
                    None
                }
            },
        }
    }

    /// Makes `operation` for every transfer, one `movements` call per account system (the two
    /// systems' calls at the same time), and answers in the transfers' order.
    async fn calls(
        &self,
        operation: Operation,
        datas: &[TransferData],
        route: Route,
    ) -> Vec<AdapterOutcome> {
        let mut outcomes: Vec<Option<AdapterOutcome>> = datas.iter().map(|_| None).collect();
        let per_system = [AccountType::Funding, AccountType::Spot].map(|account| {
            let (positions, movements): (Vec<usize>, Vec<Movement>) = datas
                .iter()
                .enumerate()
                .filter(|(_, d)| port_account(d, operation) == account)
                .map(|(i, d)| (i, movement_of(d)))
                .unzip();
            async move {
                if movements.is_empty() {
                    return (positions, Vec::new());
                }
                let port = self.port(account);
                let made = self
                    .movements_of_port(port, operation, &movements, route)
                    .await;
                (positions, made)
            }
        });
        for (positions, made) in futures_util::future::join_all(per_system).await {
            if made.len() != positions.len() {
                // `AccountPort::movements` answers one outcome per movement; a short answer
                // leaves the rest unknown (below), which records nothing.
                tracing::error!(
                    sent = positions.len(),
                    answered = made.len(),
                    "an account system answered a batch short"
                );
            }
            for (i, outcome) in positions.into_iter().zip(made) {
                outcomes[i] = Some(outcome);
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| AdapterOutcome::Unknown("no answer".to_owned())))
            .collect()
    }

    /// One `movements` call, or, with a half-batch fail point armed, the first half's call and
    /// the abort before the second half's (crash tests).
    async fn movements_of_port(
        &self,
        port: &dyn AccountPort,
        operation: Operation,
        movements: &[Movement],
        route: Route,
    ) -> Vec<AdapterOutcome> {
        let Some(half) = route.half(operation) else {
            return port.movements(operation, movements).await;
        };
        if self.failpoints.is_armed(half) && movements.len() > 1 {
            let first = port
                .movements(operation, &movements[..movements.len() / 2])
                .await;
            tracing::info!(made = first.len(), "half of the batch's calls made");
            self.failpoints.hit(half);
        }
        port.movements(operation, movements).await
    }
}

/// The fail points before and after a round's `operation` calls (the crash tests').
fn call_points(operation: Operation) -> (FailPoint, FailPoint) {
    match operation {
        Operation::Withdraw => (
            FailPoint::SourcePendingBeforeCall,
            FailPoint::SourceAfterCall,
        ),
        Operation::Deposit => (
            FailPoint::TargetPendingBeforeCall,
            FailPoint::TargetAfterCall,
        ),
        Operation::Refund => (
            FailPoint::CompensatingBeforeRefund,
            FailPoint::CompensatingAfterRefund,
        ),
    }
}

/// The transfers of a round's lanes, in order. Precondition: every lane holds a created
/// transfer in the state this call serves (`drive_many` groups them by it); a lane dropped
/// here would never be answered.
fn lanes_data(group: &[Lane], operation: Operation) -> Vec<TransferData> {
    let datas: Vec<TransferData> = group
        .iter()
        .filter_map(|lane| lane.ctx.aggregate.data.clone())
        .collect();
    let serves = match operation {
        Operation::Withdraw => TransferState::SourcePending,
        Operation::Deposit => TransferState::TargetPending,
        Operation::Refund => TransferState::Compensating,
    };
    invariant!(
        datas.len() == group.len() && datas.iter().all(|d| d.state == serves),
        "a {operation:?} round over {} lanes, {} of them created and in {serves}",
        group.len(),
        datas.iter().filter(|d| d.state == serves).count()
    );
    datas
}

/// The account system `operation` of this transfer is made in.
fn port_account(data: &TransferData, operation: Operation) -> AccountType {
    match operation {
        Operation::Withdraw | Operation::Refund => data.from,
        Operation::Deposit => data.to,
    }
}

fn movement_of(data: &TransferData) -> Movement {
    Movement {
        req_id: data.req_id,
        user_id: data.user_id,
        asset: data.asset.clone(),
        amount: data.amount,
    }
}
