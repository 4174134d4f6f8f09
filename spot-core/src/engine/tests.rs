//! The engine's rules, request by request, and its replay.

use super::*;
use crate::protocol::{
    HorizonRecord, MapVersionRecord, MovementRecord, MovementRequest, Outcome, Request,
    RetainRecord,
};
use crate::ulid;
use std::str::FromStr;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

fn engine() -> Engine {
    Engine::new(Assets::builtin())
}

/// Creation time of the test req_ids.
const T0: u64 = 1_700_000_000_000;

/// A canonical ULID standing for `label` (created at `T0`); a label that cannot be one
/// (empty, with a space, longer than a ULID) is passed through, for the validation tests.
fn id(label: &str) -> String {
    if label.is_empty() || label.contains(' ') || label.len() > ulid::ULID_LEN || !label.is_ascii()
    {
        return label.to_string();
    }
    let h = label.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    ulid::format(ulid::from_parts(T0, u128::from(h)))
}

fn mv(op: MovementOp, req_id: &str, user_id: u64, asset: &str, amount: &str) -> Request {
    let body = MovementRequest {
        req_id: id(req_id),
        user_id,
        asset: asset.into(),
        amount: amount.into(),
        trace: None,
    };
    match op {
        MovementOp::Withdraw => Request::Withdraw(body),
        MovementOp::Deposit => Request::Deposit(body),
        MovementOp::Refund => Request::Refund(body),
    }
}

fn deposit(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
    e.apply(&mv(MovementOp::Deposit, req_id, user, asset, amount))
}

fn withdraw(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
    e.apply(&mv(MovementOp::Withdraw, req_id, user, asset, amount))
}

fn refund(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
    e.apply(&mv(MovementOp::Refund, req_id, user, asset, amount))
}

fn set_status(e: &mut Engine, user: u64, asset: &str, status: AccountStatus) -> Effect {
    e.apply(&Request::SetStatus {
        user_id: user,
        asset: asset.into(),
        status,
    })
}

fn code(effect: &Effect) -> Option<RefusalCode> {
    match &effect.response {
        Response::Refused { code, .. } => Some(*code),
        _ => None,
    }
}

fn applied_balance(effect: &Effect) -> Decimal {
    match &effect.response {
        Response::Applied { balance, .. } => *balance,
        other => panic!("expected applied, got {other:?}"),
    }
}

fn balance(e: &Engine, user: u64, asset: &str) -> Option<Decimal> {
    e.account(user, asset).map(|(b, _)| b)
}

/// A validation refusal: the right code, nothing recorded, nothing changed.
fn assert_unrecorded(e: &mut Engine, req: Request, expected: RefusalCode) {
    let before = e.clone();
    let effect = e.apply(&req);
    assert_eq!(code(&effect), Some(expected), "{req:?} → {effect:?}");
    assert!(effect.record.is_none(), "{req:?} must not be recorded");
    assert_eq!(*e, before, "{req:?} must not change state");
}

/// A business refusal: the right code, recorded with a seq, balances unchanged.
fn assert_recorded_refusal(e: &mut Engine, req: Request, expected: RefusalCode) {
    let balances_before = e.accounts.clone();
    let effect = e.apply(&req);
    assert_eq!(code(&effect), Some(expected), "{req:?} → {effect:?}");
    let rec = effect.record.expect("business refusals are recorded");
    let (_, m) = rec.as_movement().unwrap();
    assert_eq!((m.outcome, m.code), (Outcome::Refused, Some(expected)));
    assert!(
        matches!(effect.response, Response::Refused { seq: Some(s), duplicate: false, .. } if s == m.seq)
    );
    assert_eq!(e.accounts, balances_before);
}

#[test]
fn amount_parsing_accepts_only_canonical_plain_decimals() {
    assert_eq!(parse_amount("10.5", 8), Ok(d("10.5")));
    assert_eq!(parse_amount("10.50", 8), Ok(d("10.5")));
    assert_eq!(parse_amount("0.00000001", 8), Ok(d("0.00000001")));
    assert_eq!(parse_amount("1.000000000000", 2), Ok(d("1")));
    assert_eq!(parse_amount("100000000000000000000", 8), Ok(max_amount()));
    assert_eq!(
        parse_amount("99999999999999999999.99999999", 8),
        Ok(d("99999999999999999999.99999999"))
    );
    for bad in [
        "", "0", "0.0", "00.5", "01", "-1", "+1", "1e5", "1E5", " 1", "1 ", "1.", ".5", "1.2.3",
        "abc", "1,5", "٣", "0x10", "-0.5", "NaN", "inf",
    ] {
        assert_eq!(
            parse_amount(bad, 8),
            Err(RefusalCode::InvalidAmount),
            "{bad:?}"
        );
    }
    assert_eq!(
        parse_amount("0.000000001", 8),
        Err(RefusalCode::PrecisionOverflow)
    );
    assert_eq!(parse_amount("1.5", 0), Err(RefusalCode::PrecisionOverflow));
    assert_eq!(
        parse_amount("100000000000000000000.00000001", 8),
        Err(RefusalCode::Overflow)
    );
    assert_eq!(
        parse_amount("100000000000000000001", 8),
        Err(RefusalCode::Overflow)
    );
    assert_eq!(
        parse_amount("999999999999999999999999999999999999", 8),
        Err(RefusalCode::Overflow)
    );
}

