//! The core's records in memory (`stores.rs`'s ports): the halt flag, alerts, asset settings,
//! the conservation check's records and its reads of the event log, the open transfers and the
//! failover repairs, over the same `Rows` the in-memory log keeps. A crash of a process loses
//! none of it, as a crash of `ledger serve` loses nothing PostgreSQL holds. The simulation and
//! the fast tests run the real audit, halt, horizon and repair over these.
//!
//! The log's transaction numbers (`Stream::txs`, `Durable::next_tx`) stand for PostgreSQL's
//! `tx_id`: a commit here is visible the moment it is made, so every number up to the last one
//! given is settled, and the snapshot watermark is the next one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use cqrs_es::DomainEvent;
use domain::{AssetConfig, AssetStatus, ReqId, TransferEvent, TransferState, UserId};

use crate::audit::history::{AssetResult, AuditHistory, Run, RUNS_KEPT, RUNS_READ_MAX};
use crate::audit::status::AuditHealth;
use crate::audit::{Checkpoint, CheckpointError, Checkpoints, InvariantReport};
use crate::error::StoreError;
use crate::ledger::Stores;
use crate::stores::{
    AlertLog, AssetStore, AuditTransfer, EventReads, HaltFlag, LogError, LoggedEvent,
    OpenTransfers, RepairRecords, RepairRequest, RepairRow, StoredAlert, StoredAsset,
};
use crate::testkit::rows::Rows;

/// What the records hold besides the log's rows.
#[derive(Debug, Default)]
pub struct Kept {
    /// The halt flag and its reason.
    pub halted: Option<String>,
    /// How many times a halt was set (a set flag set again counts too).
    pub halts: u64,
    pub alerts: Vec<StoredAlert>,
    pub alert_totals: BTreeMap<String, i64>,
    pub assets: BTreeMap<String, StoredAsset>,
    /// The stored checkpoint (version > 0 once stored).
    pub checkpoint: Checkpoint,
    /// Every recorded run with its report, oldest first.
    pub runs: Vec<(Run, serde_json::Value)>,
    pub health: AuditHealth,
    pub repairs: BTreeMap<ReqId, (RepairRow, Option<TransferState>)>,
}

/// The core's records in memory. Cheap to clone; clones share everything.
#[derive(Debug, Clone, Default)]
pub struct MemRecords {
    rows: Rows,
    kept: Arc<Mutex<Kept>>,
}

impl MemRecords {
    /// Over the log's rows (the event reads and the open transfers read them).
    pub fn new(rows: Rows) -> Self {
        Self {
            rows,
            kept: Arc::default(),
        }
    }

    /// What is kept, locked.
    pub fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `checkpoint` as if a run had (the books a world opens with: its seeded deposits
    /// and the positions below which everything was seeded).
    pub fn open_books(&self, mut checkpoint: Checkpoint) {
        checkpoint.version = checkpoint.version.max(1);
        self.kept().checkpoint = checkpoint;
    }

    /// One of each port over these records.
    pub fn stores(&self) -> Stores {
        let me = Arc::new(self.clone());
        Stores {
            halt: me.clone(),
            alerts: me.clone(),
            assets: me.clone(),
            events: me.clone(),
            checkpoints: me.clone(),
            history: me.clone(),
            open: me.clone(),
            repairs: me,
        }
    }
}

#[async_trait]
impl HaltFlag for MemRecords {
    async fn halt(&self, reason: &str) -> Result<(), StoreError> {
        let mut kept = self.kept();
        kept.halts += 1;
        kept.halted.get_or_insert_with(|| reason.to_owned());
        Ok(())
    }

    async fn is_halted(&self) -> Result<bool, StoreError> {
        Ok(self.kept().halted.is_some())
    }

    async fn status(&self) -> Result<(bool, Option<String>), StoreError> {
        let halted = self.kept().halted.clone();
        Ok((halted.is_some(), halted))
    }

    async fn clear(&self, _admin: UserId) -> Result<(), StoreError> {
        self.kept().halted = None;
        Ok(())
    }
}

#[async_trait]
impl AlertLog for MemRecords {
    async fn record(
        &self,
        code: &str,
        severity: &str,
        user: Option<UserId>,
        detail: &str,
    ) -> Result<(), StoreError> {
        let mut kept = self.kept();
        let id = i64::try_from(kept.alerts.len()).unwrap_or(i64::MAX) + 1;
        kept.alerts.push(StoredAlert {
            id,
            code: code.to_owned(),
            severity: severity.to_owned(),
            user_id: user.map(|u| u.as_i64()),
            at: Utc::now(),
            detail: detail.to_owned(),
        });
        *kept.alert_totals.entry(code.to_owned()).or_default() += 1;
        Ok(())
    }

