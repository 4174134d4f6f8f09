//! The map's facts in the log (ADR 0023 §6): each cell's `PartitionMoved` and `CellAdded`
//! entries held to the rows they stand for, as `deposits` holds a deposit to its entry. In one
//! cell's log:
//!
//! - every move this cell recorded as `DONE` (`partition_moves`, kept by the source) has its
//!   `PartitionMoved` entry, naming the same partition and cells; an entry that names this cell
//!   as the source has its `DONE` record;
//! - every FUNDING total a switch wrote (`partition_switches`, which the conservation check
//!   counts as moved money) has the entry of its move, naming this cell on the matching side:
//!   money moved in or out behind the log's back is named;
//! - every cell added (`cell_cells`) has its `CellAdded` entry with the same map version, and
//!   every such entry its row;
//! - a map entry names this cell (`cell_identity`) as one of its ends.
//!
//! The entries are gathered while `verify` streams the log ([`MapFacts::see`]); the rows are read
//! in the same snapshot afterwards ([`MapFacts::check`]).

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::PgConnection;

use crate::finding::{finding, Finding};
use crate::LogError;

/// A `PartitionMoved` entry's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Moved {
    position: i64,
    partition: i64,
    from: i64,
    to: i64,
}

/// The map entries met so far.
#[derive(Debug, Default)]
pub(crate) struct MapFacts {
    /// By move id.
    moved: BTreeMap<String, Moved>,
    /// By cell id: (position, map version).
    added: BTreeMap<i64, (i64, i64)>,
}

impl MapFacts {
    /// Takes note of `entry` if it is a map fact; refuses one whose shape is not the ledger's.
    pub(crate) fn see(&mut self, entry: &tlog::Entry<'_>) -> Result<(), String> {
        let (kind, field) = match (entry.aggregate_type, entry.event_type) {
            ("Partition", "PartitionMoved") => ("PartitionMoved", "PartitionMoved"),
            ("Cell", "CellAdded") => ("CellAdded", "CellAdded"),
            ("Partition" | "Cell", _) | (_, "PartitionMoved" | "CellAdded") => {
                return Err(format!(
                    "a map entry is Partition:<move>:1 PartitionMoved or Cell:<cell>:1 \
                     CellAdded; this one is {}:{}:{} {}",
                    entry.aggregate_type, entry.aggregate_id, entry.sequence, entry.event_type
                ))
            }
            _ => return Ok(()),
        };
        if entry.sequence != 1 || entry.user_id.is_some() {
            return Err(format!("a {kind} entry is sequence 1 and owned by no user"));
        }
        let payload: Value = serde_json::from_str(entry.payload)
            .map_err(|e| format!("its payload is not JSON: {e}"))?;
        let fact = &payload[field];
        let int = |name: &str| {
            fact[name]
                .as_i64()
                .ok_or_else(|| format!("its payload has no integer {field}.{name}"))
        };
        if kind == "PartitionMoved" {
            let moved = Moved {
                position: entry.position,
                partition: int("partition")?,
                from: int("from_cell")?,
                to: int("to_cell")?,
            };
            self.moved.insert(entry.aggregate_id.to_owned(), moved);
        } else {
            let cell = int("cell")?;
            if entry.aggregate_id != cell.to_string() {
                return Err(format!(
                    "a CellAdded entry's id is its cell's, not {}",
                    entry.aggregate_id
                ));
            }
            self.added
                .insert(cell, (entry.position, int("map_version")?));
        }
        Ok(())
    }

