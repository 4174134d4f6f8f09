//! Fail points for crash tests: the process aborts at a named point when the settings arm it
//! (`LEDGER_FAILPOINT`, honoured by the `ledger` binary only with `LEDGER_ALLOW_FAILPOINTS`), so
//! a test can kill the real coordinator exactly between two durable steps. The points are an
//! enum: a name that is none of them is refused when read (`FromStr`), and no call site can
//! misspell one.

use std::fmt;
use std::str::FromStr;

/// Every fail point the coordinator has, in the order a transfer meets them (CRA-001..006).
///
/// `AfterCreatedWithdrawStarted` and `AfterWithdrawnDepositStarted` follow the commits of two
/// events each; `AfterInit` and `AfterSourceDone` are met only by a transfer found in INIT or
/// SOURCE_DONE (a log written before those pairs were one commit, or a manual resolution to
/// SOURCE_DONE), before its call-free step.
///
/// `BulkHalf*` are the bulk path's (`bulk.rs`): with one armed, a batch's withdraws (deposits)
/// are made for its first half only, and the process aborts before the second half's.
/// `RoundHalf*` are the same inside a shared round of single requests (`round.rs`), met only by
/// a round carrying more than one request. `Move*Done` are a partition move's
/// (`moves/run.rs`): after a step's work, before the next step is recorded. `CellAdd*` are a
/// cell's addition's (`ledger cells add`): once the new cell is reached, before any cell stores
/// the map naming it, and once the first cell has stored it, before the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailPoint {
    AfterInit,
    AfterCreatedWithdrawStarted,
    SourcePendingBeforeCall,
    SourceAfterCall,
    AfterSourceDone,
    AfterWithdrawnDepositStarted,
    TargetPendingBeforeCall,
    TargetAfterCall,
    CompensatingBeforeRefund,
    CompensatingAfterRefund,
    AfterManualResolution,
    BulkHalfWithdrawn,
    BulkHalfDeposited,
    RoundHalfWithdrawn,
    RoundHalfDeposited,
    MovePlannedDone,
    MoveCopyingDone,
    MoveCatchingUpDone,
    MovePausingDone,
    MoveMovingSpotDone,
    MoveVerifyingDone,
    MoveSwitchingDone,
    MoveCancellingDone,
    CellAddReached,
    CellAddOneStored,
}

impl FailPoint {
    /// Every fail point, in the order a transfer meets them.
    pub const ALL: [FailPoint; 25] = [
        FailPoint::AfterInit,
        FailPoint::AfterCreatedWithdrawStarted,
        FailPoint::SourcePendingBeforeCall,
        FailPoint::SourceAfterCall,
        FailPoint::AfterSourceDone,
        FailPoint::AfterWithdrawnDepositStarted,
        FailPoint::TargetPendingBeforeCall,
        FailPoint::TargetAfterCall,
        FailPoint::CompensatingBeforeRefund,
        FailPoint::CompensatingAfterRefund,
        FailPoint::AfterManualResolution,
        FailPoint::BulkHalfWithdrawn,
        FailPoint::BulkHalfDeposited,
        FailPoint::RoundHalfWithdrawn,
        FailPoint::RoundHalfDeposited,
        FailPoint::MovePlannedDone,
        FailPoint::MoveCopyingDone,
        FailPoint::MoveCatchingUpDone,
        FailPoint::MovePausingDone,
        FailPoint::MoveMovingSpotDone,
        FailPoint::MoveVerifyingDone,
        FailPoint::MoveSwitchingDone,
        FailPoint::MoveCancellingDone,
        FailPoint::CellAddReached,
        FailPoint::CellAddOneStored,
    ];

