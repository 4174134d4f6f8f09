//! The conservation check (contract §4), exact: per asset, FUNDING + SPOT + in-flight equals the
//! external deposits, where in-flight is reconciled from what each account system actually
//! applied, keyed by req_id (the funding journal and spot-core's journal), not guessed from
//! transfer states. Every transfer whose records disagree with its events is reported. A real
//! violation raises a CRITICAL alert and halts new transfers (MON-003) until an admin clears it.
//!
//! Incremental (docs/adr/0006-incremental-audit.md): a durable checkpoint ([`checkpoint`]) holds
//! the per-asset sums of everything consumed, the positions below which everything was consumed
//! (an event-log and a funding snapshot watermark, stored as `events_horizon` and
//! `funding_horizon`, and a spot-core seq), and the applied movements
//! of every req_id not yet settled. A run reads only what came after those positions, the live
//! totals (balances per account, spot-core's totals) and the open req_ids' transfers by key, so
//! its cost follows new work and what is live, not history. A full check is the same run from
//! an empty checkpoint, not stored: the two agree by construction and a test proves it.
//!
//! Why it cannot raise a false alarm on a transfer caught between an adapter call and its
//! recorded outcome: a movement counts as in flight from the moment its system applied it,
//! whatever the transfer's state says. And the per-transfer check reads the events twice, before
//! and after the journals: what the earlier events say *must* have been applied
//! (`TransferState::requires`) is looked for in the (later) journals, and what the journals show
//! applied must be *allowed* (`TransferState::allows`) by the (later) events, so a transfer
//! moving on during the check is never mistaken for a broken one.

pub mod checkpoint;
pub mod history;
mod reconcile;
pub mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::books::{
    AppliedMovement, FundingBook, FundingError, FundingItem, FundingRead, SpotBook, SpotError,
    SpotRead, SpotReadError,
};
use crate::error::StoreError;
use crate::stores::{EventReads, LogError};
use chrono::{DateTime, Utc};
use domain::{Operation, TransferState};
use rust_decimal::Decimal;
use serde::Serialize;

pub use checkpoint::{Checkpoint, CheckpointError, Checkpoints};
pub use reconcile::Disagreement;
use reconcile::Known;

/// One asset's sums.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AssetReport {
    pub asset: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub deposits: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub funding: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub spot: Decimal,
    /// Reconciled: applied withdraws minus applied deposits and refunds, per req_id, in both
    /// systems.
    #[serde(with = "rust_decimal::serde::str")]
    pub in_flight: Decimal,
    /// The original specification's estimate from states (contract §4: SOURCE_DONE, TARGET_PENDING, COMPENSATING), for
    /// comparison; it differs from `in_flight` only for transfers caught mid-step.
    #[serde(with = "rust_decimal::serde::str")]
    pub in_flight_by_state: Decimal,
    /// Moved in with partitions minus moved out (ADR 0023 §5): the FUNDING totals each switch
    /// recorded, and the SPOT balances of the engine's `move_in`/`move_out` records. Zero in a
    /// cell no partition ever left or entered.
    #[serde(with = "rust_decimal::serde::str")]
    pub moved: Decimal,
    /// funding + spot + in_flight - deposits - moved: zero when money is conserved.
    #[serde(with = "rust_decimal::serde::str")]
    pub difference: Decimal,
    pub ok: bool,
}

/// Which check ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// From the stored checkpoint; the result is stored as the next one.
    Incremental,
    /// From the start of history; nothing is stored.
    Full,
}

/// Where a run stands: everything below these was consumed (for an incremental run, the
/// checkpoint it stored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Positions {
    /// Event-log snapshot watermark (`xid8`; the stored and reported name keeps "horizon").
    pub events_horizon: u64,
    /// Funding journal and external deposits snapshot watermark (`xid8`).
    pub funding_horizon: u64,
    pub spot_seq: u64,
}

/// What a run read after its starting positions (its cost).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReadCounts {
    /// Transfers read by key: those with events after the start, and the open ones.
    pub transfers: u64,
    pub funding_journal_rows: u64,
    pub external_deposit_rows: u64,
    pub spot_records: u64,
    /// req_ids carried over from the checkpoint (open transfers and open disagreements).
    pub open_before: u64,
    /// req_ids the run leaves open.
    pub open_after: u64,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvariantReport {
    pub ok: bool,
    pub checked_at: DateTime<Utc>,
    pub assets: Vec<AssetReport>,
    /// Sorted by req_id, then problem.
    pub disagreements: Vec<Disagreement>,
    pub transfers_checked: usize,
    pub mode: Mode,
    /// Where the run started.
    pub from: Positions,
    /// Where it ended (what an incremental run stored).
    pub positions: Positions,
    pub read: ReadCounts,
    /// Whether an incremental run stored its checkpoint (false when another run stored one
    /// first, and always for a full run).
    pub stored: bool,
}

