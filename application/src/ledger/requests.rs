//! Transfer requests, one (`POST /internal_transfer`) or many (`POST /internal_transfers`): each
//! request's values checked in contract §5.5's order, then the gates after them (a cid repeat,
//! the per-second gate, the halt, the FUNDING target), then the coordinator's creation and drive
//! in a task a hung-up client cannot cancel.

use domain::{AccountType, ErrorCode, TransferData};
use tracing::Instrument;

use super::Ledger;
use crate::books::FundingError;
use crate::bulk::{cid_slots, Slot};
use crate::coordinator::{CoordinatorError, NewTransfer};
use crate::error::StoreError;
use crate::request::{depends_on_settings, TransferRequest};

/// Why a transfer request was not answered with a transfer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Refused with this contract code; nothing was created.
    #[error("refused: {0}")]
    Refused(ErrorCode),
    /// The halt flag could not be read: the request is refused (fail closed), as unavailable.
    #[error("halt flag unreadable")]
    HaltUnknown(#[source] StoreError),
    /// The FUNDING target's existence could not be checked.
    #[error("funding ledger")]
    Funding(#[source] FundingError),
    /// The task driving the transfer ended abnormally (a panic).
    #[error("transfer task ended abnormally")]
    Task(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
}

/// What a request's gates came to.
enum Gated {
    /// A cid repeat: its original transfer.
    Answered(TransferData),
    /// To be created.
    Accepted(NewTransfer),
}

/// A cid repeat inside a batch gets the first item's answer.
fn same_answer(
    first: Option<&Result<TransferData, RequestError>>,
    first_index: usize,
) -> Result<TransferData, RequestError> {
    match first {
        Some(Ok(data)) => Ok(data.clone()),
        Some(Err(RequestError::Refused(code))) => Err(RequestError::Refused(*code)),
        Some(Err(RequestError::Coordinator(e))) => Err(RequestError::Coordinator(e.clone())),
        Some(Err(other)) => Err(RequestError::Coordinator(
            CoordinatorError::outcome_unknown(format!("as item {first_index}: {other}")),
        )),
        None => Err(RequestError::Coordinator(CoordinatorError::invariant(
            "bulk answer missing",
        ))),
    }
}

impl Ledger {
    /// `POST /internal_transfer`'s command: the values checked in contract §5.5's order (a cid repeat
    /// refused only because an asset setting changed since still gets its original transfer),
    /// then a cid repeat answered with its original transfer whatever else changed (rate,
    /// halt), the per-second gate, the halt (MON-003), the FUNDING target's existence, and the
    /// coordinator's own create (daily limits) and drive.
    pub async fn request_transfer(
        &self,
        request: TransferRequest,
    ) -> Result<TransferData, RequestError> {
        let parsed = {
            let registry = self
                .assets
                .registry()
                .read()
                .unwrap_or_else(|e| e.into_inner());
            request.parse(&registry)
        };
        let transfer = match parsed {
            Ok(transfer) => transfer,
            Err(code) => return self.refused_values(&request, code).await,
        };
        let transfer = match self.gate(transfer).await? {
            Gated::Answered(existing) => return Ok(existing),
            Gated::Accepted(transfer) => transfer,
        };
        let coordinator = self.coordinator.clone();
        // The drive runs in its own task so a caller hanging up cannot cancel it between a
        // step's commit and its adapter call; the transfer then ends as soon as possible rather
        // than at the recovery worker's next pass. The task ends with the drive.
        // In the request's span: its trace follows the drive (docs/adr/0018-traces.md).
        let created = tokio::spawn(
            async move {
                coordinator.validate(&transfer)?;
                coordinator.create_and_drive(transfer).await
            }
            .in_current_span(),
        )
        .await
        .map_err(RequestError::Task)??;
        Ok(created)
    }

    /// `POST /internal_transfers`' command: many transfer requests, each checked exactly as
    /// `request_transfer` checks one (values in contract §5.5's order, cid repeat, the per-second gate
    /// counting each item, the halt, the FUNDING target), then the batch's creation and drive
    /// (`Coordinator::create_and_drive_many`: each step for the whole batch at once) in a task a
    /// hung-up client cannot cancel. One answer per request, in order; a refused item does not
    /// stop the others. Each item is its own transfer: a batch is not one transaction.
    pub async fn request_transfers(
        &self,
        requests: Vec<TransferRequest>,
    ) -> Vec<Result<TransferData, RequestError>> {
        let parsed: Vec<Result<NewTransfer, ErrorCode>> = {
            let registry = self
                .assets
                .registry()
                .read()
                .unwrap_or_else(|e| e.into_inner());
            requests.iter().map(|r| r.parse(&registry)).collect()
        };
        let keys: Vec<_> = parsed
            .iter()
            .map(|p| {
                p.as_ref()
                    .ok()
                    .map(|t| (t.user_id, t.cid.as_deref(), t.fingerprint()))
            })
            .collect();
        let slots = cid_slots(&keys);
        let mut answers: Vec<Option<Result<TransferData, RequestError>>> =
            requests.iter().map(|_| None).collect();
        let repeats = self.cid_repeats(&parsed, &slots).await;
        let mut accepted = Vec::new();
        for (i, ((request, parsed), repeat)) in requests.iter().zip(parsed).zip(repeats).enumerate()
        {
            let gated = match (parsed, slots[i], repeat) {
                (Err(code), _, _) => self
                    .refused_values(request, code)
                    .await
                    .map(Gated::Answered),
                (Ok(_), Slot::SameAs(_), _) => continue,
                (Ok(_), Slot::Reused, _) => {
                    Err(RequestError::Refused(ErrorCode::IdempotencyKeyReused))
                }
                (Ok(_), Slot::Own, Some(Ok(Some(existing)))) => Ok(Gated::Answered(existing)),
                (Ok(_), Slot::Own, Some(Err(e))) => Err(RequestError::Coordinator(e)),
                (Ok(transfer), Slot::Own, _) => self.admit(transfer).await,
            };
            match gated {
                Ok(Gated::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(Gated::Accepted(transfer)) => accepted.push((i, transfer)),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        for (i, answer) in self.create_accepted(accepted).await {
            answers[i] = Some(answer);
        }
        for (i, slot) in slots.iter().enumerate() {
            if let Slot::SameAs(j) = *slot {
                answers[i] = Some(same_answer(answers[j].as_ref(), j));
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(RequestError::Coordinator(CoordinatorError::invariant(
                        "bulk answer missing",
                    )))
                })
            })
            .collect()
    }

    /// The cid repeats of a batch's own items, looked up together (independent reads); the
    /// gates after them run in request order, so the per-second gate counts items in order.
    async fn cid_repeats(
        &self,
        parsed: &[Result<NewTransfer, ErrorCode>],
        slots: &[Slot],
    ) -> Vec<Option<Result<Option<TransferData>, CoordinatorError>>> {
        futures_util::future::join_all(parsed.iter().zip(slots).map(|(parsed, slot)| async move {
            match (parsed, slot) {
                (Ok(transfer), Slot::Own) => {
                    Some(self.coordinator.existing_for_cid(transfer).await)
                }
                _ => None,
            }
        }))
        .await
    }

    /// The accepted items of a batch (index, transfer) created and driven together, in a task a
    /// hung-up client cannot cancel (between a step's commit and its calls): each index with
    /// its answer.
    async fn create_accepted(
        &self,
        accepted: Vec<(usize, NewTransfer)>,
    ) -> Vec<(usize, Result<TransferData, RequestError>)> {
        let (positions, transfers): (Vec<usize>, Vec<NewTransfer>) = accepted.into_iter().unzip();
        let coordinator = self.coordinator.clone();
        let driven = tokio::spawn(
            async move {
                let mut checked = Vec::with_capacity(transfers.len());
                let mut refused = Vec::new();
                for (k, transfer) in transfers.into_iter().enumerate() {
                    match coordinator.validate(&transfer) {
                        Ok(()) => checked.push(transfer),
                        Err(e) => refused.push((k, e)),
                    }
                }
                let mut driven = coordinator
                    .create_and_drive_many(checked, crate::bulk::Route::Batch)
                    .await;
                // Ascending, so each refusal goes back to its own position.
                for (k, e) in refused {
                    driven.insert(k, Err(e));
                }
                driven
            }
            .in_current_span(),
        )
        .await;
        match driven {
            Ok(driven) => positions
                .into_iter()
                .zip(driven)
                .map(|(i, answer)| (i, answer.map_err(RequestError::Coordinator)))
                .collect(),
            Err(e) => {
                let cause = CoordinatorError::outcome_unknown(format!("bulk transfer task: {e}"));
                positions
                    .into_iter()
                    .map(|i| (i, Err(RequestError::Coordinator(cause.clone()))))
                    .collect()
            }
        }
    }

    /// A request refused for its values: its original transfer when it is a cid repeat refused
    /// only for a changed asset setting, else the refusal.
    async fn refused_values(
        &self,
        request: &TransferRequest,
        code: ErrorCode,
    ) -> Result<TransferData, RequestError> {
        if depends_on_settings(code) {
            if let Some(existing) = self.repeat_of_earlier(request).await {
                return Ok(existing);
            }
        }
        Err(RequestError::Refused(code))
    }

    /// The gates after a request's values, in contract §5.5's order (steps 7 to 10): a cid repeat answered with its
    /// original transfer whatever else changed (rate, halt), the per-second gate (one transfer
    /// counted), the halt (MON-003), the FUNDING target's existence.
    async fn gate(&self, transfer: NewTransfer) -> Result<Gated, RequestError> {
        if let Some(existing) = self.coordinator.existing_for_cid(&transfer).await? {
            return Ok(Gated::Answered(existing));
        }
        self.admit(transfer).await
    }

    /// The gates after the cid repeat: the per-second gate, the halt, the FUNDING target.
    async fn admit(&self, transfer: NewTransfer) -> Result<Gated, RequestError> {
        // Contract §5.5, step 8: counted only for requests that passed the checks
        // before it.
        self.rate
            .admit(transfer.user_id)
            .map_err(RequestError::Refused)?;
        // Checked after the request's own checks, so a bad request gets its own code.
        if self
            .halt
            .is_halted(self.stores.halt.as_ref())
            .await
            .map_err(RequestError::HaltUnknown)?
        {
            return Err(RequestError::Refused(ErrorCode::ServiceHalted));
        }
        // A FUNDING target must exist (SPOT is created lazily). Checked before anything is
        // created, so the refusal costs no withdraw and refund; the funding adapter still
        // refuses on its own if the account is missing when the deposit runs.
        if transfer.to == AccountType::Funding {
            let exists = self
                .funding
                .account_exists(transfer.user_id, &transfer.asset)
                .await
                .map_err(RequestError::Funding)?;
            if !exists {
                return Err(RequestError::Refused(ErrorCode::TargetAccountNotFound));
            }
        }
        Ok(Gated::Accepted(transfer))
    }

    /// The original transfer of a cid repeat with the same body; `None` in every other case.
    async fn repeat_of_earlier(&self, request: &TransferRequest) -> Option<TransferData> {
        let repeat = request.as_repeat()?;
        self.coordinator
            .existing_for_cid(&repeat)
            .await
            .ok()
            .flatten()
    }
}
