//! A move's record and its steps. A step names the work running now: it is recorded before that
//! work starts, and the next step is recorded once the work is done. Every step's work is
//! idempotent, so a runner that finds a move at a step after a crash runs that step's work again.

use std::collections::BTreeMap;

use cells::{CellId, Partition};
use domain::UserId;
use rust_decimal::Decimal;

/// A move's id (a ULID's text): the key of its record, and the id spot-core journals its
/// move-out and move-in under, so either is applied once however often it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoveId(pub String);

impl MoveId {
    /// The id the rollback's own spot-core calls are journaled under: distinct from the move's,
    /// so a move-out of the target under it is not taken for the move's own move-out.
    pub fn cancel_id(&self) -> String {
        format!("{}:cancel", self.0)
    }
}

impl std::fmt::Display for MoveId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a move is: the step whose work runs now (ADR 0023 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoveStep {
    /// The target marks the partition `incoming`.
    Planned,
    /// The partition's history is copied while the source is live, batch by batch from the marks.
    Copying,
    /// Copying again from the marks, pass after pass, until one pass copies a short tail.
    CatchingUp,
    /// The front holds the partition's writes, the source freezes it under the fence, and the
    /// last tail is copied: from here no write of the partition lands in the source.
    Pausing,
    /// The source spot-core moves the partition's balances out, and the target's moves them in.
    MovingSpot,
    /// The target's book is checked against the source's before anything is switched.
    Verifying,
    /// The map's next version is written into every cell, the source's rows are marked moved,
    /// `PartitionMoved` is appended to both logs, and the front lets the held writes go.
    Switching,
    /// The partition is the target's.
    Done,
    /// Rolling back: the SPOT balances go back, the source owns the partition again, and the
    /// target's copies are void.
    Cancelling,
    /// The partition is whole in its source, as before the move.
    Cancelled,
}

impl MoveStep {
    /// The step's name in records and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Planned => "PLANNED",
            Self::Copying => "COPYING",
            Self::CatchingUp => "CATCHING_UP",
            Self::Pausing => "PAUSING",
            Self::MovingSpot => "MOVING_SPOT",
            Self::Verifying => "VERIFYING",
            Self::Switching => "SWITCHING",
            Self::Done => "DONE",
            Self::Cancelling => "CANCELLING",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// The step named `text` (`as_str`'s inverse).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|step| step.as_str() == text)
    }

    pub const ALL: [MoveStep; 10] = [
        Self::Planned,
        Self::Copying,
        Self::CatchingUp,
        Self::Pausing,
        Self::MovingSpot,
        Self::Verifying,
        Self::Switching,
        Self::Done,
        Self::Cancelling,
        Self::Cancelled,
    ];

    /// Whether the move has ended.
    pub fn is_end(self) -> bool {
        matches!(self, Self::Done | Self::Cancelled)
    }

    /// Whether a cancel is still allowed: until the switch begins. After it, the map may
    /// already name the target somewhere, and only going forward keeps one owner.
    pub fn may_cancel(self) -> bool {
        matches!(
            self,
            Self::Planned
                | Self::Copying
                | Self::CatchingUp
                | Self::Pausing
                | Self::MovingSpot
                | Self::Verifying
        )
    }

    /// The one table of steps (ADR 0023 §4): the steps this one may be followed by. A step may
    /// also be recorded again (its marks moved on) without changing.
    pub fn may_step_to(self, next: MoveStep) -> bool {
        use MoveStep::*;
        if next == Cancelling {
            return self.may_cancel();
        }
        matches!(
            (self, next),
            (Planned, Copying)
                | (Copying, CatchingUp)
                | (CatchingUp, Pausing)
                | (Pausing, MovingSpot)
                | (MovingSpot, Verifying)
                | (Verifying, Switching)
                | (Switching, Done)
                | (Cancelling, Cancelled)
        )
    }

    /// Whether the source's SPOT balances may have left it by this step: a move-out is sent
    /// only once `MovingSpot` is recorded.
    pub fn spot_may_have_moved(self) -> bool {
        matches!(self, Self::MovingSpot | Self::Verifying | Self::Switching)
    }

    /// Whether the source may be frozen by this step.
    pub fn source_may_be_frozen(self) -> bool {
        matches!(
            self,
            Self::Pausing | Self::MovingSpot | Self::Verifying | Self::Switching
        )
    }
}

