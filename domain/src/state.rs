//! A transfer's states (contract §1) with their stable ids, which are terminal, and which step
//! may follow which (`may_step_to`, the table the coordinator's assertions hold every recorded
//! step to, written apart from the aggregate's `decide` so that each checks the other).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The states of a transfer with their stable numeric ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TransferState {
    Init,
    SourcePending,
    SourceDone,
    TargetPending,
    Committed,
    Failed,
    Compensating,
    RolledBack,
}

impl TransferState {
    pub const ALL: [TransferState; 8] = [
        Self::Init,
        Self::SourcePending,
        Self::SourceDone,
        Self::TargetPending,
        Self::Committed,
        Self::Failed,
        Self::Compensating,
        Self::RolledBack,
    ];

    pub fn id(self) -> i16 {
        match self {
            Self::Init => 0,
            Self::SourcePending => 10,
            Self::SourceDone => 20,
            Self::TargetPending => 30,
            Self::Committed => 40,
            Self::Failed => -10,
            Self::Compensating => -20,
            Self::RolledBack => -30,
        }
    }

    pub fn from_id(id: i16) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.id() == id)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "INIT",
            Self::SourcePending => "SOURCE_PENDING",
            Self::SourceDone => "SOURCE_DONE",
            Self::TargetPending => "TARGET_PENDING",
            Self::Committed => "COMMITTED",
            Self::Failed => "FAILED",
            Self::Compensating => "COMPENSATING",
            Self::RolledBack => "ROLLED_BACK",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether one event may take a transfer from `self` to `next`: the transition table by
    /// states alone (a manual resolution moves along the same edges, `manual_resolution_target`).
    /// Said independently of `Transfer::decide`, which it checks.
    pub fn may_step_to(self, next: TransferState) -> bool {
        use TransferState as S;
        matches!(
            (self, next),
            (S::Init, S::SourcePending)
                | (S::SourcePending, S::SourceDone | S::Failed)
                | (S::SourceDone, S::TargetPending)
                | (S::TargetPending, S::Committed | S::Compensating)
                | (S::Compensating, S::RolledBack)
        )
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Committed | Self::Failed | Self::RolledBack)
    }

    /// Money has left the source and not reached the target (the in-flight states of contract §4).
    pub fn is_in_flight(self) -> bool {
        matches!(
            self,
            Self::SourceDone | Self::TargetPending | Self::Compensating
        )
    }

    /// The terminal states, the one list every query and check takes them from.
    pub const TERMINAL: [TransferState; 3] = [Self::Committed, Self::Failed, Self::RolledBack];

    /// The terminal states' ids as an SQL list (`40, -10, -30`), for `state_id NOT IN (...)`.
    pub fn terminal_ids_sql() -> String {
        let ids: Vec<String> = Self::TERMINAL.iter().map(|s| s.id().to_string()).collect();
        ids.join(", ")
    }
}

impl fmt::Display for TransferState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
