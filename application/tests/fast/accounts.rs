//! The admin's account commands (`Ledger::set_status`, `Ledger::external_deposit`) and a user's
//! own transfer (`Ledger::users_transfer`): which account system each reaches, and what each
//! refuses before reaching any.

use application::books::AccountStatus;
use application::testkit::{Status, Then};
use application::{AccountError, DepositRequest, Deposited, StatusSet};
use domain::{AssetStatus, UserId};
use rust_decimal::Decimal;

use crate::prelude::*;

type StatusAnswer = Result<StatusSet, AccountError>;
type DepositAnswer = Result<Deposited, AccountError>;

fn set_status<'a>(
    given: &'a Scenario,
    account: AccountType,
    asset: &'static str,
    status: AccountStatus,
) -> Then<'a, StatusAnswer> {
    given.when_ledger(|l| async move { l.set_status(user(), account, asset, status).await })
}

fn refused_with(answer: &Result<impl std::fmt::Debug, AccountError>, code: ErrorCode) {
    assert!(
        matches!(answer, Err(AccountError::Refused(c)) if *c == code),
        "expected {code:?}, got {answer:?}"
    );
}

#[test]
fn a_funding_status_is_set_in_funding_only() {
    let given = Scenario::new();
    let then = set_status(&given, FUNDING, "USDT", AccountStatus::Frozen);
    let set = then.answer().as_ref().expect("set");
    assert_eq!(
        (set.account_type, set.asset.as_str(), set.status),
        (FUNDING, "USDT", AccountStatus::Frozen)
    );
    then.account_status(FUNDING, Some(Status::Frozen))
        .account_status(SPOT, None)
        .nothing_appended();
}

#[test]
fn a_spot_status_is_set_in_spot_core_only() {
    let given = Scenario::new();
    let then = set_status(&given, SPOT, "USDT", AccountStatus::Disabled);
    assert_eq!(then.answer().as_ref().expect("set").account_type, SPOT);
    then.account_status(SPOT, Some(Status::Disabled))
        .account_status(FUNDING, Some(Status::Active));
}

#[test]
fn unsupported_account_types_are_refused_before_the_asset() {
    let given = Scenario::new();
    for account in [AccountType::Future, AccountType::Margin] {
        let then = set_status(&given, account, "NOPE", AccountStatus::Frozen);
        refused_with(then.answer(), ErrorCode::UnsupportedAccountType);
        then.account_status(FUNDING, Some(Status::Active))
            .account_status(SPOT, None);
    }
}

#[test]
fn an_unknown_asset_is_refused() {
    let given = Scenario::new();
    let then = set_status(&given, SPOT, "usdt", AccountStatus::Frozen);
    refused_with(then.answer(), ErrorCode::InvalidAsset);
    then.account_status(SPOT, None);
}

#[test]
fn a_missing_funding_account_is_the_funding_ledgers_refusal() {
    let given = Scenario::new();
    let then = set_status(&given, FUNDING, "BTC", AccountStatus::Frozen);
    assert!(
        matches!(
            then.answer(),
            Err(AccountError::Funding(
                application::books::FundingError::AccountNotFound
            ))
        ),
        "{:?}",
        then.answer()
    );
}

fn deposit<'a>(
    given: &'a Scenario,
    external_id: &str,
    asset: &str,
    amount: Option<&str>,
) -> Then<'a, DepositAnswer> {
    let request = DepositRequest {
        external_id: external_id.to_owned(),
        user_id: user(),
        asset: asset.to_owned(),
        amount: amount.map(str::to_owned),
    };
    given.when_ledger(|l| async move { l.external_deposit(request).await })
}

#[test]
fn a_deposit_credits_funding_once_per_external_id() {
    let given = Scenario::new();
    let then = deposit(&given, "chain:tx-1", "USDT", Some("5"));
    let done = then.answer().as_ref().expect("deposited");
    assert!(done.receipt.applied_now);
    assert_eq!(done.receipt.balance, Decimal::from(105));
    then.balances("105", None).nothing_appended();

    let again = deposit(&given, "chain:tx-1", "USDT", Some("5"));
    assert!(
        !again
            .answer()
            .as_ref()
            .expect("answered")
            .receipt
            .applied_now
    );
    again.balances("105", None);
}

#[test]
fn a_deposit_is_refused_in_the_checks_order() {
    let given = Scenario::new();
    {
        let mut assets = given.world.assets.write().unwrap();
        let mut btc = assets.get("BTC").unwrap().clone();
        btc.status = AssetStatus::Suspended;
        assets.upsert(btc);
    }
    // Each refusal wins over every later one.
    let cases: [(&str, &str, Option<&str>, ErrorCode); 5] = [
        ("bad id", "NOPE", None, ErrorCode::InvalidAsset),
        ("bad id", "BTC", None, ErrorCode::AssetSuspended),
        ("bad id", "USDT", None, ErrorCode::InvalidAmount),
        ("bad id", "USDT", Some("-1"), ErrorCode::InvalidAmount),
        (
            "bad id",
            "USDT",
            Some("0.000000001"),
            ErrorCode::PrecisionOverflow,
        ),
    ];
    for (id, asset, amount, code) in cases {
        let then = deposit(&given, id, asset, amount);
        refused_with(then.answer(), code);
        then.balances("100", None);
    }
    let then = deposit(&given, "bad id", "USDT", Some("1"));
    assert!(matches!(then.answer(), Err(AccountError::ExternalId)));
    then.balances("100", None);
}

#[test]
fn another_users_transfer_reads_as_missing() {
    let given = Scenario::new();
    let req_id = given
        .when_submit(request(None))
        .answered(TransferState::Committed)
        .req_id();
    let mine = given.when_ledger(|l| async move { l.users_transfer(user(), &req_id).await });
    assert_eq!(
        mine.answer().as_ref().unwrap().as_ref().map(|d| d.req_id),
        Some(req_id)
    );
    let other = UserId::new(8).unwrap();
    let theirs = given.when_ledger(|l| async move { l.users_transfer(other, &req_id).await });
    assert_eq!(theirs.answer().as_ref().unwrap(), &None);
}
