//! The conservation check, the halt and the failover repair over the in-memory records: the
//! product's `Ledger::audit` (incremental from the stored checkpoint, or full), the halt it sets
//! on a violation and an admin clears, and `Ledger::repair_lost` re-recording a transfer whose
//! events a failover lost. Each world opens its books first (`World::open_books`): the balances
//! the scenario starts with are its external deposits.

use application::audit::Mode;
use application::testkit::run;
use application::{RepairError, RequestError, TransferRequest};
use rust_decimal::Decimal;

use crate::prelude::*;

/// The scenario with its books opened: what it holds now came in from outside.
fn opened() -> Scenario {
    let given = Scenario::new();
    given.world.open_books();
    given
}

/// A full and an incremental check; both must agree. Returns the incremental one's verdict and
/// whether transfers are halted after it.
fn check(given: &Scenario) -> (application::audit::InvariantReport, bool) {
    let ledger = given.world.ledger();
    let (full, _) = run(ledger.audit(Mode::Full))
        .expect("no crash")
        .expect("the full check decides");
    let (incremental, halted) = run(ledger.audit(Mode::Incremental))
        .expect("no crash")
        .expect("the incremental check decides");
    assert_eq!(full.ok, incremental.ok, "full and incremental agree");
    assert_eq!(full.assets, incremental.assets, "same sums");
    (incremental, halted)
}

fn transfer_request() -> TransferRequest {
    TransferRequest {
        user_id: user(),
        from: "FUNDING".into(),
        to: "SPOT".into(),
        asset: "USDT".into(),
        amount: Some("1".into()),
        cid: None,
    }
}

#[test]
fn settled_and_open_transfers_conserve_money() {
    let given = opened();
    given
        .when_submit(request(None))
        .answered(TransferState::Committed);
    // One left open after its withdraw: the money is in flight, not lost.
    let open = given.world.clone();
    let given =
        Scenario { world: open }.given_fault(SPOT, Call::Deposit, AccountFault::Unavailable);
    given
        .when_submit(request(None))
        .answered(TransferState::TargetPending);
    let (report, halted) = check(&given);
    assert!(report.ok, "{report:?}");
    assert!(!halted);
    assert_eq!(report.assets[0].in_flight, Decimal::from(10));
    // The incremental check stored its checkpoint and consumed what it read.
    assert!(report.stored);
    assert_eq!(given.world.records.kept().checkpoint.version, 1);
}

#[test]
fn money_that_appears_in_an_account_is_found_and_halts_new_transfers() {
    let given = opened();
    given
        .when_submit(request(None))
        .answered(TransferState::Committed);
    // A write no transfer made: one USDT more in FUNDING.
    given
        .world
        .funding
        .open(user(), &request(None).asset, Decimal::from(91));
    let (report, halted) = check(&given);
    assert!(!report.ok);
    assert!(halted, "a violation halts new transfers");
    let usdt = &report.assets[0];
    assert_eq!(usdt.difference, Decimal::ONE);
    assert!(!usdt.ok);
    // MON-003: a new request is refused while halted, with nothing created.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ledger = given.world.ledger();
    let refused = rt.block_on(ledger.request_transfer(transfer_request()));
    assert!(
        matches!(
            refused,
            Err(RequestError::Refused(ErrorCode::ServiceHalted))
        ),
        "{refused:?}"
    );
    // An admin lifts it; the next request is served.
    rt.block_on(ledger.clear_halt(user())).unwrap();
    let served = rt.block_on(ledger.request_transfer(transfer_request()));
    assert_eq!(served.unwrap().state, TransferState::Committed);
}

#[test]
fn a_movement_the_events_do_not_allow_is_a_disagreement() {
    let given = opened().given_fault(FUNDING, Call::Withdraw, refuse("INSUFFICIENT_BALANCE"));
    let failed = given.when_submit(request(None));
    failed.answered(TransferState::Failed);
    // spot-core holds a deposit for the FAILED transfer.
    given
        .world
        .spot
        .decide(Operation::Deposit, &movement(failed.req_id()), None);
    let (report, halted) = check(&given);
    assert!(!report.ok);
    assert!(halted);
    assert_eq!(report.disagreements.len(), 1, "{report:?}");
    assert_eq!(report.disagreements[0].req_id, failed.req_id().to_string());
}

