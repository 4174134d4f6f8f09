//! The three decisions that keep ADR 0020's rule ("nothing acknowledged is lost, no two leaders
//! acknowledge"), as pure functions: the real replicas (`leader.rs`, `wal/follow.rs`) and the
//! simulation's model of replication (`ledger-sim --replication`) both call them, so the
//! simulation checks the code that runs. Each has a planted bug (feature `plant`, which only the
//! `sim` crate enables) that the simulation must find.

use super::history::{divergence, Position};

/// May the leader of `epoch` acknowledge everything up to `last`? Only when a follower whose
/// history has reached `epoch` has fsynced it (`acks`: each follower's acknowledged seq and
/// the last epoch of its history). The leader's own fsync is done before this is asked.
pub fn may_acknowledge(acks: impl IntoIterator<Item = (u64, u64)>, last: u64, epoch: u64) -> bool {
    if plant::active(plant::Bug::AckBeforeSecondFsync) {
        return true;
    }
    acks.into_iter()
        .any(|(seq, their_epoch)| seq >= last && their_epoch == epoch)
}

/// Does a replica that promised `promised` accept frames of `epoch`? Only of exactly that
/// epoch: an older leader is fenced, a newer one must first be promised (its join does).
pub fn accepts_frames(promised: u64, epoch: u64) -> bool {
    if plant::active(plant::Bug::AcceptOlderEpoch) {
        return epoch <= promised;
    }
    epoch == promised
}

/// What a new leader whose log is `mine` does with the most advanced log `best` among the
/// replicas that promised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopt {
    /// Its own log is at least as advanced: lead with it.
    Lead,
    /// Fetch the frames after its last seq from `best`'s replica, then lead.
    Fetch { after: u64, upto: u64 },
    /// Its log has a tail `best` lacks: it must not lead (it rebuilds when a leader joins it).
    Diverged,
}

pub fn adopt(mine: &Position, best: &Position) -> Adopt {
    if !best.more_advanced_than(mine) || plant::active(plant::Bug::LeadWithoutLastAcked) {
        return Adopt::Lead;
    }
    if divergence(mine, best) < mine.last_seq {
        return Adopt::Diverged;
    }
    Adopt::Fetch {
        after: mine.last_seq,
        upto: best.last_seq,
    }
}

/// Planted bugs of replication, compiled in only with the `plant` feature.
pub mod plant {
    /// The planted bugs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Bug {
        /// The leader acknowledges a batch on its own fsync, before a follower's.
        AckBeforeSecondFsync,
        /// A replica accepts frames from a leader of an older epoch than it promised.
        AcceptOlderEpoch,
        /// A new leader leads with its own log without adopting a more advanced one.
        LeadWithoutLastAcked,
    }

    impl Bug {
        pub const ALL: [Bug; 3] = [
            Bug::AckBeforeSecondFsync,
            Bug::AcceptOlderEpoch,
            Bug::LeadWithoutLastAcked,
        ];

        /// The name `--plant` takes.
        pub fn name(self) -> &'static str {
            match self {
                Bug::AckBeforeSecondFsync => "ack-before-second-fsync",
                Bug::AcceptOlderEpoch => "accept-older-epoch",
                Bug::LeadWithoutLastAcked => "lead-without-last-acked",
            }
        }

        pub fn parse(name: &str) -> Option<Bug> {
            Bug::ALL.into_iter().find(|b| b.name() == name)
        }
    }

    #[cfg(feature = "plant")]
    thread_local! {
        static ACTIVE: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
    }

    /// Activates `bug` (or none) on this thread.
    #[cfg(feature = "plant")]
    pub fn set(bug: Option<Bug>) {
        ACTIVE.with(|a| a.set(bug));
    }

    /// Whether `bug` is active on this thread (never, without the `plant` feature).
    #[inline]
    pub fn active(bug: Bug) -> bool {
        #[cfg(feature = "plant")]
        {
            ACTIVE.with(|a| a.get() == Some(bug))
        }
        #[cfg(not(feature = "plant"))]
        {
            let _ = bug;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::history::EpochStart;

    #[test]
    fn a_lone_leader_never_acknowledges() {
        assert!(!may_acknowledge([], 5, 9));
        assert!(!may_acknowledge([(4, 9)], 5, 9), "behind");
        assert!(!may_acknowledge([(7, 8)], 5, 9), "not yet of this epoch");
        assert!(may_acknowledge([(4, 9), (5, 9)], 5, 9));
    }

    #[test]
    fn frames_only_of_the_promised_epoch() {
        assert!(accepts_frames(9, 9));
        assert!(!accepts_frames(9, 8));
        assert!(!accepts_frames(9, 10));
    }

    #[test]
    fn a_new_leader_adopts_a_more_advanced_log_or_stands_aside() {
        let p = |h: &[(u64, u64)], last| Position {
            history: h
                .iter()
                .map(|&(epoch, start)| EpochStart { epoch, start })
                .collect(),
            last_seq: last,
        };
        assert_eq!(adopt(&p(&[(2, 1)], 10), &p(&[(2, 1)], 10)), Adopt::Lead);
        assert_eq!(
            adopt(&p(&[(2, 1)], 10), &p(&[(2, 1)], 14)),
            Adopt::Fetch {
                after: 10,
                upto: 14
            }
        );
        assert_eq!(
            adopt(&p(&[(2, 1)], 12), &p(&[(2, 1), (5, 11)], 11)),
            Adopt::Diverged
        );
    }
}
