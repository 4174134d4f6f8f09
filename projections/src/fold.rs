//! The pure fold shared by the live projector, the bulk rebuild and the point-in-time queries:
//! applies transfer events to transfer rows and accumulates what they do to balances and state
//! counts. No I/O: the callers load the rows it continues and write what it produced.

use domain::{AccountType, TransferEvent, TransferState};
use rust_decimal::Decimal;
use rustc_hash::FxHashMap;

use crate::error::ProjectionError;
use crate::log::{event_id, StoredEvent};
use crate::rows::TransferRow;

/// Per (user, asset): net FUNDING and SPOT movement caused by transfers, and the amount in
/// flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BalanceDelta {
    pub funding_net: Decimal,
    pub spot_net: Decimal,
    pub in_flight: Decimal,
}

impl BalanceDelta {
    fn account(&mut self, account: &str) -> &mut Decimal {
        if account == AccountType::Funding.as_str() {
            &mut self.funding_net
        } else {
            &mut self.spot_net
        }
    }
}

/// The pure fold shared by the live projector, the replay and point-in-time queries: applies
/// events to transfer rows and accumulates what they do to balances and state counts.
#[derive(Debug, Default)]
pub struct Fold {
    /// Transfers touched, by req_id, in their latest folded state.
    pub rows: FxHashMap<String, TransferRow>,
    /// Transfers created in this fold (inserted rather than updated).
    pub created: Vec<String>,
    pub balances: FxHashMap<(i64, String), BalanceDelta>,
    pub state_counts: FxHashMap<i16, i64>,
}

impl Fold {
    /// Applies one event. Transfer rows the event refers to must be in `rows` already (loaded by
    /// the caller or created by an earlier event of this fold). Returns the transfer's owner, for
    /// the feed.
    pub fn apply(&mut self, stored: &StoredEvent) -> Result<Option<i64>, ProjectionError> {
        let event = stored.transfer_event()?;
        self.apply_decoded(
            &stored.aggregate_type,
            &stored.aggregate_id,
            stored.sequence,
            event.as_ref(),
        )
    }

    /// [`Fold::apply`] for an event whose payload the caller has already decoded (`None` for
    /// another aggregate type), so a batch decodes each payload once, straight from its text.
    pub fn apply_decoded(
        &mut self,
        aggregate_type: &str,
        aggregate_id: &str,
        sequence: i64,
        event: Option<&TransferEvent>,
    ) -> Result<Option<i64>, ProjectionError> {
        let Some(event) = event else {
            return Ok(None);
        };
        let out_of_order = |detail: String| ProjectionError::OutOfOrder {
            event_id: event_id(aggregate_type, aggregate_id, sequence),
            detail,
        };
        if let Some(row) = new_row(event) {
            if sequence != 1 || self.rows.contains_key(aggregate_id) {
                return Err(out_of_order(
                    "TransferCreated for an existing transfer".into(),
                ));
            }
            *self.state_counts.entry(row.state_id).or_default() += 1;
            let owner = row.user_id;
            self.created.push(row.req_id.clone());
            self.rows.insert(row.req_id.clone(), row);
            return Ok(Some(owner));
        }
        let row = self
            .rows
            .get_mut(aggregate_id)
            .ok_or_else(|| out_of_order("event before its TransferCreated".into()))?;
        if sequence != row.last_sequence + 1 {
            return Err(out_of_order(format!(
                "sequence {} follows {}",
                sequence, row.last_sequence
            )));
        }
        let prev = TransferState::from_id(row.state_id)
            .ok_or_else(|| out_of_order(format!("unknown stored state {}", row.state_id)))?;
        let next = event.resulting_state();
        *self.state_counts.entry(row.state_id).or_default() -= 1;
        *self.state_counts.entry(next.id()).or_default() += 1;
        let delta = self
            .balances
            .entry((row.user_id, row.asset.clone()))
            .or_default();
        move_money(delta, row, prev, next).map_err(out_of_order)?;
        record_failure(row, event);
        row.state = next.as_str().to_owned();
        row.state_id = next.id();
        row.updated_at = event.at();
        row.last_sequence = sequence;
        Ok(Some(row.user_id))
    }
}

/// The row a TransferCreated starts, in INIT; `None` for any other event.
fn new_row(event: &TransferEvent) -> Option<TransferRow> {
    let TransferEvent::TransferCreated {
        req_id,
        user_id,
        from,
        to,
        asset,
        amount,
        cid,
        at,
    } = event
    else {
        return None;
    };
    Some(TransferRow {
        req_id: req_id.to_string(),
        user_id: user_id.as_i64(),
        from_account: from.as_str().to_owned(),
        to_account: to.as_str().to_owned(),
        asset: asset.as_str().to_owned(),
        amount: amount.value(),
        cid: cid.clone(),
        state: TransferState::Init.as_str().to_owned(),
        state_id: TransferState::Init.id(),
        failure_code: None,
        failure_message: None,
        created_at: *at,
        updated_at: *at,
        last_sequence: 1,
    })
}

/// What a transfer's step from `prev` to `next` does to its owner's balances. Money effects
/// follow the state change, not the event's name, so a manual resolution (which may take
/// SOURCE_PENDING to SOURCE_DONE, TARGET_PENDING to COMMITTED, ...) counts exactly like the
/// automatic step it stands for. Refuses in-flight money leaving to anything but the target or
/// the source.
fn move_money(
    delta: &mut BalanceDelta,
    row: &TransferRow,
    prev: TransferState,
    next: TransferState,
) -> Result<(), String> {
    match (prev.is_in_flight(), next.is_in_flight(), next) {
        // The source's withdraw was applied: the money is in flight.
        (false, true, _) => {
            *delta.account(&row.from_account) -= row.amount;
            delta.in_flight += row.amount;
        }
        // The target's deposit was applied.
        (true, false, TransferState::Committed) => {
            *delta.account(&row.to_account) += row.amount;
            delta.in_flight -= row.amount;
        }
        // The source's refund was applied.
        (true, false, TransferState::RolledBack) => {
            *delta.account(&row.from_account) += row.amount;
            delta.in_flight -= row.amount;
        }
        (true, false, other) => return Err(format!("in-flight money cannot leave to {other}")),
        (false, false, _) | (true, true, _) => {}
    }
    Ok(())
}

/// Keeps the reason of a failure or compensation on the row.
fn record_failure(row: &mut TransferRow, event: &TransferEvent) {
    match event {
        TransferEvent::TransferFailed { code, message, .. }
        | TransferEvent::CompensationStarted { code, message, .. } => {
            row.failure_code = Some(code.clone());
            row.failure_message = Some(message.clone());
        }
        // The aggregate records an operator's FAILED or COMPENSATING with their reason.
        TransferEvent::TransferManuallyResolved {
            to_state: TransferState::Failed | TransferState::Compensating,
            reason,
            ..
        } => {
            row.failure_code = Some("MANUALLY_RESOLVED".to_owned());
            row.failure_message = Some(reason.clone());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