    async fn recent(&self, limit: i64) -> Result<Vec<StoredAlert>, StoreError> {
        let kept = self.kept();
        let n = usize::try_from(limit).unwrap_or(0);
        Ok(kept.alerts.iter().rev().take(n).cloned().collect())
    }

    async fn total(&self, code: &str) -> Result<i64, StoreError> {
        Ok(self.kept().alert_totals.get(code).copied().unwrap_or(0))
    }
}

#[async_trait]
impl AssetStore for MemRecords {
    async fn put(&self, a: &AssetConfig) -> Result<(), StoreError> {
        let row = StoredAsset {
            symbol: a.symbol.as_str().to_owned(),
            precision: i32::try_from(a.precision).unwrap_or(i32::MAX),
            min_transfer_amount: a.min_transfer_amount,
            max_transfer_amount: a.max_transfer_amount,
            status: match a.status {
                AssetStatus::Active => "ACTIVE",
                AssetStatus::Suspended => "SUSPENDED",
            }
            .to_owned(),
            internal_transfer_enabled: a.internal_transfer_enabled,
            updated_at: Utc::now(),
        };
        self.kept().assets.insert(row.symbol.clone(), row);
        Ok(())
    }

    async fn rows(&self) -> Result<Vec<StoredAsset>, StoreError> {
        Ok(self.kept().assets.values().cloned().collect())
    }

    async fn write(&self, row: &StoredAsset) -> Result<(), StoreError> {
        self.kept().assets.insert(row.symbol.clone(), row.clone());
        Ok(())
    }
}

#[async_trait]
impl EventReads for MemRecords {
    async fn transfer_events(&self, req_id: &ReqId) -> Result<Vec<LoggedEvent>, LogError> {
        let rows = self.rows.lock();
        let Some(stream) = rows.streams.get(req_id) else {
            return Ok(Vec::new());
        };
        Ok(stream
            .events
            .iter()
            .zip(1i64..)
            .map(|(event, sequence)| LoggedEvent {
                sequence,
                event_type: event.event_type(),
                event_version: "1.0".to_owned(),
                event: event.clone(),
                global_position: sequence,
            })
            .collect())
    }

    async fn audit_transfers(
        &self,
        since: u64,
        ids: &[String],
    ) -> Result<(u64, Vec<AuditTransfer>), LogError> {
        let rows = self.rows.lock();
        let watermark = rows.next_tx + 1;
        let mut read = Vec::new();
        for (req_id, stream) in &rows.streams {
            let id = req_id.to_string();
            let after = stream.txs.iter().any(|tx| *tx >= since);
            if !after && !ids.contains(&id) {
                continue;
            }
            let (Some(created @ TransferEvent::TransferCreated { .. }), Some(state)) =
                (stream.events.first(), stream.state())
            else {
                return Err(LogError::Undecodable {
                    req_id: id,
                    problem: "the first event is not TransferCreated".into(),
                });
            };
            read.push(AuditTransfer {
                req_id: id,
                created: created.clone(),
                created_tx: stream.txs.first().copied().unwrap_or(0),
                state,
            });
        }
        Ok((watermark, read))
    }
}

#[async_trait]
impl Checkpoints for MemRecords {
    async fn load_checkpoint(&self) -> Result<Checkpoint, CheckpointError> {
        Ok(self.kept().checkpoint.clone())
    }