/// Why a check could not decide.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("store")]
    Store(#[from] StoreError),
    #[error("funding ledger")]
    Funding(#[from] FundingError),
    #[error("spot-core")]
    Spot(#[from] SpotError),
    #[error(transparent)]
    SpotJournalCompacted(SpotReadError),
    #[error("event log")]
    Log(#[from] LogError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl From<SpotReadError> for CheckError {
    fn from(e: SpotReadError) -> Self {
        match e {
            SpotReadError::Spot(e) => Self::Spot(e),
            compacted => Self::SpotJournalCompacted(compacted),
        }
    }
}

/// What one check reads: the event log, both account systems, and its own records (the
/// checkpoint an incremental run starts from and stores).
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    pub log: &'a dyn EventReads,
    pub funding: &'a dyn FundingBook,
    pub spot: &'a dyn SpotBook,
    pub checkpoints: &'a dyn Checkpoints,
}

/// The incremental check: from the stored checkpoint, storing the next one, then telling
/// spot-core it may compact its journal up to the stored seq.
pub async fn check_incremental(src: Sources<'_>) -> Result<InvariantReport, CheckError> {
    let start = src.checkpoints.load_checkpoint().await?;
    let (mut report, next) = run(src, &start, Mode::Incremental).await?;
    report.stored = src
        .checkpoints
        .store_checkpoint(start.version, &next)
        .await?;
    if !report.stored {
        tracing::debug!("another audit run stored its checkpoint first; this one is not kept");
    } else if report.read.spot_records > 0 {
        // Only when something besides the previous run's own mark was consumed: a mark is a
        // record too, and marking it would write one more at every run, forever.
        // Only after the checkpoint is durable: spot-core may then drop what it consumed.
        // A refusal costs nothing but disk (spot-core keeps more), so it never fails the check.
        // Whether it may have been taken anyway (`outcome_unknown`) changes nothing: a later
        // retain covers it.
        if let Err(e) = src.spot.retain(next.spot_seq).await {
            tracing::warn!(seq = next.spot_seq, error = %e, outcome_unknown = e.outcome_unknown(), "spot-core did not take the audit's retain position");
        }
    }
    Ok(report)
}

/// The full check: every event, journal row and spot-core record from the start of history
/// (streamed, never held whole), nothing stored. Exact like the incremental one and must agree
/// with it.
pub async fn check_full(src: Sources<'_>) -> Result<InvariantReport, CheckError> {
    let (report, _) = run(src, &Checkpoint::default(), Mode::Full).await?;
    Ok(report)
}

/// The full check (tests and tools call it by this name).
pub async fn check(src: Sources<'_>) -> Result<InvariantReport, CheckError> {
    check_full(src).await
}

/// What came after the checkpoint's positions, split into what is consumed (stored in the next
/// checkpoint) and what is only visible (counted now, read again next run).
#[derive(Default)]
struct NewWork {
    deposits: BTreeMap<String, Decimal>,
    deposits_consumed: BTreeMap<String, Decimal>,
    /// Applied movements by req_id: (consumed, visible above the watermark).
    applied: BTreeMap<String, (Vec<AppliedMovement>, Vec<AppliedMovement>)>,
}

impl NewWork {
    fn take(&mut self, item: FundingItem) {
        match item {
            FundingItem::Deposits {
                asset,
                sum,
                consumed,
                ..
            } => {
                *self.deposits.entry(asset.clone()).or_default() += sum;
                if consumed {
                    *self.deposits_consumed.entry(asset).or_default() += sum;
                }
            }
            FundingItem::Applied { movement, consumed } => self.movement(movement, consumed),
        }
    }

    fn movement(&mut self, movement: AppliedMovement, consumed: bool) {
        let (done, visible) = self.applied.entry(movement.req_id.clone()).or_default();
        if consumed {
            done.push(movement);
        } else {
            visible.push(movement);
        }
    }
}

/// Adds a movement to an asset's in-flight sum: withdraws in, deposits and refunds out.
fn add_in_flight(sum: &mut Decimal, m: &AppliedMovement) {
    match m.operation {
        Operation::Withdraw => *sum += m.amount,
        Operation::Deposit | Operation::Refund => *sum -= m.amount,
    }
}

/// One run from `start`: reads the events (before), the funding side, spot-core, the events
/// again (after); returns the report and the checkpoint to store next.
async fn run(
    src: Sources<'_>,
    start: &Checkpoint,
    mode: Mode,
) -> Result<(InvariantReport, Checkpoint), CheckError> {
    let reads = read_after(src, start).await?;
    let mut next = Checkpoint {
        version: 0,
        events_horizon: reads.events_watermark,
        funding_horizon: reads.funding.watermark,
        spot_seq: reads.spot.last_seq,
        transfers: start.transfers,
        assets: start.assets.clone(),
        moved: start.moved.clone(),
        open: BTreeMap::new(),
    };
    let (mut assets, transfers_checked) = sum_assets(start, &reads, &mut next);
    let disagreements = reconcile_req_ids(start, &reads, &mut assets, &mut next);
    let assets = finish_assets(assets);
    let report = InvariantReport {
        ok: assets.iter().all(|a| a.ok) && disagreements.is_empty(),
        checked_at: Utc::now(),
        assets,
        disagreements,
        transfers_checked: usize::try_from(transfers_checked).unwrap_or(usize::MAX),
        mode,
        from: positions(start),
        positions: positions(&next),
        read: ReadCounts {
            transfers: reads.transfers_read,
            funding_journal_rows: reads.funding.journal_rows,
            external_deposit_rows: reads.funding.deposit_rows,
            spot_records: reads.spot.records,
            open_before: start.open.len() as u64,
            open_after: next.open.len() as u64,
        },
        stored: false,
    };
    Ok((report, next))
}

/// Everything one run reads after the checkpoint's positions.
struct Reads {
    /// The event-log snapshot watermark stored next: every event below it was visible to this run.
    events_watermark: u64,
    /// Transfer states before the journals were read (what must have been applied).
    before: HashMap<String, TransferState>,
    new: NewWork,
    funding: FundingRead,
    spot: SpotRead,
    /// Details and state after the journals of every transfer the run meets.
    known: HashMap<String, Known>,
    transfers_read: u64,
}

/// The reads, in the order that keeps a transfer moving on during the run from looking broken:
/// the events (before), the funding side, spot-core, the events again (after).
async fn read_after(src: Sources<'_>, start: &Checkpoint) -> Result<Reads, CheckError> {
    let open_ids: Vec<String> = start.open.keys().cloned().collect();
    // Before: the watermark stored next (every event below it is visible in this snapshot), and
    // the states the requirements are taken from.
    let (events_watermark, before) = src
        .log
        .audit_transfers(start.events_horizon, &open_ids)
        .await?;
    let before: HashMap<String, TransferState> =
        before.into_iter().map(|t| (t.req_id, t.state)).collect();

    let mut new = NewWork::default();
    let funding_read = src
        .funding
        .audit_read(start.funding_horizon, &mut |item| new.take(item))
        .await?;
    // spot-core's journal is commit-ordered (one seq per applied record, synced before it is
    // served): everything read is consumed.
    let spot_read = src
        .spot
        .audit_read(start.spot_seq, &mut |m| new.movement(m, true))
        .await?;

    // After: the details and current state of every transfer the run meets.
    let mut ids = open_ids;
    ids.extend(
        new.applied
            .keys()
            .filter(|id| !start.open.contains_key(*id))
            .cloned(),
    );
    let (_, after) = src.log.audit_transfers(start.events_horizon, &ids).await?;
    let transfers_read = after.len() as u64;
    // Consumed as it is turned into the compact form: the two are never both held whole.
    let known: HashMap<String, Known> = after
        .into_iter()
        .filter_map(|t| Known::from_log(&t).map(|k| (t.req_id, k)))
        .collect();
    Ok(Reads {
        events_watermark,
        before,
        new,
        funding: funding_read,
        spot: spot_read,
        known,
        transfers_read,
    })
}

/// Per-asset sums (the checkpoint's, then what was read) and the count of transfers checked;
/// the consumed deposits and transfers go into `next`.
fn sum_assets(
    start: &Checkpoint,
    reads: &Reads,
    next: &mut Checkpoint,
) -> (BTreeMap<String, AssetReport>, u64) {
    let mut assets: BTreeMap<String, AssetReport> = BTreeMap::new();
    for (asset, (deposits, in_flight)) in &start.assets {
        let a = entry(&mut assets, asset);
        a.deposits += *deposits;
        a.in_flight += *in_flight;
    }
    for (asset, sum) in &reads.new.deposits {
        entry(&mut assets, asset).deposits += *sum;
    }
    for (asset, sum) in &reads.new.deposits_consumed {
        next.assets.entry(asset.clone()).or_default().0 += *sum;
    }
    for (asset, sum) in &reads.funding.balances {
        entry(&mut assets, asset).funding += *sum;
    }
    for (asset, sum) in &reads.spot.totals {
        entry(&mut assets, asset).spot += *sum;
    }
    // Moves: the engine's consumed for good (stored), the switches' FUNDING totals live.
    for (asset, sum) in start.moved.iter().chain(&reads.funding.moved) {
        entry(&mut assets, asset).moved += *sum;
    }
    for (asset, sum) in &reads.spot.moved {
        entry(&mut assets, asset).moved += *sum;
        *next.moved.entry(asset.clone()).or_default() += *sum;
    }
    let mut transfers_checked = start.transfers;
    for t in reads.known.values() {
        if t.state.is_in_flight() {
            entry(&mut assets, &t.asset).in_flight_by_state += t.amount;
        }
        if t.created_tx >= start.events_horizon {
            transfers_checked += 1;
            if t.created_tx < reads.events_watermark {
                next.transfers += 1;
            }
        }
    }
    (assets, transfers_checked)
}

/// Every req_id met (open before, in the log, or in a journal): its movements counted in
/// flight, checked against its events, kept open in `next` until settled. Returns the
/// disagreements, sorted.
fn reconcile_req_ids(
    start: &Checkpoint,
    reads: &Reads,
    assets: &mut BTreeMap<String, AssetReport>,
    next: &mut Checkpoint,
) -> Vec<Disagreement> {
    let empty = (Vec::new(), Vec::new());
    let mut disagreements = Vec::new();
    let every: BTreeSet<&String> = start
        .open
        .keys()
        .chain(reads.known.keys())
        .chain(reads.new.applied.keys())
        .collect();
    for req_id in every {
        let t = reads.known.get(req_id);
        let (consumed_new, visible) = reads.new.applied.get(req_id).unwrap_or(&empty);
        // What was consumed before this run: the stored movements of an open req_id, or, for
        // a transfer met again after it was settled (not open, created below the stored
        // watermark: every such transfer was met by an earlier run and either kept open or
        // settled), exactly the movements settling it required.
        let mut consumed = match (start.open.get(req_id), t) {
            (Some(stored), _) => stored.clone(),
            (None, Some(t)) if t.created_tx < start.events_horizon && t.state.is_terminal() => {
                t.settled_movements(req_id)
            }
            _ => Vec::new(),
        };
        for m in consumed_new {
            add_in_flight(&mut entry(assets, &m.asset).in_flight, m);
            add_in_flight(&mut next.assets.entry(m.asset.clone()).or_default().1, m);
        }
        for m in visible {
            add_in_flight(&mut entry(assets, &m.asset).in_flight, m);
        }
        consumed.extend(consumed_new.iter().cloned());
        let mut all = consumed.clone();
        all.extend(visible.iter().cloned());
        reconcile::applied_disagreements(req_id, &all, t, &mut disagreements);
        if let (Some(state), Some(t)) = (reads.before.get(req_id), t) {
            reconcile::missing_movements(req_id, *state, &all, t, &mut disagreements);
        }
        if !reconcile::is_settled(t, &consumed, reads.events_watermark) {
            next.open.insert(req_id.clone(), consumed);
        }
    }
    disagreements.sort();
    disagreements
}

/// Each asset's difference (zero when money is conserved) and its figures normalized.
fn finish_assets(assets: BTreeMap<String, AssetReport>) -> Vec<AssetReport> {
    let mut assets: Vec<AssetReport> = assets.into_values().collect();
    for a in &mut assets {
        a.difference = a.funding + a.spot + a.in_flight - a.deposits - a.moved;
        a.ok = a.difference.is_zero();
        a.deposits = a.deposits.normalize();
        a.funding = a.funding.normalize();
        a.spot = a.spot.normalize();
        a.in_flight = a.in_flight.normalize();
        a.in_flight_by_state = a.in_flight_by_state.normalize();
        a.moved = a.moved.normalize();
        a.difference = a.difference.normalize();
    }
    assets
}

fn positions(c: &Checkpoint) -> Positions {
    Positions {
        events_horizon: c.events_horizon,
        funding_horizon: c.funding_horizon,
        spot_seq: c.spot_seq,
    }
}

fn entry<'a>(assets: &'a mut BTreeMap<String, AssetReport>, asset: &str) -> &'a mut AssetReport {
    assets
        .entry(asset.to_owned())
        .or_insert_with(|| AssetReport {
            asset: asset.to_owned(),
            ..AssetReport::default()
        })
}