    /// Holds the entries met to the rows of the caller's snapshot: how many facts were held, or
    /// the first difference.
    pub(crate) async fn check(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Result<u64, Finding>, LogError> {
        let me: Option<i64> = sqlx::query_scalar("SELECT cell_id::bigint FROM cell_identity")
            .fetch_optional(&mut *conn)
            .await?;
        let moves: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT id, partition::bigint, from_cell::bigint, to_cell::bigint
             FROM partition_moves WHERE step = 'DONE' ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await?;
        let switches: Vec<(String, String)> = sqlx::query_as(
            "SELECT DISTINCT move_id, direction FROM partition_switches ORDER BY move_id",
        )
        .fetch_all(&mut *conn)
        .await?;
        let cells: Vec<(i64, i64)> =
            sqlx::query_as("SELECT id::bigint, map_version FROM cell_cells ORDER BY id")
                .fetch_all(&mut *conn)
                .await?;
        let rows = Rows {
            me,
            moves,
            switches,
            cells,
        };
        Ok(self
            .held_to(&rows)
            .map(|()| u64::try_from(self.moved.len() + self.added.len()).unwrap_or(u64::MAX)))
    }

    fn held_to(&self, rows: &Rows) -> Result<(), Finding> {
        let me = rows.me.unwrap_or(0);
        for (id, m) in &self.moved {
            let at = || format!("position {} (move {id})", m.position);
            if m.from != me && m.to != me {
                return Err(finding(
                    at(),
                    format!(
                        "a PartitionMoved entry naming cells {} → {}, in cell {me}'s log",
                        m.from, m.to
                    ),
                ));
            }
            if m.from == me && !rows.moves.iter().any(|(r, ..)| r == id) {
                return Err(finding(at(), "a PartitionMoved entry of a move out of this cell without its DONE record in partition_moves"));
            }
        }
        for (id, partition, from, to) in &rows.moves {
            let Some(m) = self.moved.get(id) else {
                return Err(finding(format!("move {id}"), format!("its DONE record (partition {partition}, cell {from} → {to}) has no PartitionMoved entry in the log")));
            };
            if (m.partition, m.from, m.to) != (*partition, *from, *to) {
                return Err(finding(format!("position {} (move {id})", m.position), format!("the entry says partition {} cell {} → {}, its record partition {partition} cell {from} → {to}", m.partition, m.from, m.to)));
            }
        }
        for (id, direction) in &rows.switches {
            let side = |m: &Moved| if direction == "OUT" { m.from } else { m.to };
            match self.moved.get(id) {
                Some(m) if side(m) == me => {}
                _ => return Err(finding(format!("move {id}"), format!("its FUNDING totals switched {direction} (partition_switches) have no PartitionMoved entry naming this cell: money moved behind the log's back"))),
            }
        }
        for (cell, version) in &rows.cells {
            match self.added.get(cell) {
                Some((_, v)) if v == version => {}
                Some((position, v)) => {
                    return Err(finding(
                        format!("position {position} (cell {cell})"),
                        format!(
                        "the CellAdded entry says map version {v}, its cell_cells row {version}"
                    ),
                    ))
                }
                None => {
                    return Err(finding(
                        format!("cell {cell}"),
                        "its cell_cells row has no CellAdded entry in the log",
                    ))
                }
            }
        }
        if let Some((cell, (position, _))) = self
            .added
            .iter()
            .find(|(c, _)| !rows.cells.iter().any(|(r, _)| r == *c))
        {
            return Err(finding(
                format!("position {position} (cell {cell})"),
                "a CellAdded entry without its cell_cells row",
            ));
        }
        Ok(())
    }
}

/// The rows the entries are held to.
struct Rows {
    me: Option<i64>,
    /// `(id, partition, from, to)` of every DONE move.
    moves: Vec<(String, i64, i64, i64)>,
    /// `(move id, IN or OUT)`.
    switches: Vec<(String, String)>,
    /// `(cell, map version)`.
    cells: Vec<(i64, i64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(
        aggregate: &'a str,
        id: &'a str,
        event: &'a str,
        payload: &'a str,
    ) -> tlog::Entry<'a> {
        tlog::Entry {
            position: 9,
            aggregate_type: aggregate,
            aggregate_id: id,
            sequence: 1,
            event_type: event,
            event_version: "1",
            occurred_at: "2026-12-07T00:00:00.000000Z",
            user_id: None,
            payload,
        }
    }

    fn facts() -> MapFacts {
        let mut f = MapFacts::default();
        f.see(&entry(
            "Partition",
            "m1",
            "PartitionMoved",
            r#"{"PartitionMoved":{"partition":5,"from_cell":1,"to_cell":2}}"#,
        ))
        .unwrap();
        f.see(&entry(
            "Cell",
            "3",
            "CellAdded",
            r#"{"CellAdded":{"cell":3,"map_version":2}}"#,
        ))
        .unwrap();
        f
    }

    fn rows() -> Rows {
        Rows {
            me: Some(1),
            moves: vec![("m1".into(), 5, 1, 2)],
            switches: vec![("m1".into(), "OUT".into())],
            cells: vec![(3, 2)],
        }
    }

    #[test]
    fn every_row_held_to_its_entry_passes() {
        assert_eq!(facts().held_to(&rows()), Ok(()));
    }

    #[test]
    fn a_row_or_an_entry_alone_or_different_is_named() {
        let f = facts();
        let mut r = rows();
        r.switches.push(("forged".into(), "IN".into()));
        assert!(f
            .held_to(&r)
            .unwrap_err()
            .why
            .contains("behind the log's back"));
        let mut r = rows();
        r.moves[0].1 = 6;
        assert!(f
            .held_to(&r)
            .unwrap_err()
            .why
            .contains("its record partition 6"));
        let mut r = rows();
        r.moves.clear();
        assert!(f
            .held_to(&r)
            .unwrap_err()
            .why
            .contains("without its DONE record"));
        let mut r = rows();
        r.cells.push((4, 3));
        assert_eq!(f.held_to(&r).unwrap_err().at, "cell 4");
        let mut r = rows();
        r.cells.clear();
        assert!(f
            .held_to(&r)
            .unwrap_err()
            .why
            .contains("without its cell_cells row"));
        let mut r = rows();
        r.me = Some(7);
        assert!(f.held_to(&r).unwrap_err().why.contains("in cell 7's log"));
    }

    #[test]
    fn a_map_entry_of_another_shape_is_refused() {
        let mut f = MapFacts::default();
        assert!(f
            .see(&entry("Partition", "m1", "TransferCreated", "{}"))
            .is_err());
        assert!(f
            .see(&entry(
                "Cell",
                "4",
                "CellAdded",
                r#"{"CellAdded":{"cell":5,"map_version":2}}"#
            ))
            .is_err());
        assert!(f
            .see(&entry("Transfer", "r1", "TransferCreated", "{}"))
            .is_ok());
    }
}