#[test]
fn validation_refusals_are_not_recorded() {
    let mut e = engine();
    deposit(&mut e, "seed", 1, "USDT", "100");
    let w = MovementOp::Withdraw;
    assert_unrecorded(&mut e, mv(w, "", 1, "USDT", "1"), RefusalCode::InvalidReqId);
    assert_unrecorded(
        &mut e,
        mv(w, &"a".repeat(65), 1, "USDT", "1"),
        RefusalCode::InvalidReqId,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "bad id", 1, "USDT", "1"),
        RefusalCode::InvalidReqId,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "é", 1, "USDT", "1"),
        RefusalCode::InvalidReqId,
    );
    // Not canonical: lowercase, or not a ULID at all (a free-form id).
    let mut lower = mv(w, "x", 1, "USDT", "1");
    if let Request::Withdraw(m) = &mut lower {
        m.req_id = m.req_id.to_lowercase();
    }
    assert_unrecorded(&mut e, lower, RefusalCode::InvalidReqId);
    let mut short = mv(w, "x", 1, "USDT", "1");
    if let Request::Withdraw(m) = &mut short {
        m.req_id = "t-1".into();
    }
    assert_unrecorded(&mut e, short, RefusalCode::InvalidReqId);
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 0, "USDT", "1"),
        RefusalCode::InvalidUserId,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", i64::MAX as u64 + 1, "USDT", "1"),
        RefusalCode::InvalidUserId,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 1, "DOGE", "1"),
        RefusalCode::InvalidAsset,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 1, "usdt", "1"),
        RefusalCode::InvalidAsset,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 1, "USDT", "-1"),
        RefusalCode::InvalidAmount,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 1, "USDT", "0"),
        RefusalCode::InvalidAmount,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 1, "USDT", "1e2"),
        RefusalCode::InvalidAmount,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 1, "USDT", "0.123456789"),
        RefusalCode::PrecisionOverflow,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "r1", 1, "USDT", "100000000000000000001"),
        RefusalCode::Overflow,
    );
    assert_unrecorded(
        &mut e,
        mv(
            MovementOp::Deposit,
            "r1",
            1,
            "USDT",
            "100000000000000000001",
        ),
        RefusalCode::Overflow,
    );
    assert_unrecorded(
        &mut e,
        Request::SetStatus {
            user_id: 0,
            asset: "USDT".into(),
            status: AccountStatus::Frozen,
        },
        RefusalCode::InvalidUserId,
    );
    assert_unrecorded(
        &mut e,
        Request::SetStatus {
            user_id: 1,
            asset: "DOGE".into(),
            status: AccountStatus::Frozen,
        },
        RefusalCode::InvalidAsset,
    );
    assert_unrecorded(
        &mut e,
        Request::Lookup {
            req_id: "no good".into(),
        },
        RefusalCode::InvalidReqId,
    );
    assert_unrecorded(
        &mut e,
        Request::Lookup {
            req_id: id("r1").to_lowercase(),
        },
        RefusalCode::InvalidReqId,
    );
    // The req_id stays free after a validation refusal.
    assert_eq!(
        applied_balance(&withdraw(&mut e, "r1", 1, "USDT", "1")),
        d("99")
    );
}

#[test]
fn deposit_creates_the_account_lazily() {
    let mut e = engine();
    assert_eq!(e.balances(5), vec![]);
    let eff = deposit(&mut e, "d1", 5, "BTC", "1.25");
    assert_eq!(
        eff.response,
        Response::Applied {
            balance: d("1.25"),
            duplicate: false,
            seq: 1
        }
    );
    assert!(matches!(eff.record, Some(JournalRecord::Deposit(_))));
    assert_eq!(
        e.balances(5),
        vec![BalanceEntry {
            asset: "BTC".into(),
            available: d("1.25"),
            status: AccountStatus::Active
        }]
    );
}