    /// The name `LEDGER_FAILPOINT` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailPoint::AfterInit => "after_init",
            FailPoint::AfterCreatedWithdrawStarted => "after_created_withdraw_started",
            FailPoint::SourcePendingBeforeCall => "source_pending_before_call",
            FailPoint::SourceAfterCall => "source_after_call",
            FailPoint::AfterSourceDone => "after_source_done",
            FailPoint::AfterWithdrawnDepositStarted => "after_withdrawn_deposit_started",
            FailPoint::TargetPendingBeforeCall => "target_pending_before_call",
            FailPoint::TargetAfterCall => "target_after_call",
            FailPoint::CompensatingBeforeRefund => "compensating_before_refund",
            FailPoint::CompensatingAfterRefund => "compensating_after_refund",
            FailPoint::AfterManualResolution => "after_manual_resolution",
            FailPoint::BulkHalfWithdrawn => "bulk_half_withdrawn",
            FailPoint::BulkHalfDeposited => "bulk_half_deposited",
            FailPoint::RoundHalfWithdrawn => "round_half_withdrawn",
            FailPoint::RoundHalfDeposited => "round_half_deposited",
            FailPoint::MovePlannedDone => "move_planned_done",
            FailPoint::MoveCopyingDone => "move_copying_done",
            FailPoint::MoveCatchingUpDone => "move_catching_up_done",
            FailPoint::MovePausingDone => "move_pausing_done",
            FailPoint::MoveMovingSpotDone => "move_moving_spot_done",
            FailPoint::MoveVerifyingDone => "move_verifying_done",
            FailPoint::MoveSwitchingDone => "move_switching_done",
            FailPoint::MoveCancellingDone => "move_cancelling_done",
            FailPoint::CellAddReached => "cell_add_reached",
            FailPoint::CellAddOneStored => "cell_add_one_stored",
        }
    }
}

impl fmt::Display for FailPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is none of the fail points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fail point {0:?} (known: {known})", known = known_names())]
pub struct UnknownFailPoint(pub String);

fn known_names() -> String {
    FailPoint::ALL.map(FailPoint::as_str).join(", ")
}

impl FromStr for FailPoint {
    type Err = UnknownFailPoint;

    fn from_str(name: &str) -> Result<Self, UnknownFailPoint> {
        FailPoint::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| UnknownFailPoint(name.to_owned()))
    }
}

/// The one fail point armed in this process, if any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailPoints {
    armed: Option<FailPoint>,
}

impl FailPoints {
    /// Arms `point`, and says loudly in the log that this process will abort on purpose there.
    pub fn armed(point: FailPoint) -> Self {
        tracing::error!(
            failpoint = %point,
            "FAIL POINT ARMED: this process will abort on purpose at fail point {point} \
             (crash tests only; never in production)"
        );
        Self { armed: Some(point) }
    }

    /// Whether `point` is the armed fail point (for a point that changes how a step is made
    /// before it aborts, such as the bulk path's half-batch points).
    pub fn any_armed(&self) -> bool {
        self.armed.is_some()
    }

    pub fn is_armed(&self, point: FailPoint) -> bool {
        self.armed == Some(point)
    }

    /// Aborts the process (no unwinding, no destructors, no flushing: like SIGKILL) when `point`
    /// is the armed fail point. A no-op otherwise.
    pub fn hit(&self, point: FailPoint) {
        if self.is_armed(point) {
            eprintln!("fail point {point}: aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fail_point_reads_back_from_its_name() {
        for point in FailPoint::ALL {
            assert_eq!(point.as_str().parse::<FailPoint>(), Ok(point));
        }
    }

    #[test]
    fn an_unknown_name_is_refused() {
        for name in [
            "",
            "after_int",
            "AFTER_INIT",
            "target_after_call ",
            "bulk_half",
        ] {
            let refused = name.parse::<FailPoint>().unwrap_err();
            assert_eq!(refused, UnknownFailPoint(name.to_owned()));
            assert!(refused.to_string().contains("after_init"), "{refused}");
        }
    }

    #[test]
    fn only_the_armed_point_is_armed() {
        let armed = FailPoints::armed(FailPoint::TargetAfterCall);
        assert!(armed.is_armed(FailPoint::TargetAfterCall));
        assert!(!armed.is_armed(FailPoint::SourceAfterCall));
        assert!(!FailPoints::default().is_armed(FailPoint::TargetAfterCall));
    }
}