#[test]
fn a_transfer_a_failover_lost_is_found_then_repaired_from_spot_cores_record() {
    let given = opened();
    // spot-core applied the deposit of a transfer whose events the database lost.
    let lost = given_req_id();
    given
        .world
        .spot
        .decide(Operation::Deposit, &movement(lost), None);
    let (report, halted) = check(&given);
    assert!(!report.ok && halted, "{report:?}");
    assert!(report
        .disagreements
        .iter()
        .any(|d| d.req_id == lost.to_string()));

    let ledger = given.world.ledger();
    // Refused without an operator's reason.
    assert!(matches!(
        run(ledger.repair_lost(&lost, "", "")).unwrap(),
        Err(RepairError::MissingReason)
    ));
    let repaired = run(ledger.repair_lost(&lost, "ops", "PG failover lost it"))
        .unwrap()
        .expect("repaired");
    assert_eq!(repaired.state, "COMMITTED");
    assert_eq!(
        (repaired.from.as_str(), repaired.to.as_str()),
        ("FUNDING", "SPOT")
    );
    assert!(!repaired.repeated);
    // The FUNDING withdraw was applied now; the SPOT deposit was found applied, not repeated.
    assert!(given.world.funding.applied(lost, Operation::Withdraw));
    assert_eq!(
        given.world.spot.balance(user(), &request(None).asset),
        Some(Decimal::from(10))
    );
    // A repeat answers from the repair's record.
    let again = run(ledger.repair_lost(&lost, "ops", "again"))
        .unwrap()
        .unwrap();
    assert!(again.repeated);
    // Conservation is exact again; the admin lifts the halt.
    run(ledger.clear_halt(user())).unwrap().unwrap();
    let (report, halted) = check(&given);
    assert!(report.ok, "{report:?}");
    assert!(!halted);
}

#[test]
fn a_repair_is_refused_when_spot_core_applied_nothing_or_the_log_knows_the_transfer() {
    let given = opened();
    let ledger = given.world.ledger();
    assert!(matches!(
        run(ledger.repair_lost(&given_req_id(), "ops", "why")).unwrap(),
        Err(RepairError::NothingApplied)
    ));
    let known = given.when_submit(request(None));
    known.answered(TransferState::Committed);
    assert!(matches!(
        run(ledger.repair_lost(&known.req_id(), "ops", "why")).unwrap(),
        Err(RepairError::Known(_))
    ));
}

#[test]
fn a_repair_that_cannot_pay_its_funding_withdraw_records_nothing() {
    let given = opened().given_funding_balance("5");
    let lost = given_req_id();
    given
        .world
        .spot
        .decide(Operation::Deposit, &movement(lost), None);
    let ledger = given.world.ledger();
    assert!(matches!(
        run(ledger.repair_lost(&lost, "ops", "why")).unwrap(),
        Err(RepairError::InsufficientFunding { .. })
    ));
    assert!(given.world.records.kept().repairs.is_empty());
    assert!(given.world.state(lost).is_none());
}

#[test]
fn a_repair_past_spot_cores_horizon_is_refused_for_good_and_records_nothing() {
    use application::books::SpotBook;
    use application::testkit::clock::START_MS;
    let given = opened();
    // spot-core applied the deposit of a lost transfer, then forgot it: its horizon passed it.
    let lost = given_req_id();
    given
        .world
        .spot
        .decide(Operation::Deposit, &movement(lost), None);
    run(given.world.spot.advance_horizon(START_MS + 1))
        .unwrap()
        .unwrap();
    let ledger = given.world.ledger();
    let refused = run(ledger.repair_lost(&lost, "ops", "why")).unwrap();
    assert!(
        matches!(refused, Err(RepairError::PastHorizon { horizon_ms }) if horizon_ms == START_MS + 1),
        "{refused:?}"
    );
    // Its message says why no retry can succeed.
    let said = refused.unwrap_err().to_string();
    assert!(
        said.contains("idempotency horizon") && said.contains("no repair can ever"),
        "{said}"
    );
    assert!(given.world.records.kept().repairs.is_empty());
    assert!(given.world.state(lost).is_none());
}