#[test]
fn withdraw_refusals_in_order() {
    let mut e = engine();
    let w = |id: &str, amount: &str| mv(MovementOp::Withdraw, id, 1, "USDT", amount);
    assert_recorded_refusal(&mut e, w("w1", "1"), RefusalCode::SourceAccountNotFound);
    // A refused withdraw does not create the account.
    assert_eq!(e.account(1, "USDT"), None);
    deposit(&mut e, "d1", 1, "USDT", "10");
    set_status(&mut e, 1, "USDT", AccountStatus::Frozen);
    assert_recorded_refusal(&mut e, w("w2", "100"), RefusalCode::AccountFrozen);
    set_status(&mut e, 1, "USDT", AccountStatus::Disabled);
    assert_recorded_refusal(&mut e, w("w3", "100"), RefusalCode::AccountDisabled);
    set_status(&mut e, 1, "USDT", AccountStatus::Active);
    assert_recorded_refusal(
        &mut e,
        w("w4", "10.00000001"),
        RefusalCode::InsufficientBalance,
    );
    assert_eq!(applied_balance(&e.apply(&w("w5", "10"))), Decimal::ZERO);
    assert_eq!(balance(&e, 1, "USDT"), Some(Decimal::ZERO));
}

#[test]
fn deposit_status_rules() {
    let mut e = engine();
    set_status(&mut e, 2, "ETH", AccountStatus::Frozen);
    assert_eq!(
        e.account(2, "ETH"),
        Some((Decimal::ZERO, AccountStatus::Frozen))
    );
    // A frozen account may still receive.
    assert_eq!(
        applied_balance(&deposit(&mut e, "d1", 2, "ETH", "3")),
        d("3")
    );
    set_status(&mut e, 2, "ETH", AccountStatus::Disabled);
    assert_recorded_refusal(
        &mut e,
        mv(MovementOp::Deposit, "d2", 2, "ETH", "1"),
        RefusalCode::AccountDisabled,
    );
    assert_eq!(balance(&e, 2, "ETH"), Some(d("3")));
}

#[test]
fn resulting_balance_overflow_is_a_recorded_refusal() {
    let mut e = engine();
    assert_eq!(
        applied_balance(&deposit(&mut e, "d1", 3, "BTC", "100000000000000000000")),
        max_amount()
    );
    assert_recorded_refusal(
        &mut e,
        mv(MovementOp::Deposit, "d2", 3, "BTC", "0.00000001"),
        RefusalCode::Overflow,
    );
    withdraw(&mut e, "w1", 3, "BTC", "1");
    // The recorded refusal sticks even though the deposit would fit now.
    let again = deposit(&mut e, "d2", 3, "BTC", "0.00000001");
    assert!(matches!(
        again.response,
        Response::Refused {
            code: RefusalCode::Overflow,
            duplicate: true,
            ..
        }
    ));
}

#[test]
fn duplicate_withdraw_returns_first_result_and_debits_once() {
    let mut e = engine();
    deposit(&mut e, "d1", 1, "USDT", "100");
    let first = withdraw(&mut e, "t1", 1, "USDT", "30");
    assert_eq!(
        first.response,
        Response::Applied {
            balance: d("70"),
            duplicate: false,
            seq: 2
        }
    );
    withdraw(&mut e, "t2", 1, "USDT", "5");
    let before = e.clone();
    // Same request, and an equal amount spelled differently.
    for amount in ["30", "30.000"] {
        let dup = withdraw(&mut e, "t1", 1, "USDT", amount);
        assert_eq!(
            dup.response,
            Response::Applied {
                balance: d("70"),
                duplicate: true,
                seq: 2
            }
        );
        assert!(dup.record.is_none());
    }
    assert_eq!(e, before);
    assert_eq!(balance(&e, 1, "USDT"), Some(d("65")));
}

#[test]
fn duplicate_deposit_credits_once() {
    let mut e = engine();
    let first = deposit(&mut e, "d1", 1, "ETH", "2.5");
    let dup = deposit(&mut e, "d1", 1, "ETH", "2.5");
    assert_eq!(
        dup.response,
        Response::Applied {
            balance: d("2.5"),
            duplicate: true,
            seq: 1
        }
    );
    assert!(matches!(
        first.response,
        Response::Applied {
            duplicate: false,
            ..
        }
    ));
    assert_eq!(balance(&e, 1, "ETH"), Some(d("2.5")));
    assert_eq!(e.last_seq(), 1);
}

#[test]
fn duplicate_refusal_is_returned_even_when_it_would_now_succeed() {
    let mut e = engine();
    deposit(&mut e, "d1", 1, "USDT", "5");
    let first = withdraw(&mut e, "w1", 1, "USDT", "10");
    assert_eq!(code(&first), Some(RefusalCode::InsufficientBalance));
    deposit(&mut e, "d2", 1, "USDT", "100");
    let dup = withdraw(&mut e, "w1", 1, "USDT", "10");
    assert_eq!(
        dup.response,
        Response::refused(RefusalCode::InsufficientBalance, true, Some(2))
    );
    assert!(dup.record.is_none());
    assert_eq!(balance(&e, 1, "USDT"), Some(d("105")));
}

