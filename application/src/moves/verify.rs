//! The check before the switch (ADR 0023 §4, `Verifying`): the switch may name the target only
//! when the target holds exactly what the source held. Pure: the books are read by the runner.

use std::collections::{BTreeMap, BTreeSet};

use cells::CellId;
use domain::UserId;
use rust_decimal::Decimal;

use super::ports::PartitionBook;

/// One difference the check found: the move is cancelled with it as the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    Funding {
        user: UserId,
        asset: String,
        source: Decimal,
        target: Decimal,
    },
    InFlight {
        user: UserId,
        asset: String,
        source: Decimal,
        target: Decimal,
    },
    History {
        user: UserId,
    },
    Spot {
        user: UserId,
        asset: String,
        moved_out: Decimal,
        target: Decimal,
    },
    /// The source's engine still holds SPOT money of the partition after its move-out.
    SpotLeftBehind {
        user: UserId,
        asset: String,
        amount: Decimal,
    },
    /// A cell's conservation check is not exact.
    Conservation {
        cell: CellId,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Funding {
                user,
                asset,
                source,
                target,
            } => {
                write!(
                    f,
                    "FUNDING {user} {asset}: source {source}, target {target}"
                )
            }
            Self::InFlight {
                user,
                asset,
                source,
                target,
            } => {
                write!(
                    f,
                    "in flight {user} {asset}: source {source}, target {target}"
                )
            }
            Self::History { user } => write!(f, "history of {user} differs"),
            Self::Spot {
                user,
                asset,
                moved_out,
                target,
            } => {
                write!(
                    f,
                    "SPOT {user} {asset}: moved out {moved_out}, target {target}"
                )
            }
            Self::SpotLeftBehind {
                user,
                asset,
                amount,
            } => {
                write!(f, "SPOT {user} {asset}: {amount} left in the source")
            }
            Self::Conservation { cell } => write!(f, "cell {cell}'s conservation is not exact"),
        }
    }
}

type Amounts = BTreeMap<(UserId, String), Decimal>;

/// Every difference between the source's and the target's books of the partition, and between
/// the SPOT balances moved out and those the target's engine holds; empty when they agree. A
/// zero amount and an absent one are the same (an account opened and emptied, or never opened).
pub fn verify(
    source: &PartitionBook,
    target: &PartitionBook,
    moved_out: &Amounts,
    target_spot: &Amounts,
    source_spot: &Amounts,
) -> Vec<Mismatch> {
    let mut found = Vec::new();
    for ((user, asset), (a, b)) in pairs(&source.funding, &target.funding) {
        found.push(Mismatch::Funding {
            user,
            asset,
            source: a,
            target: b,
        });
    }
    for ((user, asset), (a, b)) in pairs(&source.in_flight, &target.in_flight) {
        found.push(Mismatch::InFlight {
            user,
            asset,
            source: a,
            target: b,
        });
    }
    for ((user, asset), (a, b)) in pairs(moved_out, target_spot) {
        found.push(Mismatch::Spot {
            user,
            asset,
            moved_out: a,
            target: b,
        });
    }
    for ((user, asset), amount) in source_spot {
        if !amount.is_zero() {
            found.push(Mismatch::SpotLeftBehind {
                user: *user,
                asset: asset.clone(),
                amount: *amount,
            });
        }
    }
    let users: BTreeSet<&UserId> = source.history.keys().chain(target.history.keys()).collect();
    for user in users {
        if source.history.get(user) != target.history.get(user) {
            found.push(Mismatch::History { user: *user });
        }
    }
    found
}

/// The keys where `a` and `b` differ, with both amounts (absent is zero).
fn pairs(a: &Amounts, b: &Amounts) -> Vec<((UserId, String), (Decimal, Decimal))> {
    let keys: BTreeSet<_> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter_map(|key| {
            let x = a.get(key).copied().unwrap_or_default();
            let y = b.get(key).copied().unwrap_or_default();
            (x != y).then(|| (key.clone(), (x, y)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(n: u64) -> UserId {
        UserId::new(n).unwrap()
    }

    fn amounts(rows: &[(u64, &str, i64)]) -> Amounts {
        rows.iter()
            .map(|(u, a, v)| ((user(*u), a.to_string()), Decimal::from(*v)))
            .collect()
    }

    #[test]
    fn equal_books_pass_and_zero_is_absent() {
        let source = PartitionBook {
            funding: amounts(&[(1, "USDT", 5), (2, "BTC", 0)]),
            history: [(user(1), "h1".to_owned())].into(),
            ..PartitionBook::default()
        };
        let mut target = source.clone();
        target.funding = amounts(&[(1, "USDT", 5)]);
        let spot = amounts(&[(1, "USDT", 3)]);
        assert!(verify(&source, &target, &spot, &spot, &amounts(&[(1, "USDT", 0)])).is_empty());
    }

    #[test]
    fn each_difference_is_named() {
        let source = PartitionBook {
            funding: amounts(&[(1, "USDT", 5)]),
            in_flight: amounts(&[(1, "USDT", 2)]),
            history: [(user(1), "a".to_owned())].into(),
        };
        let target = PartitionBook {
            funding: amounts(&[(1, "USDT", 4)]),
            history: [(user(1), "b".to_owned())].into(),
            ..PartitionBook::default()
        };
        let found = verify(
            &source,
            &target,
            &amounts(&[(1, "BTC", 1)]),
            &amounts(&[]),
            &amounts(&[(2, "BTC", 1)]),
        );
        assert_eq!(found.len(), 5, "{found:?}");
        assert!(found
            .iter()
            .any(|m| m.to_string() == "history of 1 differs"));
    }
}