    async fn store_checkpoint(
        &self,
        read: i64,
        next: &Checkpoint,
    ) -> Result<bool, CheckpointError> {
        let mut kept = self.kept();
        if kept.checkpoint.version != read {
            return Ok(false);
        }
        kept.checkpoint = Checkpoint {
            version: read + 1,
            ..next.clone()
        };
        Ok(true)
    }
}

#[async_trait]
impl AuditHistory for MemRecords {
    async fn store_report(&self, report: &InvariantReport) -> Result<i64, StoreError> {
        let json = serde_json::to_value(report).map_err(StoreError::new)?;
        let mut kept = self.kept();
        let id = i64::try_from(kept.runs.len()).unwrap_or(i64::MAX) + 1;
        kept.runs.push((
            Run {
                id,
                checked_at: report.checked_at,
                mode: report.mode,
                ok: report.ok,
                duration_ms: 0,
                violations: 0,
                assets: Vec::new(),
                has_report: true,
            },
            json,
        ));
        let kept_max = usize::try_from(RUNS_KEPT).unwrap_or(usize::MAX);
        if kept.runs.len() > kept_max {
            let extra = kept.runs.len() - kept_max;
            kept.runs.drain(..extra);
        }
        Ok(id)
    }

    async fn record_run(
        &self,
        report: &InvariantReport,
        took: Duration,
        report_id: Option<i64>,
    ) -> Result<(), StoreError> {
        let violations =
            report.assets.iter().filter(|a| !a.ok).count() + report.disagreements.len();
        let mut kept = self.kept();
        if let Some(run) = kept.runs.iter_mut().find(|(r, _)| Some(r.id) == report_id) {
            run.0.duration_ms = i64::try_from(took.as_millis()).unwrap_or(i64::MAX);
            run.0.violations = i32::try_from(violations).unwrap_or(i32::MAX);
            run.0.assets = report
                .assets
                .iter()
                .map(|a| AssetResult {
                    asset: a.asset.clone(),
                    ok: a.ok,
                    difference: a.difference.normalize().to_string(),
                })
                .collect();
        }
        Ok(())
    }

    async fn recent_runs(&self, limit: i64) -> Result<Vec<Run>, StoreError> {
        let n = usize::try_from(limit.clamp(1, RUNS_READ_MAX)).unwrap_or(1);
        Ok(self
            .kept()
            .runs
            .iter()
            .rev()
            .take(n)
            .map(|(run, _)| run.clone())
            .collect())
    }

    async fn report(&self, run_id: i64) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(self
            .kept()
            .runs
            .iter()
            .find(|(run, _)| run.id == run_id)
            .map(|(_, json)| json.clone()))
    }

    async fn health(&self) -> Result<AuditHealth, StoreError> {
        Ok(self.kept().health.clone())
    }

    async fn record_decided(&self, took: Duration) -> Result<(), StoreError> {
        let mut kept = self.kept();
        kept.health.up = true;
        kept.health.last_duration_seconds = took.as_secs_f64();
        kept.health.last_success_at = Some(Utc::now());
        kept.health.last_error = None;
        Ok(())
    }

    async fn record_failed(&self, took: Duration, error: &str) -> Result<(), StoreError> {
        let mut kept = self.kept();
        kept.health.up = false;
        kept.health.failures += 1;
        kept.health.last_duration_seconds = took.as_secs_f64();
        kept.health.last_error = Some(error.to_owned());
        Ok(())
    }
}

#[async_trait]
impl OpenTransfers for MemRecords {
    async fn oldest(&self) -> Result<Option<String>, StoreError> {
        let rows = self.rows.lock();
        Ok(rows
            .streams
            .iter()
            .find(|(_, s)| s.state().is_some_and(|state| !state.is_terminal()))
            .map(|(id, _)| id.to_string()))
    }
}

#[async_trait]
impl RepairRecords for MemRecords {
    async fn find(&self, req_id: &ReqId) -> Result<Option<RepairRow>, StoreError> {
        Ok(self.kept().repairs.get(req_id).map(|(row, _)| row.clone()))
    }

    async fn insert(&self, r: &RepairRequest<'_>) -> Result<bool, StoreError> {
        let mut kept = self.kept();
        if kept.repairs.contains_key(r.req_id) {
            return Ok(false);
        }
        let row = RepairRow {
            user_id: r.user_id,
            from_type: r.from_type.to_owned(),
            to_type: r.to_type.to_owned(),
            asset: r.asset.to_owned(),
            amount: r.amount,
            operator: r.operator.to_owned(),
            reason: r.reason.to_owned(),
            requested_at: Utc::now(),
        };
        kept.repairs.insert(*r.req_id, (row, None));
        Ok(true)
    }

    async fn finish(&self, req_id: &ReqId, state: TransferState) -> Result<(), StoreError> {
        if let Some((_, end)) = self.kept().repairs.get_mut(req_id) {
            end.get_or_insert(state);
        }
        Ok(())
    }
}