#[test]
fn req_id_conflict_changes_nothing() {
    let mut e = engine();
    deposit(&mut e, "d0", 1, "USDT", "100");
    withdraw(&mut e, "t1", 1, "USDT", "10");
    let w = MovementOp::Withdraw;
    assert_unrecorded(
        &mut e,
        mv(w, "t1", 1, "USDT", "11"),
        RefusalCode::ReqIdConflict,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "t1", 2, "USDT", "10"),
        RefusalCode::ReqIdConflict,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "t1", 1, "BTC", "10"),
        RefusalCode::ReqIdConflict,
    );
    assert_unrecorded(
        &mut e,
        mv(w, "t1", 1, "USDT", "1e1"),
        RefusalCode::ReqIdConflict,
    );
    assert_unrecorded(
        &mut e,
        mv(MovementOp::Deposit, "d0", 2, "USDT", "100"),
        RefusalCode::ReqIdConflict,
    );
    assert_eq!(e.account(2, "USDT"), None);
    // Another op with the same req_id is a different key.
    assert!(matches!(
        refund(&mut e, "t1", 1, "USDT", "10").response,
        Response::Applied { .. }
    ));
}

#[test]
fn refund_rules() {
    let mut e = engine();
    deposit(&mut e, "d1", 1, "USDT", "100");
    // No withdraw at all.
    assert_recorded_refusal(
        &mut e,
        mv(MovementOp::Refund, "x1", 1, "USDT", "1"),
        RefusalCode::NoMatchingWithdraw,
    );
    // A refused withdraw cannot be refunded.
    withdraw(&mut e, "big", 1, "USDT", "1000");
    assert_recorded_refusal(
        &mut e,
        mv(MovementOp::Refund, "big", 1, "USDT", "1000"),
        RefusalCode::NoMatchingWithdraw,
    );
    // Mismatched user, asset or amount.
    withdraw(&mut e, "t1", 1, "USDT", "40");
    assert_recorded_refusal(
        &mut e,
        mv(MovementOp::Refund, "t2", 1, "USDT", "40"),
        RefusalCode::NoMatchingWithdraw,
    );
    let mut probe = e.clone();
    assert_recorded_refusal(
        &mut probe,
        mv(MovementOp::Refund, "t1", 1, "USDT", "39"),
        RefusalCode::NoMatchingWithdraw,
    );
    let mut probe = e.clone();
    assert_recorded_refusal(
        &mut probe,
        mv(MovementOp::Refund, "t1", 2, "USDT", "40"),
        RefusalCode::NoMatchingWithdraw,
    );
    let mut probe = e.clone();
    assert_recorded_refusal(
        &mut probe,
        mv(MovementOp::Refund, "t1", 1, "BTC", "40"),
        RefusalCode::NoMatchingWithdraw,
    );
    // A refund ignores account status.
    set_status(&mut e, 1, "USDT", AccountStatus::Disabled);
    let r = refund(&mut e, "t1", 1, "USDT", "40");
    assert!(matches!(
        r.response,
        Response::Applied {
            duplicate: false,
            ..
        }
    ));
    assert_eq!(applied_balance(&r), d("100"));
    // And it is idempotent: the second refund gives nothing more back.
    let dup = refund(&mut e, "t1", 1, "USDT", "40");
    assert!(matches!(
        dup.response,
        Response::Applied {
            duplicate: true,
            ..
        }
    ));
    assert_eq!(applied_balance(&dup), d("100"));
    assert_eq!(balance(&e, 1, "USDT"), Some(d("100")));
}

#[test]
fn lookup_reports_every_op_of_a_req_id() {
    let mut e = engine();
    deposit(&mut e, "d1", 7, "USDT", "20");
    withdraw(&mut e, "t1", 7, "USDT", "10.5");
    refund(&mut e, "t1", 7, "USDT", "10.5");
    withdraw(&mut e, "t2", 7, "USDT", "999");
    let Response::Ok { ops: Some(ops), .. } =
        e.apply(&Request::Lookup { req_id: id("t1") }).response
    else {
        panic!("lookup failed")
    };
    assert_eq!(ops.len(), 2);
    assert_eq!(
        (ops[0].op, ops[0].outcome, ops[0].seq, ops[0].amount),
        (MovementOp::Withdraw, Outcome::Applied, 2, d("10.5"))
    );
    assert_eq!(
        (ops[1].op, ops[1].outcome, ops[1].seq),
        (MovementOp::Refund, Outcome::Applied, 3)
    );
    let Response::Ok { ops: Some(ops), .. } =
        e.apply(&Request::Lookup { req_id: id("t2") }).response
    else {
        panic!("lookup failed")
    };
    assert_eq!(
        (ops[0].outcome, ops[0].code),
        (Outcome::Refused, Some(RefusalCode::InsufficientBalance))
    );
    let Response::Ok { ops: Some(ops), .. } = e
        .apply(&Request::Lookup {
            req_id: id("never"),
        })
        .response
    else {
        panic!("lookup failed")
    };
    assert!(ops.is_empty());
}

