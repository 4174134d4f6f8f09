//! `MoveRunner`: starts, cancels and drives moves over the ports. A step's work runs only while
//! the record is at that step, and the next step is saved only if the record is still there
//! (compare and set), so a cancel, or a second runner, that records first makes this one stop
//! and reload: the work it did is idempotent, and the rollback undoes whatever the step it
//! interrupted may have done.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cells::{CellId, Partition};
use domain::UserId;
use futures_util::future::join;

use super::ports::{
    Freeze, MoveOutRefused, MoveRecords, PartitionBook, PartitionHold, PartitionStores, SpotMoves,
    Started,
};
use super::record::{HistoryCut, MoveId, MoveRecord, MoveStep};
use super::verify::{verify, Mismatch};
use crate::error::StoreError;
use crate::failpoint::{FailPoint, FailPoints};
use crate::ports::Clock;

/// How a move copies and retries.
#[derive(Debug, Clone)]
pub struct MoveSettings {
    /// A pass of `CatchingUp` that copies at most this many rows ends the copying while live:
    /// what is left is copied under the pause (1,000 rows by default).
    pub tail_max: u64,
    /// After this many passes the move pauses whatever the last pass copied: a partition written
    /// faster than it is copied would otherwise never pause.
    pub max_passes: u32,
    /// The wait before a step whose call failed is run again.
    pub retry: Duration,
    /// How long the pause waits for the partition's open transfers to end before the freeze
    /// (5 s by default); past it the move is cancelled, so a transfer stuck on a
    /// spot-core that does not answer never holds its partition's users up.
    pub drain_max: Duration,
    /// The wait between two looks at the open transfers while draining.
    pub drain_poll: Duration,
}

