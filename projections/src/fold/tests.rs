//! Unit tests of the fold: one transfer's events at a time, built with `domain` types, and what
//! they leave in the rows, balances and state counts.

use chrono::{DateTime, TimeZone, Utc};
use domain::{
    AccountType, Amount, AssetSymbol, ReqId, Resolution, TransferEvent, TransferState, UserId,
};
use rust_decimal::Decimal;

use super::{BalanceDelta, Fold};
use crate::error::ProjectionError;
use crate::log::{StoredEvent, TRANSFER_AGGREGATE};
use crate::rows::TransferRow;

const USER: i64 = 7;
const ASSET: &str = "USDT";

fn at(second: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, second)
        .single()
        .expect("a valid time")
}

/// A signed decimal (`Amount` holds only positive amounts).
fn amount(text: &str) -> Decimal {
    text.parse().expect("a valid decimal")
}

/// The TransferCreated of a transfer of `amount` USDT by [`USER`] from `from` to `to`.
fn create(
    req_id: &str,
    (from, to): (AccountType, AccountType),
    amount: &str,
    second: u32,
) -> TransferEvent {
    TransferEvent::TransferCreated {
        req_id: ReqId::parse(req_id).expect("a valid req_id"),
        user_id: UserId::new(7).expect("a valid user"),
        from,
        to,
        asset: AssetSymbol::parse(ASSET).expect("a valid asset"),
        amount: Amount::parse(amount).expect("a valid amount"),
        cid: Some("client-1".to_owned()),
        at: at(second),
    }
}

/// One transfer's events, applied in order with their sequence numbers.
struct Script {
    fold: Fold,
    req_id: String,
    sequence: i64,
}

impl Script {
    /// A transfer of 25.5 USDT by [`USER`] from `from` to `to`, created at second 1.
    fn created(from: AccountType, to: AccountType) -> Self {
        let mut script = Self::continuing(Fold::default(), ReqId::generate().to_string(), 0);
        let event = create(&script.req_id, (from, to), "25.5", 1);
        assert_eq!(script.apply(event).expect("folds"), Some(USER));
        script
    }

    fn continuing(fold: Fold, req_id: String, sequence: i64) -> Self {
        Self {
            fold,
            req_id,
            sequence,
        }
    }

    /// Applies the transfer's next event; returns the owner the fold reports.
    fn apply(&mut self, event: TransferEvent) -> Result<Option<i64>, ProjectionError> {
        let sequence = self.sequence + 1;
        let owner =
            self.fold
                .apply_decoded(TRANSFER_AGGREGATE, &self.req_id, sequence, Some(&event))?;
        self.sequence = sequence;
        Ok(owner)
    }

    fn step(&mut self, event: TransferEvent) {
        assert_eq!(self.apply(event).expect("folds"), Some(USER));
    }

    fn row(&self) -> &TransferRow {
        self.fold
            .rows
            .get(&self.req_id)
            .expect("the transfer's row")
    }