#[test]
fn balances_totals_and_journal() {
    let mut e = engine();
    deposit(&mut e, "a", 1, "USDT", "1.5");
    deposit(&mut e, "b", 1, "BTC", "2");
    deposit(&mut e, "c", 2, "USDT", "3.5");
    withdraw(&mut e, "d", 2, "USDT", "1");
    set_status(&mut e, 3, "ETH", AccountStatus::Frozen);
    let assets: Vec<_> = e.balances(1).into_iter().map(|b| b.asset).collect();
    assert_eq!(assets, vec!["BTC", "USDT"]);
    assert_eq!(e.balances(4), vec![]);
    assert_eq!(
        e.totals(),
        vec![
            TotalEntry {
                asset: "BTC".into(),
                sum: d("2")
            },
            TotalEntry {
                asset: "ETH".into(),
                sum: Decimal::ZERO
            },
            TotalEntry {
                asset: "USDT".into(),
                sum: d("4")
            },
        ]
    );
}

#[test]
fn replaying_the_records_rebuilds_the_same_engine() {
    let mut e = engine();
    let records: Vec<JournalRecord> = [
        deposit(&mut e, "a", 1, "USDT", "10"),
        withdraw(&mut e, "b", 1, "USDT", "4"),
        withdraw(&mut e, "c", 1, "USDT", "40"),
        refund(&mut e, "b", 1, "USDT", "4"),
        set_status(&mut e, 1, "USDT", AccountStatus::Frozen),
    ]
    .into_iter()
    .filter_map(|effect| effect.record)
    .collect();
    assert_eq!(records.len(), 5);
    let mut r = engine();
    for rec in records {
        r.apply_record(rec).unwrap();
    }
    assert_eq!(r, e);
}

#[test]
fn inconsistent_records_are_rejected() {
    let mut e = engine();
    let rec = deposit(&mut e, "a", 1, "USDT", "10").record.unwrap();
    let mut fresh = engine();
    // Gap in seq.
    let JournalRecord::Deposit(mut m) = rec.clone() else {
        unreachable!()
    };
    m.seq = 2;
    assert!(fresh
        .apply_record(JournalRecord::Deposit(m.clone()))
        .is_err());
    // Wrong balance.
    m.seq = 1;
    m.balance = Some(d("11"));
    assert!(fresh.apply_record(JournalRecord::Deposit(m)).is_err());
    // Withdraw more than there is.
    let JournalRecord::Deposit(m) = rec.clone() else {
        unreachable!()
    };
    assert!(fresh
        .apply_record(JournalRecord::Withdraw(MovementRecord {
            balance: Some(d("-10")),
            ..m
        }))
        .is_err());
    assert_eq!(fresh, engine());
    fresh.apply_record(rec.clone()).unwrap();
    // The same (req_id, op) twice.
    let JournalRecord::Deposit(mut m) = rec else {
        unreachable!()
    };
    m.seq = 2;
    m.balance = Some(d("20"));
    assert!(fresh.apply_record(JournalRecord::Deposit(m)).is_err());
}

fn cancel(
    e: &mut Engine,
    op: MovementOp,
    req_id: &str,
    user: u64,
    asset: &str,
    amount: &str,
) -> Effect {
    e.apply(&Request::Cancel {
        req_id: id(req_id),
        movement: op,
        user_id: user,
        asset: asset.into(),
        amount: amount.into(),
    })
}

fn single_op(effect: &Effect) -> LookupOp {
    match &effect.response {
        Response::Ok { ops: Some(ops), .. } if ops.len() == 1 => ops[0].clone(),
        other => panic!("expected one lookup entry, got {other:?}"),
    }
}

