//! The checks at quiescence (faults off, recovery run): every transfer terminal or held for an
//! operator with an alert; exact conservation per user and asset (FUNDING + SPOT + in flight =
//! deposits); each transfer's records in both systems agreeing with its final state; one
//! transfer per client key, and every answer to a key naming it; every transfer charged to its
//! user's daily limits. The checks after every event
//! are in `world.rs` (`check_append`, `check_arrival`, `count_applied`, `track_call`).

use std::collections::BTreeMap;

use domain::{Operation, TransferState};
use rust_decimal::Decimal;

use crate::world::{made, Made, System, World};

/// Runs every quiescence check, recording each failure as a violation.
// long: the quiescence checks in the order, one block each, so each reads against its rule.
pub fn at_quiescence(w: &mut World) {
    let mut in_flight: BTreeMap<(u64, String), Decimal> = BTreeMap::new();
    // Each transfer: its id, creation, state, and whether it is held with an alert.
    let transfers: Vec<(String, Made, TransferState, bool)> = {
        let rows = w.rows.lock();
        rows.streams
            .iter()
            .filter_map(|(id, s)| {
                let held = rows.retries.get(id).is_some_and(|r| r.refund_alerted);
                Some((id.to_string(), made(s)?, s.state()?, held))
            })
            .collect()
    };
    for (id, t, state, held) in &transfers {
        let state = *state;
        if !state.is_terminal() {
            let held = *held;
            if !held {
                w.violation(format!(
                    "transfer {id} still {state} at quiescence, with no alert"
                ));
            }
        }
        if state.is_in_flight() {
            *in_flight.entry((t.user, t.asset.clone())).or_default() += t.amount;
        }
        let (src, dst) = (System::of(t.from), System::of(t.to));
        let withdrawn = w.recorded_applied(src, id, Operation::Withdraw);
        let deposited = w.recorded_applied(dst, id, Operation::Deposit);
        let refunded = w.recorded_applied(src, id, Operation::Refund);
        let expected = match state {
            TransferState::Committed => Some((true, true, false)),
            TransferState::RolledBack => Some((true, false, true)),
            TransferState::Failed => Some((false, false, false)),
            _ => None,
        };
        if let Some(expected) = expected {
            let actual = (withdrawn, deposited, refunded);
            if actual != expected {
                w.violation(format!(
                    "transfer {id} is {state} but the systems applied (withdraw, deposit, refund) = {actual:?}"
                ));
            }
        }
    }
    // Conservation, per user and asset.
    let keys: Vec<(u64, String)> = w.deposits.keys().cloned().collect();
    for (user, asset) in keys {
        let funding = w
            .funding_account(user, &asset)
            .map_or(Decimal::ZERO, |a| a.balance);
        let spot = w
            .engine
            .account(user, &asset)
            .map_or(Decimal::ZERO, |(available, _)| available);
        let flying = in_flight
            .get(&(user, asset.clone()))
            .copied()
            .unwrap_or_default();
        let deposits = w
            .deposits
            .get(&(user, asset.clone()))
            .copied()
            .unwrap_or_default();
        if funding + spot + flying != deposits {
            w.violation(format!(
                "conservation: user {user} {asset}: FUNDING {funding} + SPOT {spot} + in flight {flying} != deposits {deposits}"
            ));
        }
    }
    // Daily charges (ADR 0022): every created transfer was charged (a count of each user's
    // charges at least their transfers; more only where a creation's outcome was unknown and
    // the charge was kept, the safe side).
    let mut created: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, t, _, _) in &transfers {
        *created.entry(t.user).or_default() += 1;
    }
    let charged: BTreeMap<u64, u64> = {
        let rows = w.rows.lock();
        let mut charged = BTreeMap::new();
        for usage in rows.daily.values() {
            for (user, n) in &usage.counts {
                *charged.entry(user.get()).or_default() += n;
            }
        }
        charged
    };
    for (user, made) in created {
        let counted = charged.get(&user).copied().unwrap_or(0);
        if counted < made {
            w.violation(format!(
                "daily limits: user {user} created {made} transfers but was charged for {counted}"
            ));
        }
    }
    // Client keys: one transfer each, and every answer named it.
    let mut by_key: BTreeMap<(u64, String), Vec<String>> = BTreeMap::new();
    for (id, t, _, _) in &transfers {
        if let Some(cid) = &t.cid {
            by_key
                .entry((t.user, cid.clone()))
                .or_default()
                .push(id.clone());
        }
    }
    for ((user, cid), ids) in &by_key {
        if ids.len() > 1 {
            w.violation(format!(
                "client key {cid} of user {user} holds {} transfers: {ids:?}",
                ids.len()
            ));
        }
    }
    let answers: Vec<((u64, String), Vec<String>)> = w
        .answers
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().cloned().collect()))
        .collect();
    for ((user, cid), answered) in answers {
        let created = by_key
            .get(&(user, cid.clone()))
            .cloned()
            .unwrap_or_default();
        if answered.len() > 1 || answered.iter().any(|a| !created.contains(a)) {
            w.violation(format!(
                "client key {cid} of user {user} was answered with {answered:?}, created {created:?}"
            ));
        }
    }
}
