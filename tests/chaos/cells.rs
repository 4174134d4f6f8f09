//! The chaos run over several cells (`--cells N`, ADR 0017): the map naming each cell's database
//! and spot-core (the 256 partitions cut into N even ranges), the cell a user lands in under it
//! (before any move), and the
//! total of the per-cell end checks. Each cell's figures are checked on their own (its database,
//! its spot-core, the transfers of its users); the total adds them, so a cell that created money
//! and another that lost as much both show, never cancelling out.

use std::fmt;

use serde_json::json;

use super::Report;

/// The partitions of the cell at `index` (0-based) of `cells`: an inclusive range.
fn range(index: usize, cells: usize) -> (usize, usize) {
    let p = usize::from(cells::PARTITIONS);
    (index * p / cells, (index + 1) * p / cells - 1)
}

/// The map file's JSON: cell `i + 1` at `dbs[i]` and `spots[i]`, owning its range.
pub(super) fn map_json(dbs: &[String], spots: &[&str]) -> String {
    let cells: Vec<serde_json::Value> = dbs
        .iter()
        .zip(spots)
        .enumerate()
        .map(|(i, (db, spot))| {
            let (lo, hi) = range(i, dbs.len());
            json!({"id": i + 1, "database_url": db, "spot": spot,
                   "partitions": [format!("{lo}-{hi}")]})
        })
        .collect();
    json!({"partitions": cells::PARTITIONS, "cells": cells}).to_string()
}

/// The index (0-based, cell id minus one) of the cell `user` lands in among `cells` under the
/// map file (version 1): where the run seeds it. The end check places users by the map the
/// cells hold at the end instead (`moves::StoredMap`), after the run's partition moves.
pub(super) fn cell_index(user: u64, cells: usize) -> usize {
    if cells <= 1 {
        return 0;
    }
    let user = domain::UserId::new(user).expect("a user id");
    let p = usize::from(cells::partition_of(user).get());
    (0..cells)
        .find(|&i| p <= range(i, cells).1)
        .unwrap_or(cells - 1)
}

/// The whole run's figures from each cell's: counts and money added (created and lost each on
/// its own), the feed dense only when every cell's is, each cell's problems named with it.
pub(super) fn total(cells: Vec<(u16, Report)>) -> Report {
    let mut t = Report {
        feed_dense: true,
        ..Report::default()
    };
    for (cell, r) in &cells {
        t.transfers += r.transfers;
        t.spot_crashes += r.spot_crashes;
        t.pg_restarts += r.pg_restarts;
        t.answered_lost += r.answered_lost;
        for (state, n) in &r.states {
            *t.states.entry(state.clone()).or_insert(0) += n;
        }
        t.created += r.created;
        t.lost += r.lost;
        t.duplicates += r.duplicates;
        t.mismatched += r.mismatched;
        t.stuck += r.stuck;
        t.resumed += r.resumed;
        t.journal_records += r.journal_records;
        t.feed_events += r.feed_events;
        t.feed_dense &= r.feed_dense;
        t.deposits += r.deposits;
        t.archived_segments += r.archived_segments;
        t.problems
            .extend(r.problems.iter().map(|p| format!("cell {cell}: {p}")));
    }
    t.cells = cells;
    t
}

/// One line per cell: what that cell's own end check found.
pub(super) struct PerCell<'a>(pub &'a [(u16, Report)]);

impl fmt::Display for PerCell<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (cell, r) in self.0 {
            let states: Vec<String> = r.states.iter().map(|(s, n)| format!("{s} {n}")).collect();
            writeln!(
                f,
                "cell {cell}: {} transfers ({}), spot-core crashes {}, PostgreSQL restarts {}, \
                 failovers {}, network faults {}, created {}, lost {}, \
                 duplicates {}, disagreeing {}, stuck {}, answers lost {}, resumed {}, \
                 feed {} events {}, journal {} records from seq 1, {} segments archived{}, {}",
                r.transfers,
                states.join(", "),
                r.spot_crashes,
                r.pg_restarts,
                r.failovers.len(),
                r.net_faults.len(),
                r.created,
                r.lost,
                r.duplicates,
                r.mismatched,
                r.stuck,
                r.answered_lost,
                r.resumed,
                r.feed_events,
                if r.feed_dense { "dense" } else { "NOT dense" },
                r.journal_records,
                r.archived_segments,
                match &r.core {
                    Some(c) => format!(
                        ", snapshot_seq {}, horizon_ms {}",
                        c.snapshot_seq, c.horizon_ms
                    ),
                    None => String::new(),
                },
                if r.clean() { "clean" } else { "NOT CLEAN" }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranges_cover_every_partition_once_and_users_land_by_the_partition() {
        assert_eq!(
            (0..3).map(|i| range(i, 3)).collect::<Vec<_>>(),
            vec![(0, 84), (85, 169), (170, 255)]
        );
        // The ADR's vectors: user 1 is partition 225, user 5 is 43, user 3 is 139.
        assert_eq!(cell_index(1, 3), 2);
        assert_eq!(cell_index(5, 3), 0);
        assert_eq!(cell_index(3, 3), 1);
        assert_eq!(cell_index(1, 1), 0);
        let map = map_json(
            &["a".into(), "b".into(), "c".into()],
            &["x:1", "y:2", "z:3"],
        );
        let parsed = cells::CellMap::parse(&map, cells::MapFormat::Json).expect("a valid map");
        assert_eq!(parsed.cells().len(), 3);
    }
}