#[test]
fn cancel_records_a_refusal_that_every_later_copy_gets() {
    let mut e = engine();
    let mut records = vec![deposit(&mut e, "seed", 1, "USDT", "100").record.unwrap()];
    for op in [
        MovementOp::Withdraw,
        MovementOp::Deposit,
        MovementOp::Refund,
    ] {
        let req_id = format!("c-{}", op.as_str());
        let before = e.accounts.clone();
        let effect = cancel(&mut e, op, &req_id, 1, "USDT", "10.50");
        let rec = effect
            .record
            .clone()
            .expect("a cancel of nothing is recorded");
        records.push(rec.clone());
        let (rec_op, m) = rec.as_movement().unwrap();
        assert_eq!(rec_op, op);
        assert_eq!(
            (m.outcome, m.code, m.balance, m.amount),
            (
                Outcome::Refused,
                Some(RefusalCode::Cancelled),
                None,
                d("10.5")
            )
        );
        let entry = single_op(&effect);
        assert_eq!(
            entry,
            LookupOp {
                op,
                user_id: 1,
                asset: "USDT".into(),
                amount: d("10.5"),
                outcome: Outcome::Refused,
                code: Some(RefusalCode::Cancelled),
                seq: m.seq,
            }
        );
        assert_eq!(e.accounts, before);
        // A late copy of the movement gets the recorded refusal, not a fresh decision.
        let late = e.apply(&mv(op, &req_id, 1, "USDT", "10.5"));
        assert!(late.record.is_none());
        assert_eq!(
            late.response,
            Response::refused(RefusalCode::Cancelled, true, Some(m.seq))
        );
        assert_eq!(e.accounts, before);
        // Cancelling again reports the same record and records nothing.
        let again = cancel(&mut e, op, &req_id, 1, "USDT", "10.5");
        assert!(again.record.is_none());
        assert_eq!(single_op(&again), entry);
        // And lookup shows it.
        assert_eq!(
            single_op(&e.apply(&Request::Lookup {
                req_id: id(&req_id)
            })),
            entry
        );
    }
    // A cancelled withdraw was never applied, so there is nothing to refund.
    let refused = refund(&mut e, "c-withdraw", 1, "USDT", "10.5");
    assert_eq!(code(&refused), Some(RefusalCode::NoMatchingWithdraw));
    records.push(refused.record.unwrap());
    assert_eq!(balance(&e, 1, "USDT"), Some(d("100")));
    let mut r = engine();
    for rec in records {
        r.apply_record(rec).unwrap();
    }
    assert_eq!(r, e);
}

#[test]
fn cancel_of_a_recorded_movement_reports_it_unchanged() {
    let mut e = engine();
    deposit(&mut e, "d", 1, "USDT", "100");
    withdraw(&mut e, "w", 1, "USDT", "30");
    withdraw(&mut e, "poor", 1, "USDT", "1000");
    let state = e.clone();
    let applied = single_op(&cancel(&mut e, MovementOp::Withdraw, "w", 1, "USDT", "30"));
    assert_eq!(
        (applied.outcome, applied.code, applied.seq),
        (Outcome::Applied, None, 2)
    );
    let refused = single_op(&cancel(
        &mut e,
        MovementOp::Withdraw,
        "poor",
        1,
        "USDT",
        "1000",
    ));
    assert_eq!(
        (refused.outcome, refused.code, refused.seq),
        (Outcome::Refused, Some(RefusalCode::InsufficientBalance), 3)
    );
    // Other details: the record is reported as it is, for the caller to compare.
    let other = cancel(&mut e, MovementOp::Withdraw, "w", 2, "BTC", "1");
    assert!(other.record.is_none());
    let other = single_op(&other);
    assert_eq!(
        (other.user_id, other.asset.as_str(), other.amount),
        (1, "USDT", d("30"))
    );
    assert_eq!(e, state);
    // The withdraw stays refundable: cancel settled only (w, withdraw).
    assert_eq!(
        applied_balance(&refund(&mut e, "w", 1, "USDT", "30")),
        d("100")
    );
}

#[test]
fn invalid_cancels_are_refused_and_not_recorded() {
    let mut e = engine();
    let w = MovementOp::Withdraw;
    for (req_id, user, asset, amount, expected) in [
        ("", 1, "USDT", "1", RefusalCode::InvalidReqId),
        ("a b", 1, "USDT", "1", RefusalCode::InvalidReqId),
        ("ok", 0, "USDT", "1", RefusalCode::InvalidUserId),
        ("ok", 1, "DOGE", "1", RefusalCode::InvalidAsset),
        ("ok", 1, "USDT", "0", RefusalCode::InvalidAmount),
        ("ok", 1, "USDT", "1e3", RefusalCode::InvalidAmount),
        (
            "ok",
            1,
            "USDT",
            "0.000000001",
            RefusalCode::PrecisionOverflow,
        ),
        (
            "ok",
            1,
            "USDT",
            "100000000000000000001",
            RefusalCode::Overflow,
        ),
    ] {
        let req = Request::Cancel {
            req_id: id(req_id),
            movement: w,
            user_id: user,
            asset: asset.into(),
            amount: amount.into(),
        };
        assert_unrecorded(&mut e, req, expected);
    }
}

fn key_at(ms: u64, n: u128) -> String {
    ulid::format(ulid::from_parts(ms, n))
}

fn dep(e: &mut Engine, req_id: &str, amount: &str, now: u64) -> Effect {
    e.apply_at(
        &Request::Deposit(MovementRequest {
            req_id: req_id.into(),
            user_id: 1,
            asset: "USDT".into(),
            amount: amount.into(),
            trace: None,
        }),
        now,
    )
}

fn horizon(e: &mut Engine, before_ms: u64, now: u64) -> Effect {
    e.apply_at(&Request::AdvanceHorizon { before_ms }, now)
}

fn core(effect: &Effect) -> CoreStatus {
    match &effect.response {
        Response::Ok { core: Some(c), .. } => c.clone(),
        other => panic!("expected ok with core, got {other:?}"),
    }
}

