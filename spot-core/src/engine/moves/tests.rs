//! A partition's move: out of one engine, into another, retried, replayed, snapshotted, back.

use std::str::FromStr;

use rust_decimal::Decimal;

use super::super::{Effect, Engine};
use crate::assets::Assets;
use crate::partition::partition_of;
use crate::protocol::{
    AccountStatus, ErrorCode, JournalRecord, MoveAnswer, MoveKind, MovePayload, MovementOp,
    MovementRequest, Request, Response, TotalEntry,
};
use crate::snapshot::{self, WalPosition};
use crate::ulid;

const P: u8 = 7;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

fn engine() -> Engine {
    Engine::new(Assets::builtin())
}

/// The first `n` users of partition `p`.
fn users_of(p: u8, n: usize) -> Vec<u64> {
    (1u64..).filter(|u| partition_of(*u) == p).take(n).collect()
}

/// A user of another partition than `P`.
fn other_user() -> u64 {
    (1u64..).find(|u| partition_of(*u) != P).unwrap()
}

/// The req_id numbered `n`, created at a fixed time.
fn req_id(n: u64) -> String {
    ulid::format(ulid::from_parts(1_700_000_000_000, u128::from(n)))
}

fn mv(op: MovementOp, n: u64, user: u64, asset: &str, amount: &str) -> Request {
    let body = MovementRequest {
        req_id: req_id(n),
        user_id: user,
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

fn move_out(e: &mut Engine, move_id: &str, partition: u8) -> Effect {
    e.apply(&Request::MoveOut {
        move_id: move_id.into(),
        partition,
    })
}

fn move_in(e: &mut Engine, move_id: &str, partition: u8, payload: &MovePayload) -> Effect {
    e.apply(&Request::MoveIn {
        move_id: move_id.into(),
        partition,
        payload: payload.clone(),
    })
}

fn answer(effect: &Effect) -> MoveAnswer {
    match &effect.response {
        Response::Ok {
            moves: Some(moves), ..
        } if moves.len() == 1 => moves[0].clone(),
        other => panic!("one move, got {other:?}"),
    }
}

fn error_code(effect: &Effect) -> Option<ErrorCode> {
    match &effect.response {
        Response::Error { code, .. } => Some(*code),
        _ => None,
    }
}

fn total(totals: &[TotalEntry], asset: &str) -> Decimal {
    totals
        .iter()
        .find(|t| t.asset == asset)
        .map_or(Decimal::ZERO, |t| t.sum)
}

/// An engine holding, for P's users and one user of another partition, deposits, a withdraw,
/// a refusal and a frozen account; every record kept.
fn source(records: &mut Vec<JournalRecord>) -> (Engine, Vec<u64>) {
    let mut e = engine();
    let users = users_of(P, 3);
    let mut keep = |effect: Effect| records.extend(effect.record);
    for (i, u) in users.iter().chain([&other_user()]).enumerate() {
        let i = i as u64;
        keep(e.apply(&mv(MovementOp::Deposit, 10 + i, *u, "USDT", "100.5")));
        keep(e.apply(&mv(MovementOp::Deposit, 20 + i, *u, "BTC", "0.25")));
        keep(e.apply(&mv(MovementOp::Withdraw, 30 + i, *u, "USDT", "0.5")));
        keep(e.apply(&mv(MovementOp::Withdraw, 40 + i, *u, "ETH", "1")));
    }
    keep(e.apply(&Request::SetStatus {
        user_id: users[1],
        asset: "BTC".into(),
        status: AccountStatus::Frozen,
    }));
    (e, users)
}

#[test]
fn a_moved_partition_keeps_every_balance_and_record_and_the_totals_across_both_engines() {
    let mut records = Vec::new();
    let (mut src, users) = source(&mut records);
    let before = src.totals();
    let out = move_out(&mut src, "m-1", P);
    let record = out.record.clone().expect("a move_out is recorded");
    assert!(matches!(&record, JournalRecord::MoveOut(m) if m.seq == src.last_seq()));
    let a = answer(&out);
    assert_eq!(
        (a.kind, a.partition, a.accounts, a.records),
        (MoveKind::Out, P, 6, 12)
    );
    assert_eq!(total(&a.totals, "USDT"), d("300"));
    assert_eq!(total(&a.totals, "BTC"), d("0.75"));
    let payload = a.payload.clone().expect("a move_out answers the state");
    // The source holds none of it; the other user's accounts stay.
    for u in &users {
        assert!(src.balances(*u).is_empty(), "{u}");
    }
    assert_eq!(src.balances(other_user()).len(), 2);
    assert_eq!(src.moved_out(), vec![P]);
    for t in src.totals() {
        assert_eq!(t.sum, total(&before, &t.asset) - total(&a.totals, &t.asset));
    }

    let mut dst = engine();
    let inn = move_in(&mut dst, "m-1", P, &payload);
    assert!(matches!(&inn.record, Some(JournalRecord::MoveIn(m)) if m.seq == 1));
    let b = answer(&inn);
    assert_eq!(
        (b.kind, b.accounts, b.records, b.payload),
        (MoveKind::In, 6, 12, None)
    );
    assert_eq!(b.totals, a.totals);
    for u in &users {
        let ours = dst.balances(*u);
        assert_eq!(ours.len(), 2, "{u}");
        assert_eq!(ours[0].available, d("0.25"));
        assert_eq!(ours[1].available, d("100"));
    }
    assert_eq!(dst.balances(users[1])[0].status, AccountStatus::Frozen);
    // Across both engines the totals are exactly the ones before.
    for t in &before {
        assert_eq!(
            total(&src.totals(), &t.asset) + total(&dst.totals(), &t.asset),
            t.sum
        );
    }
    // The target answers the moved req_ids: a lookup, a duplicate, a refund's matching check.
    let look = dst.apply(&Request::Lookup { req_id: req_id(30) });
    let Response::Ok { ops: Some(ops), .. } = &look.response else {
        panic!("{look:?}");
    };
    assert_eq!(
        (ops.len(), ops[0].user_id, ops[0].amount),
        (1, users[0], d("0.5"))
    );
    let dup = dst.apply(&mv(MovementOp::Deposit, 10, users[0], "USDT", "100.5"));
    assert!(
        matches!(
            dup.response,
            Response::Applied {
                duplicate: true,
                ..
            }
        ),
        "{dup:?}"
    );
    let refund = dst.apply(&mv(MovementOp::Refund, 30, users[0], "USDT", "0.5"));
    assert!(matches!(
        refund.response,
        Response::Applied {
            duplicate: false,
            ..
        }
    ));
    let refused = dst.apply(&mv(MovementOp::Deposit, 40, users[0], "ETH", "1"));
    assert!(matches!(refused.response, Response::Applied { .. }));
}

#[test]
fn both_sides_are_idempotent_by_move_id_and_refuse_another_move_under_it() {
    let (mut src, _) = source(&mut Vec::new());
    let first = move_out(&mut src, "m-1", P);
    let state = src.clone();
    let again = move_out(&mut src, "m-1", P);
    assert_eq!(
        (again.response.clone(), again.record),
        (first.response.clone(), None)
    );
    assert_eq!(src, state);
    let looked = src.apply(&Request::MoveLookup {
        move_id: "m-1".into(),
    });
    assert_eq!(looked.response, first.response);
    let none = src.apply(&Request::MoveLookup {
        move_id: "m-2".into(),
    });
    assert!(matches!(none.response, Response::Ok { moves: Some(ref m), .. } if m.is_empty()));
    // Another move of the moved-out partition, the same id for another partition: refused.
    for (id, p) in [("m-2", P), ("m-1", P + 1)] {
        let refused = move_out(&mut src, id, p);
        assert_eq!(
            error_code(&refused),
            Some(ErrorCode::MoveRefused),
            "{id} {p}"
        );
        assert!(refused.record.is_none());
    }
    let bad = move_out(&mut src, "", P);
    assert_eq!(error_code(&bad), Some(ErrorCode::BadRequest));

    let payload = answer(&first).payload.unwrap();
    let mut dst = engine();
    let inn = move_in(&mut dst, "m-1", P, &payload);
    let state = dst.clone();
    let again = move_in(&mut dst, "m-1", P, &payload);
    assert_eq!((again.response, again.record), (inn.response, None));
    assert_eq!(dst, state);
    let mut other = payload.clone();
    other.accounts[0].available += Decimal::ONE;
    let refused = move_in(&mut dst, "m-1", P, &other);
    assert_eq!(error_code(&refused), Some(ErrorCode::MoveRefused));
    assert_eq!(dst, state);
}

#[test]
fn a_moved_out_partitions_users_are_answered_moved_and_the_others_served() {
    let (mut src, users) = source(&mut Vec::new());
    move_out(&mut src, "m-1", P);
    let u = users[0];
    let state = src.clone();
    let asks = [
        mv(MovementOp::Deposit, 90, u, "USDT", "1"),
        mv(MovementOp::Withdraw, 91, u, "USDT", "1"),
        // A retry of a movement recorded before the move: the target answers it now.
        mv(MovementOp::Deposit, 10, u, "USDT", "100.5"),
        mv(MovementOp::Refund, 30, u, "USDT", "0.5"),
        Request::Cancel {
            req_id: req_id(92),
            movement: MovementOp::Withdraw,
            user_id: u,
            asset: "USDT".into(),
            amount: "1".into(),
        },
        Request::SetStatus {
            user_id: u,
            asset: "USDT".into(),
            status: AccountStatus::Frozen,
        },
        Request::Balances { user_id: u },
        Request::Lookup { req_id: req_id(10) },
    ];
    for ask in asks {
        let effect = src.apply(&ask);
        assert_eq!(
            error_code(&effect),
            Some(ErrorCode::Moved),
            "{ask:?}: {effect:?}"
        );
        let Response::Error { message, .. } = &effect.response else {
            unreachable!()
        };
        assert!(message.contains("m-1") && message.contains(&format!("partition {P}")));
        assert!(effect.record.is_none());
    }
    assert_eq!(src, state);
    let other = src.apply(&mv(MovementOp::Deposit, 93, other_user(), "USDT", "1"));
    assert!(matches!(other.response, Response::Applied { .. }));
}

#[test]
fn a_move_in_of_another_partitions_user_or_past_the_maximum_is_refused() {
    let (mut src, _) = source(&mut Vec::new());
    let payload = answer(&move_out(&mut src, "m-1", P)).payload.unwrap();
    let mut dst = engine();
    let wrong = move_in(&mut dst, "m-1", P + 1, &payload);
    let Response::Error { code, message } = &wrong.response else {
        panic!("{wrong:?}");
    };
    assert_eq!(*code, ErrorCode::MoveRefused);
    assert!(message.contains(&format!("not {}", P + 1)), "{message}");

    // The target already holds 10^20 - 1 USDT of one of the users: the credit would overflow.
    let u = payload.accounts[0].user_id;
    let mut full = engine();
    let max = "99999999999999999999";
    let big = full.apply(&mv(
        MovementOp::Deposit,
        1,
        u,
        payload.accounts[1].asset.as_str(),
        max,
    ));
    assert!(matches!(big.response, Response::Applied { .. }), "{big:?}");
    let state = full.clone();
    let over = move_in(&mut full, "m-1", P, &payload);
    assert_eq!(error_code(&over), Some(ErrorCode::MoveRefused), "{over:?}");
    assert_eq!((full.clone(), over.record), (state, None));

    let mut unsorted = payload.clone();
    unsorted.accounts.swap(0, 1);
    let refused = move_in(&mut dst, "m-1", P, &unsorted);
    assert_eq!(error_code(&refused), Some(ErrorCode::MoveRefused));
    assert_eq!(dst.last_seq(), 0);
}

#[test]
fn replay_and_snapshots_keep_the_moved_out_mark_and_the_moves() {
    let mut records = Vec::new();
    let (mut src, users) = source(&mut records);
    let out = move_out(&mut src, "m-1", P);
    records.extend(out.record.clone());
    let after = src.apply(&mv(MovementOp::Deposit, 95, other_user(), "USDT", "3"));
    records.extend(after.record);

    let mut replayed = engine();
    for r in &records {
        replayed.apply_record(r.clone()).unwrap();
    }
    assert_eq!(replayed, src);
    let pos = WalPosition {
        segment: 1,
        offset: 0,
    };
    let bytes = snapshot::encode(&src, pos);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 3);
    let (mut decoded, _) = snapshot::decode(&bytes, Assets::builtin()).unwrap();
    assert_eq!(decoded, src);
    assert_eq!(snapshot::encode(&decoded, pos), bytes);
    for e in [&mut replayed, &mut decoded] {
        let moved = e.apply(&mv(MovementOp::Deposit, 96, users[2], "USDT", "1"));
        assert_eq!(error_code(&moved), Some(ErrorCode::Moved));
        assert_eq!(move_out(e, "m-1", P).response, out.response);
    }

    // A replayed move_out whose payload is not the state it took is refused.
    let JournalRecord::MoveOut(mut m) = out.record.unwrap() else {
        unreachable!()
    };
    let mut wrong = engine();
    for r in &records[..records.len() - 2] {
        wrong.apply_record(r.clone()).unwrap();
    }
    m.payload.accounts[0].available += Decimal::ONE;
    let err = wrong.apply_record(JournalRecord::MoveOut(m)).unwrap_err();
    assert!(err.reason.contains("not partition"), "{err}");

    // The target's snapshot and replay hold the move_in too.
    let payload = answer(&move_out(&mut engine(), "x", P)).payload.unwrap();
    assert!(payload.accounts.is_empty());
    let mut dst = engine();
    let payload = match &records[records.len() - 2] {
        JournalRecord::MoveOut(m) => m.payload.clone(),
        _ => unreachable!(),
    };
    let inn = move_in(&mut dst, "m-1", P, &payload);
    let mut again = engine();
    again.apply_record(inn.record.unwrap()).unwrap();
    assert_eq!(again, dst);
    let (decoded, _) = snapshot::decode(&snapshot::encode(&dst, pos), Assets::builtin()).unwrap();
    assert_eq!(decoded, dst);
}

#[test]
fn a_partition_moves_back_with_what_happened_while_it_was_away() {
    let (mut a, users) = source(&mut Vec::new());
    let before = a.totals();
    let there = answer(&move_out(&mut a, "m-1", P)).payload.unwrap();
    let mut b = engine();
    move_in(&mut b, "m-1", P, &there);
    let more = b.apply(&mv(MovementOp::Deposit, 97, users[0], "ETH", "2"));
    assert!(matches!(more.response, Response::Applied { .. }));
    let back = answer(&move_out(&mut b, "m-2", P)).payload.unwrap();
    assert_eq!(back.records.len(), there.records.len() + 1);
    let home = move_in(&mut a, "m-2", P, &back);
    assert_eq!(answer(&home).kind, MoveKind::In);
    assert!(a.moved_out().is_empty());
    assert_eq!(b.moved_out(), vec![P]);
    assert_eq!(a.balances(users[0]).len(), 3);
    for t in &before {
        let eth = if t.asset == "ETH" {
            d("2")
        } else {
            Decimal::ZERO
        };
        assert_eq!(total(&a.totals(), &t.asset), t.sum + eth);
        assert_eq!(total(&b.totals(), &t.asset), Decimal::ZERO);
    }
    // Served again here, and its old and new records answer.
    let w = a.apply(&mv(MovementOp::Withdraw, 98, users[0], "ETH", "1"));
    assert!(matches!(w.response, Response::Applied { .. }), "{w:?}");
    let dup = a.apply(&mv(MovementOp::Deposit, 97, users[0], "ETH", "2"));
    assert!(matches!(
        dup.response,
        Response::Applied {
            duplicate: true,
            ..
        }
    ));
    // And it can move out again.
    let third = move_out(&mut a, "m-3", P);
    assert_eq!(answer(&third).accounts, 7);
}
