//! `ledger cells plan` (ADR 0023): the partition moves that would even out a weight across the
//! cells of a map (users, or transfers of a recent window, per partition), computed and never
//! executed. Pure: the weights come from the cells' databases, read by the binary.
//!
//! The plan is greedy and deterministic: while the heaviest cell is heavier than the lightest,
//! it moves from the heaviest to the lightest the partition that brings the two closest
//! together, if one does (a partition as heavy as the gap or heavier would only swap which is
//! heavier, and is never moved). Each move is one partition, the unit ADR 0023 moves; ties go
//! to the lower partition and the lower cell id, so the same weights always give the same plan.

use std::collections::BTreeMap;

use crate::{CellId, CellMap, Partition};

/// One move the plan proposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    pub partition: Partition,
    pub from: CellId,
    pub to: CellId,
    /// The partition's weight (what moves with it).
    pub weight: u64,
}

/// The moves, and each cell's weight before and after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub moves: Vec<PlannedMove>,
    pub before: BTreeMap<CellId, u64>,
    pub after: BTreeMap<CellId, u64>,
}

/// The plan for `map` under `weights` (a partition absent weighs 0), at most `max_moves` moves.
pub fn plan(map: &CellMap, weights: &BTreeMap<Partition, u64>, max_moves: usize) -> Plan {
    let mut owner: BTreeMap<Partition, CellId> = map.assignments().collect();
    let mut loads: BTreeMap<CellId, u64> = map.cells().iter().map(|c| (c.id, 0)).collect();
    for (partition, cell) in &owner {
        *loads.entry(*cell).or_default() += weights.get(partition).copied().unwrap_or(0);
    }
    let before = loads.clone();
    let mut moves = Vec::new();
    while moves.len() < max_moves {
        let Some(step) = best_step(&owner, &loads, weights) else {
            break;
        };
        *loads.get_mut(&step.from).expect("a cell of the map") -= step.weight;
        *loads.get_mut(&step.to).expect("a cell of the map") += step.weight;
        owner.insert(step.partition, step.to);
        moves.push(step);
    }
    Plan {
        moves,
        before,
        after: loads,
    }
}

/// The move that brings the heaviest and the lightest cell closest, if any narrows their gap.
fn best_step(
    owner: &BTreeMap<Partition, CellId>,
    loads: &BTreeMap<CellId, u64>,
    weights: &BTreeMap<Partition, u64>,
) -> Option<PlannedMove> {
    // Heaviest: the highest load, ties to the lower id; lightest: the lowest, ties likewise.
    let (&heavy, &high) = loads
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
    let (&light, &low) = loads
        .iter()
        .min_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))?;
    let gap = high - low;
    owner
        .iter()
        .filter(|(_, cell)| **cell == heavy)
        .map(|(p, _)| (*p, weights.get(p).copied().unwrap_or(0)))
        .filter(|(_, w)| *w > 0 && *w < gap)
        // What is left of the gap after the move: |gap - 2w|, the smaller the better.
        .min_by_key(|(p, w)| (gap.abs_diff(2 * w), *p))
        .map(|(partition, weight)| PlannedMove {
            partition,
            from: heavy,
            to: light,
            weight,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MapFormat;

    fn map(cells: &[(u16, &str)]) -> CellMap {
        let cells: Vec<serde_json::Value> = cells
            .iter()
            .map(|(id, parts)| {
                serde_json::json!({
                    "id": id,
                    "database_url": format!("postgres://h/db{id}"),
                    "spot": format!("127.0.0.1:{}", 7400 + id),
                    "partitions": parts.split(' ').filter(|p| !p.is_empty()).collect::<Vec<_>>(),
                })
            })
            .collect();
        let text = serde_json::json!({ "partitions": 256, "cells": cells }).to_string();
        CellMap::parse(&text, MapFormat::Json).unwrap()
    }

    fn p(n: u64) -> Partition {
        Partition::new(n).unwrap()
    }

    fn cell(n: u64) -> CellId {
        CellId::new(n).unwrap()
    }

    #[test]
    fn an_empty_new_cell_takes_partitions_until_the_gap_cannot_narrow() {
        // Cell 1 owns everything; its users sit in four partitions; cell 2 is new and empty.
        let map = map(&[(1, "0-255"), (2, "")]);
        let weights = BTreeMap::from([(p(3), 40), (p(9), 30), (p(17), 20), (p(200), 10)]);
        let plan = plan(&map, &weights, 10);
        assert_eq!(plan.before[&cell(1)], 100);
        assert_eq!(plan.before[&cell(2)], 0);
        let moved: Vec<(u8, u64)> = plan
            .moves
            .iter()
            .map(|m| (m.partition.get(), m.weight))
            .collect();
        // Gap 100: the 40 leaves it at 20 (|100 - 80|), the closest; then gap 20: the 10 evens it.
        assert_eq!(moved, [(3, 40), (200, 10)]);
        assert_eq!(plan.after[&cell(1)], 50);
        assert_eq!(plan.after[&cell(2)], 50);
        assert!(plan
            .moves
            .iter()
            .all(|m| m.from == cell(1) && m.to == cell(2)));
    }

    #[test]
    fn an_even_map_or_a_partition_heavier_than_the_gap_moves_nothing() {
        let map = map(&[(1, "0-127"), (2, "128-255")]);
        let even = BTreeMap::from([(p(1), 10), (p(200), 10)]);
        assert!(plan(&map, &even, 10).moves.is_empty());
        // One hot partition: moving it would only make the other cell the heavy one.
        let hot = BTreeMap::from([(p(1), 90), (p(200), 10)]);
        assert!(plan(&map, &hot, 10).moves.is_empty());
    }

    #[test]
    fn the_plan_stops_at_its_most_moves_and_is_the_same_for_the_same_weights() {
        let map = map(&[(1, "0-255"), (2, ""), (3, "")]);
        let weights: BTreeMap<Partition, u64> = (0..256).map(|n| (p(n), 1)).collect();
        let first = plan(&map, &weights, 5);
        assert_eq!(first.moves.len(), 5);
        assert_eq!(first, plan(&map, &weights, 5));
        // Over enough moves, three even cells of 85-86 partitions each.
        let all = plan(&map, &weights, 1_000);
        let after: Vec<u64> = all.after.values().copied().collect();
        assert!(after.iter().all(|w| (85..=86).contains(w)), "{after:?}");
        assert_eq!(all.after.values().sum::<u64>(), 256);
    }
}