#[test]
fn a_req_id_too_far_in_the_future_is_invalid() {
    let mut e = engine();
    let now = T0;
    let ok = key_at(now + MAX_REQ_ID_FUTURE_MS, 1);
    let late = key_at(now + MAX_REQ_ID_FUTURE_MS + 1, 2);
    assert!(matches!(
        dep(&mut e, &ok, "1", now).response,
        Response::Applied { .. }
    ));
    let before = e.clone();
    let r = dep(&mut e, &late, "1", now);
    assert_eq!(code(&r), Some(RefusalCode::InvalidReqId));
    assert!(r.record.is_none());
    assert_eq!(e, before);
    let r = e.apply_at(&Request::Lookup { req_id: late }, now);
    assert_eq!(code(&r), Some(RefusalCode::InvalidReqId));
}

#[test]
fn the_horizon_forgets_older_keys_and_refuses_them_for_good() {
    let mut e = engine();
    let now = T0 + 10_000;
    let old = key_at(T0 + 999, 7);
    let edge = key_at(T0 + 1000, 0);
    let young = key_at(T0 + 5000, 3);
    for k in [&old, &edge, &young] {
        assert!(matches!(
            dep(&mut e, k, "1", now).response,
            Response::Applied { .. }
        ));
    }
    assert_eq!(e.remembered(), 3);
    let h = horizon(&mut e, T0 + 1000, now);
    let rec = h.record.clone().expect("a forward horizon is recorded");
    assert_eq!(
        rec,
        JournalRecord::Horizon(HorizonRecord {
            seq: 4,
            before_ms: T0 + 1000
        })
    );
    let c = core(&h);
    assert_eq!((c.horizon_ms, c.remembered, c.last_seq), (T0 + 1000, 2, 4));
    // The forgotten key: a retry is refused, not applied again; memory does not grow.
    let before = e.clone();
    let retry = dep(&mut e, &old, "1", now);
    assert_eq!(
        retry.response,
        Response::refused(RefusalCode::ReqIdExpired, false, None)
    );
    assert!(retry.record.is_none());
    let cancel = e.apply_at(
        &Request::Cancel {
            req_id: old.clone(),
            movement: MovementOp::Deposit,
            user_id: 1,
            asset: "USDT".into(),
            amount: "1".into(),
        },
        now,
    );
    assert_eq!(code(&cancel), Some(RefusalCode::ReqIdExpired));
    assert!(cancel.record.is_none());
    // lookup never answers "not seen" for it.
    let lookup = e.apply_at(
        &Request::Lookup {
            req_id: old.clone(),
        },
        now,
    );
    assert_eq!(code(&lookup), Some(RefusalCode::ReqIdExpired));
    assert_eq!(e, before);
    assert_eq!(balance(&e, 1, "USDT"), Some(d("3")));
    // The key exactly at the horizon is kept: a duplicate is still answered verbatim.
    let dup = dep(&mut e, &edge, "1", now);
    assert!(matches!(
        dup.response,
        Response::Applied {
            duplicate: true,
            seq: 2,
            ..
        }
    ));
    // A repeated or older horizon changes nothing and records nothing.
    for before_ms in [T0 + 1000, T0 + 10, 0] {
        let same = horizon(&mut e, before_ms, now);
        assert!(same.record.is_none());
        assert_eq!(core(&same).horizon_ms, T0 + 1000);
    }
    assert_eq!(e, before);
    // A horizon in the future of spot-core's clock is a bad request.
    let future = horizon(&mut e, now + 1, now);
    assert!(matches!(future.response, Response::Error { .. }));
    assert!(future.record.is_none());
    assert_eq!(e, before);
}

#[test]
fn retain_moves_forward_only() {
    let mut e = engine();
    deposit(&mut e, "a", 1, "USDT", "1");
    deposit(&mut e, "b", 1, "USDT", "1");
    let r = e.apply(&Request::Retain { after_seq: 3 });
    assert!(matches!(r.response, Response::Error { .. }));
    let r = e.apply(&Request::Retain { after_seq: 2 });
    assert_eq!(
        r.record,
        Some(JournalRecord::Retain(RetainRecord {
            seq: 3,
            after_seq: 2
        }))
    );
    assert_eq!(core(&r).retain_after, 2);
    for after_seq in [2, 1, 0] {
        let again = e.apply(&Request::Retain { after_seq });
        assert!(again.record.is_none());
        assert_eq!(core(&again).retain_after, 2);
    }
    let s = core(&e.apply(&Request::Status {}));
    assert_eq!((s.last_seq, s.remembered, s.accounts), (3, 2, 1));
}