    fn balance(&self) -> BalanceDelta {
        self.fold
            .balances
            .get(&(USER, ASSET.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// The state counts the fold changed, by state id.
    fn counts(&self) -> Vec<(i16, i64)> {
        let mut counts: Vec<(i16, i64)> = self
            .fold
            .state_counts
            .iter()
            .filter(|(_, n)| **n != 0)
            .map(|(s, n)| (*s, *n))
            .collect();
        counts.sort_unstable();
        counts
    }

    fn assert_state(&self, state: TransferState) {
        assert_eq!(self.row().state, state.as_str());
        assert_eq!(self.row().state_id, state.id());
        assert_eq!(self.row().last_sequence, self.sequence);
    }
}

fn delta(funding_net: &str, spot_net: &str, in_flight: &str) -> BalanceDelta {
    BalanceDelta {
        funding_net: amount(funding_net),
        spot_net: amount(spot_net),
        in_flight: amount(in_flight),
    }
}

fn failed(code: &str, second: u32) -> TransferEvent {
    TransferEvent::TransferFailed {
        code: code.to_owned(),
        message: format!("{code} happened"),
        at: at(second),
    }
}

fn compensation(code: &str, second: u32) -> TransferEvent {
    TransferEvent::CompensationStarted {
        code: code.to_owned(),
        message: format!("{code} happened"),
        at: at(second),
    }
}

fn resolved(
    resolution: Resolution,
    from_state: TransferState,
    to_state: TransferState,
    second: u32,
) -> TransferEvent {
    TransferEvent::TransferManuallyResolved {
        resolution,
        from_state,
        to_state,
        operator: "ops@example".to_owned(),
        reason: "confirmed with the account system".to_owned(),
        at: at(second),
    }
}

#[test]
fn a_created_transfer_is_a_new_row_in_init() {
    let s = Script::created(AccountType::Funding, AccountType::Spot);
    let row = s.row();
    assert_eq!(row.user_id, USER);
    assert_eq!(row.from_account, "FUNDING");
    assert_eq!(row.to_account, "SPOT");
    assert_eq!(row.asset, ASSET);
    assert_eq!(row.amount, amount("25.5"));
    assert_eq!(row.cid.as_deref(), Some("client-1"));
    assert_eq!((row.created_at, row.updated_at), (at(1), at(1)));
    assert_eq!(
        (row.failure_code.clone(), row.failure_message.clone()),
        (None, None)
    );
    s.assert_state(TransferState::Init);
    assert_eq!(s.fold.created, vec![s.req_id.clone()]);
    assert_eq!(s.counts(), vec![(TransferState::Init.id(), 1)]);
    assert_eq!(s.balance(), BalanceDelta::default());
}

#[test]
fn the_happy_path_moves_the_amount_from_source_to_target_through_in_flight() {
    let mut s = Script::created(AccountType::Funding, AccountType::Spot);
    s.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    s.assert_state(TransferState::SourcePending);
    assert_eq!(s.balance(), BalanceDelta::default());
    s.step(TransferEvent::SourceWithdrawn { at: at(3) });
    s.assert_state(TransferState::SourceDone);
    assert_eq!(s.balance(), delta("-25.5", "0", "25.5"));
    s.step(TransferEvent::TargetDepositStarted { at: at(4) });
    s.assert_state(TransferState::TargetPending);
    assert_eq!(s.balance(), delta("-25.5", "0", "25.5"));
    s.step(TransferEvent::TransferCommitted { at: at(5) });
    s.assert_state(TransferState::Committed);
    assert_eq!(s.balance(), delta("-25.5", "25.5", "0"));
    assert_eq!((s.row().created_at, s.row().updated_at), (at(1), at(5)));
    assert_eq!(s.row().failure_code, None);
    assert_eq!(s.counts(), vec![(TransferState::Committed.id(), 1)]);
}

#[test]
fn spot_to_funding_moves_the_other_way() {
    let mut s = Script::created(AccountType::Spot, AccountType::Funding);
    s.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    s.step(TransferEvent::SourceWithdrawn { at: at(3) });
    assert_eq!(s.balance(), delta("0", "-25.5", "25.5"));
    s.step(TransferEvent::TargetDepositStarted { at: at(4) });
    s.step(TransferEvent::TransferCommitted { at: at(5) });
    assert_eq!(s.balance(), delta("25.5", "-25.5", "0"));
}

#[test]
fn a_failure_before_the_withdraw_moves_nothing_and_keeps_its_reason() {
    let mut s = Script::created(AccountType::Funding, AccountType::Spot);
    s.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    s.step(failed("INSUFFICIENT_BALANCE", 3));
    s.assert_state(TransferState::Failed);
    assert_eq!(
        s.row().failure_code.as_deref(),
        Some("INSUFFICIENT_BALANCE")
    );
    assert_eq!(
        s.row().failure_message.as_deref(),
        Some("INSUFFICIENT_BALANCE happened")
    );
    assert_eq!(s.row().updated_at, at(3));
    assert_eq!(s.balance(), BalanceDelta::default());
    assert_eq!(s.counts(), vec![(TransferState::Failed.id(), 1)]);
}

#[test]
fn a_compensation_refunds_the_source_and_keeps_its_reason() {
    let mut s = Script::created(AccountType::Funding, AccountType::Spot);
    s.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    s.step(TransferEvent::SourceWithdrawn { at: at(3) });
    s.step(TransferEvent::TargetDepositStarted { at: at(4) });
    s.step(compensation("DEPOSIT_REFUSED", 5));
    s.assert_state(TransferState::Compensating);
    // The money is still in flight until the refund is applied.
    assert_eq!(s.balance(), delta("-25.5", "0", "25.5"));
    assert_eq!(s.row().failure_code.as_deref(), Some("DEPOSIT_REFUSED"));
    s.step(TransferEvent::TransferRolledBack { at: at(6) });
    s.assert_state(TransferState::RolledBack);
    assert_eq!(s.balance(), BalanceDelta::default());
    assert_eq!(s.row().failure_code.as_deref(), Some("DEPOSIT_REFUSED"));
    assert_eq!(s.counts(), vec![(TransferState::RolledBack.id(), 1)]);
}

#[test]
fn a_manual_resolution_counts_like_the_step_it_stands_for() {
    use TransferState as S;
    let mut s = Script::created(AccountType::Funding, AccountType::Spot);
    s.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    s.step(resolved(
        Resolution::Applied,
        S::SourcePending,
        S::SourceDone,
        3,
    ));
    s.assert_state(S::SourceDone);
    assert_eq!(s.balance(), delta("-25.5", "0", "25.5"));
    assert_eq!(s.row().failure_code, None);
    s.step(TransferEvent::TargetDepositStarted { at: at(4) });
    s.step(resolved(
        Resolution::NotApplied,
        S::TargetPending,
        S::Compensating,
        5,
    ));
    s.assert_state(S::Compensating);
    assert_eq!(s.balance(), delta("-25.5", "0", "25.5"));
    assert_eq!(s.row().failure_code.as_deref(), Some("MANUALLY_RESOLVED"));
    assert_eq!(
        s.row().failure_message.as_deref(),
        Some("confirmed with the account system")
    );
    s.step(resolved(
        Resolution::Applied,
        S::Compensating,
        S::RolledBack,
        6,
    ));
    s.assert_state(S::RolledBack);
    assert_eq!(s.balance(), BalanceDelta::default());
    assert_eq!(s.counts(), vec![(S::RolledBack.id(), 1)]);
}

#[test]
fn a_manual_commit_or_failure_moves_what_the_automatic_step_would() {
    use TransferState as S;
    let mut committed = Script::created(AccountType::Funding, AccountType::Spot);
    committed.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    committed.step(TransferEvent::SourceWithdrawn { at: at(3) });
    committed.step(TransferEvent::TargetDepositStarted { at: at(4) });
    committed.step(resolved(
        Resolution::Applied,
        S::TargetPending,
        S::Committed,
        5,
    ));
    committed.assert_state(S::Committed);
    assert_eq!(committed.balance(), delta("-25.5", "25.5", "0"));
    assert_eq!(committed.row().failure_code, None);

    let mut failed = Script::created(AccountType::Funding, AccountType::Spot);
    failed.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    failed.step(resolved(
        Resolution::NotApplied,
        S::SourcePending,
        S::Failed,
        3,
    ));
    failed.assert_state(S::Failed);
    assert_eq!(failed.balance(), BalanceDelta::default());
    assert_eq!(
        failed.row().failure_code.as_deref(),
        Some("MANUALLY_RESOLVED")
    );
}

#[test]
fn a_loaded_row_continues_where_it_stood() {
    let mut earlier = Script::created(AccountType::Funding, AccountType::Spot);
    earlier.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    earlier.step(TransferEvent::SourceWithdrawn { at: at(3) });
    // A later batch: the row comes from the table, the rest of the fold starts empty.
    let row = earlier.row().clone();
    let mut fold = Fold::default();
    fold.rows.insert(row.req_id.clone(), row);
    let mut s = Script::continuing(fold, earlier.req_id.clone(), earlier.sequence);
    s.step(TransferEvent::TargetDepositStarted { at: at(4) });
    s.step(TransferEvent::TransferCommitted { at: at(5) });
    s.assert_state(TransferState::Committed);
    assert!(s.fold.created.is_empty(), "an update, not an insert");
    assert_eq!(s.balance(), delta("0", "25.5", "-25.5"));
    assert_eq!(
        s.counts(),
        vec![
            (TransferState::SourceDone.id(), -1),
            (TransferState::Committed.id(), 1)
        ]
    );
}

#[test]
fn two_transfers_of_one_user_and_asset_add_up() {
    let mut first = Script::created(AccountType::Funding, AccountType::Spot);
    for event in [
        TransferEvent::SourceWithdrawStarted { at: at(2) },
        TransferEvent::SourceWithdrawn { at: at(3) },
        TransferEvent::TargetDepositStarted { at: at(4) },
        TransferEvent::TransferCommitted { at: at(5) },
    ] {
        first.step(event);
    }
    let mut second = Script::continuing(first.fold, ReqId::generate().to_string(), 0);
    second.fold.created.clear();
    let (from, to) = (AccountType::Funding, AccountType::Spot);
    second.step(create(&second.req_id.clone(), (from, to), "4.5", 6));
    second.step(TransferEvent::SourceWithdrawStarted { at: at(7) });
    second.step(TransferEvent::SourceWithdrawn { at: at(8) });
    assert_eq!(second.balance(), delta("-30", "25.5", "4.5"));
    assert_eq!(
        second.counts(),
        vec![
            (TransferState::SourceDone.id(), 1),
            (TransferState::Committed.id(), 1)
        ]
    );
}

fn stored(req_id: &str, event_version: &str, event: &TransferEvent) -> StoredEvent {
    StoredEvent {
        tx_id: 1,
        global_position: 1,
        aggregate_type: TRANSFER_AGGREGATE.to_owned(),
        aggregate_id: req_id.to_owned(),
        sequence: 1,
        event_type: "TransferCreated".to_owned(),
        event_version: event_version.to_owned(),
        payload: serde_json::to_value(event).expect("an event serializes"),
    }
}

#[test]
fn a_stored_event_is_decoded_and_an_unknown_version_refused() {
    let template = Script::created(AccountType::Funding, AccountType::Spot);
    let req_id = template.req_id.clone();
    let create = create(
        &req_id,
        (AccountType::Funding, AccountType::Spot),
        "25.5",
        1,
    );
    let mut fold = Fold::default();
    let refused = fold.apply(&stored(&req_id, "2", &create));
    match refused {
        Err(ProjectionError::Undecodable { event_id, detail }) => {
            assert_eq!(event_id, format!("Transfer:{req_id}:1"));
            assert_eq!(detail, "version 2 has no upcaster");
        }
        other => panic!("an unknown version must be refused, got {other:?}"),
    }
    assert!(fold.rows.is_empty() && fold.state_counts.is_empty());

    assert_eq!(
        fold.apply(&stored(&req_id, "1", &create)).ok(),
        Some(Some(USER))
    );
    assert_eq!(fold.rows.get(&req_id), template.fold.rows.get(&req_id));
}

#[test]
fn another_aggregate_type_is_passed_over() {
    let mut fold = Fold::default();
    let mut other = stored("x", "7", &TransferEvent::TransferCommitted { at: at(1) });
    other.aggregate_type = "Account".to_owned();
    assert_eq!(fold.apply(&other).ok(), Some(None));
    assert!(fold.rows.is_empty() && fold.state_counts.is_empty());
}

/// A deposit's entry (migration 0025) is in the log the projector reads, but it is no transfer's
/// event: its payload is never decoded as one, and it changes no row, balance or count.
#[test]
fn a_deposit_entry_is_passed_over_undecoded() {
    let mut fold = Fold::default();
    let deposit = StoredEvent {
        tx_id: 1,
        global_position: 1,
        aggregate_type: "Deposit".to_owned(),
        aggregate_id: "ext-1".to_owned(),
        sequence: 1,
        event_type: "ExternalDeposited".to_owned(),
        event_version: "1".to_owned(),
        payload: serde_json::json!({"ExternalDeposited": {"external_id": "ext-1",
            "asset": "USDT", "amount": "5", "at": "2026-01-01T00:00:00.000000Z"}}),
    };
    assert_eq!(fold.apply(&deposit).ok(), Some(None));
    assert!(fold.rows.is_empty() && fold.state_counts.is_empty() && fold.balances.is_empty());
}

fn assert_out_of_order(result: Result<Option<i64>, ProjectionError>, detail_has: &str) {
    match result {
        Err(ProjectionError::OutOfOrder { detail, .. }) => {
            assert!(detail.contains(detail_has), "{detail}");
        }
        other => panic!("expected OutOfOrder ({detail_has}), got {other:?}"),
    }
}

#[test]
fn a_log_that_contradicts_itself_stops_the_fold() {
    let mut orphan = Script::continuing(Fold::default(), ReqId::generate().to_string(), 1);
    assert_out_of_order(
        orphan.apply(TransferEvent::SourceWithdrawStarted { at: at(2) }),
        "before its TransferCreated",
    );

    let mut gap = Script::created(AccountType::Funding, AccountType::Spot);
    gap.sequence += 1;
    assert_out_of_order(
        gap.apply(TransferEvent::SourceWithdrawStarted { at: at(2) }),
        "sequence 3 follows 1",
    );

    let mut twice = Script::created(AccountType::Funding, AccountType::Spot);
    let create = create(
        &twice.req_id,
        (AccountType::Funding, AccountType::Spot),
        "25.5",
        2,
    );
    twice.sequence = 0;
    assert_out_of_order(twice.apply(create), "for an existing transfer");

    // Money in flight can only reach the target or go back to the source.
    let mut lost = Script::created(AccountType::Funding, AccountType::Spot);
    lost.step(TransferEvent::SourceWithdrawStarted { at: at(2) });
    lost.step(TransferEvent::SourceWithdrawn { at: at(3) });
    assert_out_of_order(lost.apply(failed("LOST", 4)), "cannot leave to FAILED");
}
