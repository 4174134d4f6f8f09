//! The feed cursor under a cell map (ADR 0017 §8): every cell keeps its own dense feed, so a
//! consumer's place in the feeds is one position per cell, written `1:5120,2:4987,3:5011`
//! (cells ascending, each `<cell id>:<feed position>`). The HTTP feed takes it as `after`, SSE
//! as `Last-Event-ID`, and `ledger tail` as `--after-position`. A cell left out is at position 0;
//! a bare `N` names the one cell of a map with one cell. Without a map the feed keeps today's
//! bare integer and never sees this type.

use std::collections::BTreeMap;

use crate::CellId;

/// One feed position per cell of a map: every cell of the map is present (at 0 when the text
/// left it out). Displayed as `1:5120,2:4987,3:5011`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedCursor {
    positions: BTreeMap<CellId, i64>,
}

/// Why a cursor's text is refused; the message says what was wrong and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CursorError(String);

impl FeedCursor {
    /// Every cell of `cells` at position 0: the start of every feed.
    pub fn start(cells: impl IntoIterator<Item = CellId>) -> Self {
        Self {
            positions: cells.into_iter().map(|c| (c, 0)).collect(),
        }
    }

    /// Parses `text` for a map of `cells`: `1:5120,2:4987` (any order, each cell at most once,
    /// each a cell of the map, positions non-negative integers), the empty text (every cell at
    /// 0), or a bare `N` when the map has exactly one cell.
    pub fn parse(text: &str, cells: &[CellId]) -> Result<Self, CursorError> {
        let mut cursor = Self::start(cells.iter().copied());
        let text = text.trim();
        if text.is_empty() {
            return Ok(cursor);
        }
        if !text.contains(':') {
            let position = position(text)?;
            return match cells {
                [only] => {
                    cursor.positions.insert(*only, position);
                    Ok(cursor)
                }
                _ => Err(CursorError(format!(
                    "a bare position names one cell; with {} cells write each cell's \
                     position, e.g. `{}`",
                    cells.len(),
                    Self::start(cells.iter().copied())
                ))),
            };
        }
        let mut seen = Vec::new();
        for part in text.split(',') {
            let (cell, at) = part
                .split_once(':')
                .ok_or_else(|| CursorError(format!("`{part}` is not `<cell>:<position>`")))?;
            let cell = cell
                .trim()
                .parse::<u64>()
                .ok()
                .and_then(CellId::new)
                .filter(|c| cells.contains(c))
                .ok_or_else(|| {
                    CursorError(format!("`{}` is not a cell of the map", cell.trim()))
                })?;
            if seen.contains(&cell) {
                return Err(CursorError(format!("cell {cell} is named twice")));
            }
            seen.push(cell);
            cursor.positions.insert(cell, position(at)?);
        }
        Ok(cursor)
    }

    /// The position of `cell` (0 for a cell the cursor does not hold).
    pub fn get(&self, cell: CellId) -> i64 {
        self.positions.get(&cell).copied().unwrap_or(0)
    }

    /// Moves `cell` to `position`.
    pub fn set(&mut self, cell: CellId, position: i64) {
        self.positions.insert(cell, position);
    }

    /// Every cell and its position, ascending by cell.
    pub fn iter(&self) -> impl Iterator<Item = (CellId, i64)> + '_ {
        self.positions.iter().map(|(c, p)| (*c, *p))
    }
}

fn position(text: &str) -> Result<i64, CursorError> {
    text.trim()
        .parse::<i64>()
        .ok()
        .filter(|p| *p >= 0)
        .ok_or_else(|| {
            CursorError(format!(
                "`{}` is not a feed position (a non-negative integer)",
                text.trim()
            ))
        })
}

impl std::fmt::Display for FeedCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (cell, position) in &self.positions {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{cell}:{position}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(ids: &[u64]) -> Vec<CellId> {
        ids.iter().map(|&i| CellId::new(i).unwrap()).collect()
    }

    #[test]
    fn a_cursor_names_every_cell_ascending() {
        let three = cells(&[1, 2, 3]);
        let c = FeedCursor::parse("3:5011,1:5120,2:4987", &three).unwrap();
        assert_eq!(c.to_string(), "1:5120,2:4987,3:5011");
        assert_eq!(c.get(three[1]), 4987);
        // A cell left out is at 0; the empty text is the start of every feed.
        assert_eq!(
            FeedCursor::parse("2:7", &three).unwrap().to_string(),
            "1:0,2:7,3:0"
        );
        assert_eq!(
            FeedCursor::parse("", &three).unwrap(),
            FeedCursor::start(three.clone())
        );
    }

    #[test]
    fn a_bare_position_only_with_one_cell() {
        let one = cells(&[4]);
        assert_eq!(FeedCursor::parse("12", &one).unwrap().to_string(), "4:12");
        let err = FeedCursor::parse("12", &cells(&[1, 2])).unwrap_err();
        assert!(err.to_string().contains("`1:0,2:0`"), "{err}");
    }

    #[test]
    fn bad_cursors_are_refused_naming_the_part() {
        let three = cells(&[1, 2, 3]);
        for (text, says) in [
            ("4:1", "`4` is not a cell of the map"),
            ("0:1", "`0` is not a cell of the map"),
            ("1:1,1:2", "cell 1 is named twice"),
            ("1:-1", "`-1` is not a feed position"),
            ("1:x", "`x` is not a feed position"),
            ("1:2,3", "`3` is not `<cell>:<position>`"),
        ] {
            let err = FeedCursor::parse(text, &three).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