#[test]
fn replay_refuses_a_horizon_or_retain_moving_backwards_and_keys_below_the_horizon() {
    let now = T0 + 10_000;
    let mut e = engine();
    let k = key_at(T0 + 100, 1);
    let mut records = vec![dep(&mut e, &k, "1", now).record.unwrap()];
    records.push(horizon(&mut e, T0 + 500, now).record.unwrap());
    let mut r = engine();
    for rec in records.clone() {
        r.apply_record(rec).unwrap();
    }
    assert_eq!(r, e);
    assert_eq!(r.remembered(), 0);
    let bad = [
        JournalRecord::Horizon(HorizonRecord {
            seq: 3,
            before_ms: T0 + 500,
        }),
        JournalRecord::Horizon(HorizonRecord {
            seq: 3,
            before_ms: T0 + 1,
        }),
        JournalRecord::Retain(RetainRecord {
            seq: 3,
            after_seq: 3,
        }),
        // The key created before the horizon, recorded after it: impossible live.
        {
            let JournalRecord::Deposit(mut m) = records[0].clone() else {
                unreachable!()
            };
            m.seq = 3;
            m.balance = Some(d("2"));
            JournalRecord::Deposit(m)
        },
    ];
    for rec in bad {
        let mut probe = r.clone();
        assert!(probe.apply_record(rec.clone()).is_err(), "{rec:?}");
        assert_eq!(probe, r, "{rec:?} must change nothing");
    }
}

fn hello(map_version: Option<u64>) -> Request {
    Request::Hello {
        token: String::new(),
        cell: None,
        epoch: None,
        map_version,
    }
}

/// A hello's map version (ADR 0023 §1): a higher one than any seen is recorded before the `ok`,
/// an equal one and none are `ok` with nothing recorded, a lower one is refused `STALE_MAP`
/// naming both versions; `status` reports the highest.
#[test]
fn a_hello_records_a_higher_map_version_and_refuses_a_lower_one() {
    let mut e = engine();
    assert_eq!(e.map_version(), 0);
    let absent = e.apply(&hello(None));
    assert_eq!((absent.response, absent.record), (Response::ok(), None));

    let higher = e.apply(&hello(Some(2)));
    assert_eq!(higher.response, Response::ok());
    let record = JournalRecord::MapVersion(MapVersionRecord { seq: 1, version: 2 });
    assert_eq!(higher.record, Some(record));
    assert_eq!((e.map_version(), e.last_seq()), (2, 1));

    let equal = e.apply(&hello(Some(2)));
    assert_eq!((equal.response, equal.record), (Response::ok(), None));

    let lower = e.apply(&hello(Some(1)));
    assert_eq!(lower.record, None);
    let Response::Error { code, message } = lower.response else {
        panic!("a refusal: {:?}", lower.response);
    };
    assert_eq!(code, crate::protocol::ErrorCode::StaleMap);
    assert_eq!(
        message,
        "this client routes by map version 1; this spot-core has seen version 2: reload the map"
    );
    // A hello without a version stays accepted, whatever the engine has seen.
    assert_eq!(e.apply(&hello(None)).response, Response::ok());
    assert_eq!(e.map_version(), 2);
    assert_eq!(e.last_seq(), 1);
    let Response::Ok {
        core: Some(core), ..
    } = e.apply(&Request::Status {}).response
    else {
        panic!("a status");
    };
    assert_eq!(core.map_version, 2);
}

/// The record is replayed like any other (the map version is rebuilt, in seq order with the
/// movements around it), and a replayed version that does not move forward is refused.
#[test]
fn replay_rebuilds_the_map_version_and_refuses_one_going_backwards() {
    let mut e = engine();
    let mut records = Vec::new();
    let mut keep = |effect: Effect| records.extend(effect.record);
    keep(deposit(&mut e, "a", 1, "USDT", "5"));
    keep(e.apply(&hello(Some(3))));
    keep(withdraw(&mut e, "a", 1, "USDT", "2"));
    keep(e.apply(&hello(Some(4))));
    assert_eq!(records.len(), 4);
    assert!(matches!(
        records[1],
        JournalRecord::MapVersion(MapVersionRecord { seq: 2, version: 3 })
    ));
    let mut r = engine();
    for rec in records {
        r.apply_record(rec).unwrap();
    }
    assert_eq!(r, e);
    assert_eq!(r.map_version(), 4);
    for version in [4, 2] {
        let backwards = JournalRecord::MapVersion(MapVersionRecord {
            seq: r.last_seq() + 1,
            version,
        });
        let err = r.apply_record(backwards).unwrap_err();
        assert!(err.reason.contains("does not move forward"), "{err}");
    }
    assert_eq!(r.map_version(), 4);
    // Its JSON, as the WAL and `journal` carry it.
    let json = serde_json::to_string(&JournalRecord::MapVersion(MapVersionRecord {
        seq: 9,
        version: 7,
    }))
    .unwrap();
    assert_eq!(json, r#"{"op":"map_version","seq":9,"version":7}"#);
}