/// How far the copy has come, per table: the last key copied (a feed position, a journal id),
/// named by the adapter that copies. The core only keeps them with the record, so a resumed copy
/// starts where the last durable batch ended (and the copy is idempotent besides).
pub type Marks = BTreeMap<String, i64>;

/// The feed positions up to which both cells' histories of the partition were found equal at
/// the start of the pause (the source's: the copy's mark; the target's: its head then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryCut {
    pub source: i64,
    pub target: i64,
}

/// One move, as recorded in the source cell (`partition_moves`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoveRecord {
    pub id: MoveId,
    pub partition: Partition,
    pub from: CellId,
    pub to: CellId,
    pub step: MoveStep,
    /// The map version the switch writes (the version the move started under, plus one).
    pub map_version: u64,
    pub marks: Marks,
    /// Rows copied so far, and by the last pass of `CatchingUp`.
    pub copied: u64,
    pub last_pass: u64,
    /// Passes of `CatchingUp` run so far.
    pub passes: u32,
    /// The SPOT balances the source's move-out answered, per user and asset: what the target
    /// must hold after its move-in. Kept with the record so the check after a crash needs no
    /// second move-out.
    pub spot: Option<BTreeMap<(UserId, String), Decimal>>,
    /// Where the pause split the history: the prefixes up to these positions were compared
    /// while the partition was live, and the check before the switch compares what follows.
    pub history_cut: Option<HistoryCut>,
    /// When cancelling: the step the cancel found, which says what there is to roll back.
    pub cancelled_at: Option<MoveStep>,
    /// Why the move was cancelled, when the runner cancelled it (a failed check).
    pub reason: Option<String>,
}

impl MoveRecord {
    /// A new move of `partition` from `from` to `to`, under map `version` (it writes `version + 1`).
    pub fn new(id: MoveId, partition: Partition, from: CellId, to: CellId, version: u64) -> Self {
        Self {
            id,
            partition,
            from,
            to,
            step: MoveStep::Planned,
            map_version: version + 1,
            marks: Marks::new(),
            copied: 0,
            last_pass: 0,
            passes: 0,
            spot: None,
            history_cut: None,
            cancelled_at: None,
            reason: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_has_a_name_it_is_read_back_from() {
        for step in MoveStep::ALL {
            assert_eq!(MoveStep::parse(step.as_str()), Some(step));
        }
        assert_eq!(MoveStep::parse("moving"), None);
    }

    #[test]
    fn the_forward_path_is_one_line_and_ends_are_final() {
        let forward = [
            MoveStep::Planned,
            MoveStep::Copying,
            MoveStep::CatchingUp,
            MoveStep::Pausing,
            MoveStep::MovingSpot,
            MoveStep::Verifying,
            MoveStep::Switching,
            MoveStep::Done,
        ];
        for pair in forward.windows(2) {
            assert!(
                pair[0].may_step_to(pair[1]),
                "{:?} → {:?}",
                pair[0],
                pair[1]
            );
        }
        for from in MoveStep::ALL {
            let nexts = MoveStep::ALL
                .into_iter()
                .filter(|next| from.may_step_to(*next))
                .count();
            if from.is_end() {
                assert_eq!(nexts, 0, "{from:?} is an end");
            } else {
                assert!(nexts >= 1, "{from:?} leads somewhere");
            }
        }
    }

    #[test]
    fn a_cancel_is_allowed_only_before_the_switch() {
        assert!(MoveStep::Verifying.may_step_to(MoveStep::Cancelling));
        assert!(!MoveStep::Switching.may_step_to(MoveStep::Cancelling));
        assert!(!MoveStep::Done.may_step_to(MoveStep::Cancelling));
        assert!(!MoveStep::Cancelling.may_step_to(MoveStep::Cancelling));
        assert!(!MoveStep::Switching.may_step_to(MoveStep::Cancelled));
    }
}
