//! The conservation check as a command: run once now (the admin route, `ledger audit`) or
//! periodically (the edge's start-up), recorded in the run history, and enforced: a violation
//! raises the CRITICAL alert and halts new transfers.

use std::time::Duration;

use super::Ledger;
use crate::audit::{self, CheckError, InvariantReport, Mode};

impl Ledger {
    /// Runs the conservation check (`Mode::Incremental`: from the stored checkpoint, which
    /// it advances; `Mode::Full`: from the start of history), records it, and on a violation
    /// raises the CRITICAL alert and halts new transfers. Returns the report and whether
    /// transfers are halted now.
    pub async fn audit(&self, mode: Mode) -> Result<(InvariantReport, bool), CheckError> {
        let checked = self.audit_and_enforce(mode).await;
        self.halt.invalidate();
        checked
    }

    async fn audit_and_enforce(&self, mode: Mode) -> Result<(InvariantReport, bool), CheckError> {
        let records = self.stores.history.as_ref();
        let started = std::time::Instant::now();
        let report = match mode {
            Mode::Incremental => audit::check_incremental(self.audit_sources()).await?,
            Mode::Full => audit::check_full(self.audit_sources()).await?,
        };
        let took = started.elapsed();
        let report_id = records.store_report(&report).await?;
        if let Err(e) = records.record_run(&report, took, Some(report_id)).await {
            tracing::warn!(error = %e, "could not record the check in the run history");
        }
        if !report.ok {
            tracing::error!(
                alert = "CRITICAL",
                code = "FUND_CONSERVATION_VIOLATED",
                report = %serde_json::to_value(&report).unwrap_or_default(),
                "CRITICAL: fund conservation violated; new transfers are halted until an admin clears it"
            );
            for d in &report.disagreements {
                tracing::error!(
                    alert = "CRITICAL",
                    code = "RECORDS_DISAGREE",
                    req_id = %d.req_id,
                    state = d.state.as_deref().unwrap_or("none"),
                    problem = %d.problem,
                    "CRITICAL RECORDS_DISAGREE: req_id {}: {}",
                    d.req_id,
                    d.problem
                );
            }
            self.stores.halt.halt("fund conservation violated").await?;
        }
        let halted = self.stores.halt.is_halted().await?;
        Ok((report, halted))
    }

    /// What the conservation check reads, as this ledger is wired.
    pub fn audit_sources(&self) -> audit::Sources<'_> {
        audit::Sources {
            log: self.stores.events.as_ref(),
            funding: self.funding.as_ref(),
            spot: self.spot.as_ref(),
            checkpoints: self.stores.checkpoints.as_ref(),
        }
    }

    /// Runs the incremental check every `interval` forever; the edge's start-up runs this. A
    /// check that cannot decide (spot-core down, checkpoint unreadable, PostgreSQL gone) never
    /// halts, but it is an alert, not only a log line: `CRITICAL AUDIT_UNAVAILABLE` once per
    /// episode (a warning at each further failure), and `audit_status` (the `/metrics` figures
    /// `ledger_audit_up`, `ledger_audit_failures_total`) records every run.
    pub async fn audit_periodically(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick fires at once; skip it so a process starting up is not checked
        // half-wired.
        ticker.tick().await;
        let mut unavailable = false;
        loop {
            ticker.tick().await;
            let started = std::time::Instant::now();
            let outcome = self.audit(Mode::Incremental).await;
            let took = started.elapsed();
            let recorded = match &outcome {
                Ok((report, _)) => {
                    if report.ok {
                        tracing::debug!(seconds = took.as_secs_f64(), "fund conservation holds");
                    }
                    if unavailable {
                        tracing::info!("the periodic fund-conservation check runs again");
                        unavailable = false;
                    }
                    self.stores.history.record_decided(took).await
                }
                Err(e) => {
                    let detail = crate::error_chain(e);
                    if unavailable {
                        tracing::warn!(error = %detail, "fund-conservation check still cannot run");
                    } else {
                        tracing::error!(
                            alert = "CRITICAL",
                            code = "AUDIT_UNAVAILABLE",
                            error = %detail,
                            "CRITICAL AUDIT_UNAVAILABLE: the periodic fund-conservation check cannot run; money is not being checked"
                        );
                        unavailable = true;
                    }
                    self.stores.history.record_failed(took, &detail).await
                }
            };
            if let Err(e) = recorded {
                tracing::warn!(error = %e, "could not record the audit's status");
            }
        }
    }
}
