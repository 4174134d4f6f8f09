//! What a moves seed runs (`Config`) and what it came to (`Report`).

use std::collections::BTreeMap;

use application::plant::Bug;

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Cells the partitions are spread over and moved between (2 or more).
    pub cells: u16,
    /// `write-after-pause` (any other planted bug changes nothing here).
    pub plant: Option<Bug>,
    pub trace: bool,
}

/// What a moves seed came to.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub seed: u64,
    pub violations: Vec<String>,
    /// Moves started, and how each ended.
    pub moves: u64,
    pub done: u64,
    pub cancelled: u64,
    /// Of the cancelled: by the check before the switch, by a drain that did not end in time,
    /// by an operator.
    pub cancelled_by_check: u64,
    pub cancelled_by_drain: u64,
    /// Faults armed and met, writes accepted and refused, cancels, by kind.
    pub counts: BTreeMap<&'static str, u64>,
    pub trace: Vec<String>,
}