impl Default for MoveSettings {
    fn default() -> Self {
        Self {
            tail_max: 1_000,
            max_passes: 8,
            retry: Duration::from_secs(1),
            drain_max: Duration::from_secs(5),
            drain_poll: Duration::from_millis(20),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("partition {0} has a move that has not ended: {1}")]
    Busy(Partition, MoveId),
    #[error("{0}")]
    NotOwned(String),
    #[error("a move needs two cells; cell {0} is both")]
    SameCell(CellId),
    #[error("no move {0}")]
    NotFound(MoveId),
    #[error("move {0} is at {1} and can no longer be cancelled: it goes forward")]
    NotCancellable(MoveId, &'static str),
    /// Another runner, or a cancel, recorded a step first: reload and go on from it.
    #[error("move {0} was moved on by someone else")]
    Superseded(MoveId),
    /// A call failed or its answer was lost: the step runs again.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The move process's one driver.
#[derive(Clone)]
pub struct MoveRunner {
    records: Arc<dyn MoveRecords>,
    stores: Arc<dyn PartitionStores>,
    spot: Arc<dyn SpotMoves>,
    hold: Arc<dyn PartitionHold>,
    clock: Arc<dyn Clock>,
    settings: MoveSettings,
    failpoints: FailPoints,
}

impl MoveRunner {
    pub fn new(
        records: Arc<dyn MoveRecords>,
        stores: Arc<dyn PartitionStores>,
        spot: Arc<dyn SpotMoves>,
        hold: Arc<dyn PartitionHold>,
        clock: Arc<dyn Clock>,
        settings: MoveSettings,
    ) -> Self {
        Self {
            records,
            stores,
            spot,
            hold,
            clock,
            settings,
            failpoints: FailPoints::default(),
        }
    }

    /// Aborts the process at the armed `Move*Done` fail point (crash tests).
    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// Records a new move of `partition` from `from` (its owner under map `version`) to `to`.
    pub async fn start(
        &self,
        id: MoveId,
        partition: Partition,
        from: CellId,
        to: CellId,
        version: u64,
    ) -> Result<MoveRecord, MoveError> {
        if from == to {
            return Err(MoveError::SameCell(from));
        }
        let record = MoveRecord::new(id, partition, from, to, version);
        match self.records.start(&record).await? {
            Started::Recorded => Ok(record),
            Started::Busy(other) => Err(MoveError::Busy(partition, other)),
            Started::NotOwned(why) => Err(MoveError::NotOwned(why)),
        }
    }

    /// Cancels move `id`: records `Cancelling` (naming the step it found) if the move has not
    /// begun its switch. The runner then rolls it back; a cancelled move answers as it is.
    pub async fn cancel(&self, id: &MoveId, reason: &str) -> Result<MoveRecord, MoveError> {
        loop {
            let mut record = self.load(id).await?;
            if matches!(record.step, MoveStep::Cancelling | MoveStep::Cancelled) {
                return Ok(record);
            }
            if !record.step.may_cancel() {
                return Err(MoveError::NotCancellable(id.clone(), record.step.as_str()));
            }
            let found = record.step;
            record.cancelled_at = Some(found);
            record.reason = Some(reason.to_owned());
            record.step = MoveStep::Cancelling;
            if self.records.save(found, &record).await? {
                return Ok(record);
            }
        }
    }

    /// Drives move `id` to its end (`Done` or `Cancelled`), running a failed step again after
    /// `MoveSettings::retry`, forever: an unknown outcome is never given up on.
    pub async fn drive(&self, id: &MoveId) -> Result<MoveRecord, MoveError> {
        loop {
            let record = self.load(id).await?;
            if record.step.is_end() {
                return Ok(record);
            }
            match self.step(record).await {
                Ok(_) | Err(MoveError::Superseded(_)) => {}
                Err(MoveError::Store(error)) => {
                    tracing::warn!(move_id = %id, error = %error, "a move's step failed; it runs again");
                    self.clock.sleep(self.settings.retry).await;
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Runs the work of `record`'s step and records the next one; answers the record as saved.
    pub async fn step(&self, mut record: MoveRecord) -> Result<MoveRecord, MoveError> {
        let at = record.step;
        let next = match at {
            MoveStep::Done | MoveStep::Cancelled => return Ok(record),
            MoveStep::Planned => {
                let (to, partition) = (record.to, record.partition);
                self.stores.mark_incoming(to, partition, &record.id).await?;
                MoveStep::Copying
            }
            MoveStep::Copying => {
                self.copy_pass(&mut record).await?;
                MoveStep::CatchingUp
            }
            MoveStep::CatchingUp => {
                let rows = self.copy_pass(&mut record).await?;
                record.passes += 1;
                record.last_pass = rows;
                let short = rows <= self.settings.tail_max;
                if short || record.passes >= self.settings.max_passes {
                    MoveStep::Pausing
                } else {
                    MoveStep::CatchingUp
                }
            }
            MoveStep::Pausing => self.pause(&mut record).await?,
            MoveStep::MovingSpot => self.move_spot(&mut record).await?,
            MoveStep::Verifying => {
                let found = self.check(&record).await?;
                if found.is_empty() {
                    MoveStep::Switching
                } else {
                    let reasons: Vec<String> = found.iter().map(ToString::to_string).collect();
                    tracing::error!(move_id = %record.id, ?reasons, "a move's check failed; it is rolled back");
                    record.cancelled_at = Some(MoveStep::Verifying);
                    record.reason =
                        Some(format!("check before the switch: {}", reasons.join("; ")));
                    MoveStep::Cancelling
                }
            }
            MoveStep::Switching => {
                self.stores.switch(&record).await?;
                self.hold.release(record.partition).await;
                MoveStep::Done
            }
            MoveStep::Cancelling => {
                self.roll_back(&record).await?;
                MoveStep::Cancelled
            }
        };
        domain::invariant!(
            next == at || at.may_step_to(next),
            "a move steps only along its table: {} to {}",
            at.as_str(),
            next.as_str()
        );
        if let Some(point) = step_done(at) {
            self.failpoints.hit(point);
        }
        record.step = next;
        self.save(at, &record).await?;
        Ok(record)
    }

    /// The pause: the front holds, the source drains and freezes, the last tail is copied;
    /// a partition that does not drain in time is rolled back instead.
    async fn pause(&self, record: &mut MoveRecord) -> Result<MoveStep, MoveError> {
        // The histories the copy has carried, compared while the partition is live: the check
        // before the switch then fingerprints only the events after the cut (measured by
        // `ledger-bench move`: hashing the whole history grew the pause with it).
        let differs = self.compare_prefixes(record).await?;
        if !differs.is_empty() {
            let reasons: Vec<String> = differs.iter().map(ToString::to_string).collect();
            tracing::error!(move_id = %record.id, ?reasons, "a move's history check failed before the pause; it is rolled back");
            record.cancelled_at = Some(MoveStep::Pausing);
            record.reason = Some(format!(
                "check of the history before the pause: {}",
                reasons.join("; ")
            ));
            return Ok(MoveStep::Cancelling);
        }
        // Both cells' conservation checks brought up to now while the partition is live: the
        // check before the switch then reads only what came during the pause (measured by
        // `ledger-bench move`: it was most of the pause). Its answer is the check's to give.
        let (a, b) = join(
            self.stores.conservation_exact(record.from),
            self.stores.conservation_exact(record.to),
        )
        .await;
        a?;
        b?;
        // What the partition's users wrote during the two reads above, copied while they are
        // still live, so that the copy under the pause is only the drain's tail.
        self.copy_pass(record).await?;
        self.hold.hold(record.partition).await;
        if let Some(open) = self.drain(record).await? {
            tracing::warn!(move_id = %record.id, open, "a move's partition did not drain; it is rolled back");
            record.cancelled_at = Some(MoveStep::Pausing);
            record.reason = Some(format!(
                "{open} transfer(s) of the partition were still open after the drain's {} ms",
                self.settings.drain_max.as_millis()
            ));
            return Ok(MoveStep::Cancelling);
        }
        self.copy_pass(record).await?;
        Ok(MoveStep::MovingSpot)
    }

    /// The SPOT balances out of the source's engine and into the target's; a move-out the
    /// engine refuses rolls the move back (nothing left the source).
    async fn move_spot(&self, record: &mut MoveRecord) -> Result<MoveStep, MoveError> {
        let (id, p) = (record.id.0.clone(), record.partition);
        let payload = match self.spot.move_out(record.from, &id, p).await {
            Ok(payload) => payload,
            Err(e) if e.cause::<MoveOutRefused>().is_some() => {
                tracing::warn!(move_id = %record.id, error = %e, "spot-core refused a move-out; the move is rolled back");
                record.cancelled_at = Some(MoveStep::MovingSpot);
                record.reason = Some(
                    e.cause::<MoveOutRefused>()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                );
                return Ok(MoveStep::Cancelling);
            }
            Err(e) => return Err(e.into()),
        };
        self.spot.move_in(record.to, &id, p, &payload).await?;
        record.spot = Some(payload.balances);
        Ok(MoveStep::Verifying)
    }

    /// Drains and freezes the source's partition: `None` once frozen, or the number of
    /// transfers still open when `drain_max` has passed.
    async fn drain(&self, record: &MoveRecord) -> Result<Option<u64>, MoveError> {
        let deadline = self.clock.now_ms() + duration_ms(self.settings.drain_max);
        loop {
            match self.stores.freeze(record).await? {
                Freeze::Frozen => return Ok(None),
                Freeze::Draining { open } if self.clock.now_ms() >= deadline => {
                    return Ok(Some(open))
                }
                Freeze::Draining { .. } => self.clock.sleep(self.settings.drain_poll).await,
            }
        }
    }

    /// Copies batches from the marks to the source's end, saving the marks after each batch;
    /// answers the rows this pass wrote.
    async fn copy_pass(&self, record: &mut MoveRecord) -> Result<u64, MoveError> {
        let mut rows = 0;
        loop {
            let copied = self.stores.copy_batch(record).await?;
            rows += copied.rows;
            record.copied += copied.rows;
            let moved_on = copied.marks != record.marks;
            record.marks = copied.marks;
            if moved_on {
                self.save(record.step, record).await?;
            }
            if copied.at_end {
                return Ok(rows);
            }
        }
    }

    /// Both cells' histories up to the copy's mark, compared (the pause's first work): the cut
    /// is kept in the record for the check before the switch. Answers the users whose
    /// histories differ.
    async fn compare_prefixes(&self, record: &mut MoveRecord) -> Result<Vec<Mismatch>, MoveError> {
        let (source, target) = self.stores.history_prefixes(record).await?;
        let found = verify(
            &PartitionBook {
                history: source.history,
                ..PartitionBook::default()
            },
            &PartitionBook {
                history: target.history,
                ..PartitionBook::default()
            },
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        );
        record.history_cut = Some(HistoryCut {
            source: source.upto,
            target: target.upto,
        });
        Ok(found)
    }

    /// The check before the switch: the books (their histories after the pause's cut, whose
    /// prefixes the pause found equal; the whole histories for a record without a cut), the
    /// SPOT balances and both conservation checks. The two cells' reads run side by side.
    async fn check(&self, record: &MoveRecord) -> Result<Vec<Mismatch>, MoveError> {
        let (from, to, p) = (record.from, record.to, record.partition);
        let cut = record.history_cut.unwrap_or(HistoryCut {
            source: 0,
            target: 0,
        });
        // The books and the cells' checks do not depend on one another: they run side by side.
        let books = join(
            self.stores.book(from, p, cut.source),
            self.stores.book(to, p, cut.target),
        );
        let checks = join(
            self.stores.conservation_exact(from),
            self.stores.conservation_exact(to),
        );
        let ((source, target), (a, b)) = join(books, checks).await;
        let (source, target) = (source?, target?);
        let moved = record.spot.clone().unwrap_or_default();
        let mut users: Vec<UserId> = moved.keys().map(|(user, _)| *user).collect();
        users.extend(source.funding.keys().map(|(user, _)| *user));
        users.sort_unstable();
        users.dedup();
        let (target_spot, source_spot) = join(
            self.spot.balances(to, p, &users),
            self.spot.balances(from, p, &users),
        )
        .await;
        let mut found = verify(&source, &target, &moved, &target_spot?, &source_spot?);
        for (cell, exact) in [(from, a?), (to, b?)] {
            if !exact {
                found.push(Mismatch::Conservation { cell });
            }
        }
        Ok(found)
    }

    /// Undoes what the step the cancel found may have done, every call idempotent. The SPOT
    /// balances are first moved forward by the move's own id (so a late move-out or move-in of
    /// the move, still on the wire, finds it done and changes nothing), then back by the
    /// cancel's id.
    async fn roll_back(&self, record: &MoveRecord) -> Result<(), MoveError> {
        let (from, to, p) = (record.from, record.to, record.partition);
        let at = record.cancelled_at.unwrap_or(MoveStep::Planned);
        if at.spot_may_have_moved() {
            let (id, back) = (record.id.0.clone(), record.id.cancel_id());
            match self.spot.move_out(from, &id, p).await {
                // Refused: it never took effect (an applied one answers its payload again).
                Err(e) if e.cause::<MoveOutRefused>().is_some() => {}
                Err(e) => return Err(e.into()),
                Ok(out) => {
                    self.spot.move_in(to, &id, p, &out).await?;
                    let returned = self.spot.move_out(to, &back, p).await?;
                    self.spot.move_in(from, &back, p, &returned).await?;
                }
            }
        }
        if at.source_may_be_frozen() {
            self.stores.unfreeze(from, p).await?;
        }
        self.stores.void_incoming(to, p, &record.id).await?;
        self.hold.release(p).await;
        Ok(())
    }

    async fn load(&self, id: &MoveId) -> Result<MoveRecord, MoveError> {
        self.records
            .load(id)
            .await?
            .ok_or_else(|| MoveError::NotFound(id.clone()))
    }

    async fn save(&self, expected: MoveStep, record: &MoveRecord) -> Result<(), MoveError> {
        if self.records.save(expected, record).await? {
            Ok(())
        } else {
            Err(MoveError::Superseded(record.id.clone()))
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A partition move's fail point after the work of step `at`, before its next step is recorded
/// (ADR 0023 §4: the work is done and the record does not say so yet). `None` for an end.
fn step_done(at: MoveStep) -> Option<FailPoint> {
    Some(match at {
        MoveStep::Planned => FailPoint::MovePlannedDone,
        MoveStep::Copying => FailPoint::MoveCopyingDone,
        MoveStep::CatchingUp => FailPoint::MoveCatchingUpDone,
        MoveStep::Pausing => FailPoint::MovePausingDone,
        MoveStep::MovingSpot => FailPoint::MoveMovingSpotDone,
        MoveStep::Verifying => FailPoint::MoveVerifyingDone,
        MoveStep::Switching => FailPoint::MoveSwitchingDone,
        MoveStep::Cancelling => FailPoint::MoveCancellingDone,
        MoveStep::Done | MoveStep::Cancelled => return None,
    })
}
