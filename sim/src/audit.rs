//! The conservation check and the halt in the simulation: the product's own `Ledger::audit`
//! (the incremental check from the stored checkpoint, then the halt on a violation) over the
//! in-memory records (`application::testkit::MemRecords`, on the run's rows), the simulated
//! funding ledger's books (`SimFunding` as `FundingBook`) and spot-core's real adapter over the
//! simulated network (faults included).
//!
//! The books open with a checkpoint that holds the seeded money as external deposits and lies
//! past every seeded record (`open_books`). An auditor process checks every few seconds during
//! the fault phase, like the periodic check of `ledger serve`, and once more at quiescence
//! (`final_check`). What must hold (`judge`):
//! - on a run with no violation of the simulation's own, the check never reported a violation
//!   and never halted: no false alarm, whatever the faults and the interleaving;
//! - on a run with a planted mismatch (`Config::tamper`: money that appears in a FUNDING
//!   account with no movement behind it), the final check reports it and transfers are halted,
//!   and a new request through the ledger's front door is refused SERVICE_HALTED.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use adapters::SpotAdapter;
use application::audit::{Checkpoint, InvariantReport, Mode};
use application::testkit::MemRecords;
use application::{Coordinator, Ledger, RequestError, TransferRequest};
use domain::{AssetRegistry, ErrorCode, UserId};
use rust_decimal::Decimal;

use crate::cast::OUTSIDE;
use crate::exec::{Executor, Role, Step};
use crate::ports::funding::SimFunding;
use crate::ports::spot::SimSpot;
use crate::ports::Sim;
use crate::world::World;

/// How often the auditor checks during the fault phase (simulated time).
const EVERY_MS: u64 = 5_000;

/// The auditor's ledger and what its checks came to.
#[derive(Clone)]
pub struct Auditor {
    pub ledger: Ledger,
    pub records: MemRecords,
    /// The violations the periodic checks reported, by check.
    pub alarms: Arc<Mutex<Vec<String>>>,
}

/// The books as the world opens them: the seeded money in both systems as external deposits,
/// and positions past every seeded record, as a check that consumed them would have stored.
pub fn open_books(w: &World, records: &MemRecords) {
    let mut assets: BTreeMap<String, (Decimal, Decimal)> = BTreeMap::new();
    for ((_, asset), sum) in &w.deposits {
        assets.entry(asset.clone()).or_default().0 += *sum;
    }
    records.open_books(Checkpoint {
        version: 1,
        events_horizon: w.rows.lock().next_tx + 1,
        funding_horizon: w.funding.last_tx + 1,
        spot_seq: w.engine.last_seq(),
        transfers: 0,
        assets,
        moved: BTreeMap::new(),
        open: BTreeMap::new(),
    });
}

/// The auditor: a ledger over the coordinator of process `coordinator`, the in-memory records
/// on the run's rows, and both account systems as its books.
pub fn auditor(
    sim: &Sim,
    coordinator: Coordinator,
    registry: Arc<RwLock<AssetRegistry>>,
) -> Auditor {
    let records = MemRecords::new(sim.world().rows.clone());
    open_books(&sim.world(), &records);
    let ledger = Ledger::from_parts(
        coordinator,
        records.stores(),
        Arc::new(SimFunding { sim: sim.clone() }),
        Arc::new(SpotAdapter::over(Arc::new(SimSpot { sim: sim.clone() }))),
        registry,
    );
    Auditor {
        ledger,
        records,
        alarms: Arc::default(),
    }
}

/// Starts the periodic check in the outside process (stopped with it at quiescence).
pub fn spawn_periodic(sim: &Sim, auditor: &Auditor) {
    let (s, a) = (sim.clone(), auditor.clone());
    sim.rt.spawn(OUTSIDE, Role::Operator, async move {
        loop {
            s.rt.sleep(Duration::from_millis(EVERY_MS)).await;
            match a.ledger.audit(Mode::Incremental).await {
                Ok((report, halted)) => {
                    s.world()
                        .note(|| format!("audit: ok={} halted={halted}", report.ok));
                    if !report.ok {
                        a.alarms
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(summary(&report));
                    }
                }
                // Spot-core out of reach, or a checkpoint stored by nobody else: the check could
                // not decide, which halts nothing.
                Err(e) => s
                    .world()
                    .note(|| format!("audit could not decide: {}", application::error_chain(&e))),
            }
        }
    });
}

fn summary(report: &InvariantReport) -> String {
    let assets: Vec<String> = report
        .assets
        .iter()
        .filter(|a| !a.ok)
        .map(|a| format!("{} off by {}", a.asset, a.difference))
        .collect();
    let records: Vec<String> = report
        .disagreements
        .iter()
        .map(|d| format!("{}: {}", d.req_id, d.problem))
        .collect();
    format!(
        "assets [{}], records [{}]",
        assets.join(", "),
        records.join("; ")
    )
}

/// The check at quiescence, run to its end on the executor (faults are off by then): its
/// report, whether transfers are halted, and whether a new request was refused as halted.
pub fn final_check(
    exec: &mut Executor,
    sim: &Sim,
    auditor: &Auditor,
) -> Option<(InvariantReport, bool, bool)> {
    let out: Arc<Mutex<Option<(InvariantReport, bool, bool)>>> = Arc::default();
    let (a, o) = (auditor.clone(), out.clone());
    sim.rt.spawn(OUTSIDE, Role::System, async move {
        let Ok((report, halted)) = a.ledger.audit(Mode::Incremental).await else {
            return;
        };
        let refused = if halted {
            let request = TransferRequest {
                user_id: UserId::new(1).unwrap_or_else(|_| unreachable!("user 1 is valid")),
                from: "FUNDING".into(),
                to: "SPOT".into(),
                asset: "USDT".into(),
                amount: Some("1".into()),
                cid: None,
            };
            matches!(
                a.ledger.request_transfer(request).await,
                Err(RequestError::Refused(ErrorCode::ServiceHalted))
            )
        } else {
            false
        };
        *o.lock().unwrap_or_else(|e| e.into_inner()) = Some((report, halted, refused));
    });
    while out.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
        if exec.step() == Step::Idle {
            break;
        }
    }
    let answer = out.lock().unwrap_or_else(|e| e.into_inner()).take();
    answer
}

/// What the checks must have come to, given the simulation's own verdict (`w.violations`,
/// taken before this adds any) and whether a mismatch was planted.
pub fn judge(
    w: &mut World,
    auditor: &Auditor,
    last: Option<(InvariantReport, bool, bool)>,
    tampered: bool,
) {
    let alarms = auditor
        .alarms
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let halts = auditor.records.kept().halts;
    let Some((report, halted, refused)) = last else {
        w.violation("the conservation check could not decide at quiescence".into());
        return;
    };
    if tampered {
        if report.ok || !halted {
            w.violation(format!(
                "the conservation check missed the planted mismatch (ok={}, halted={halted})",
                report.ok
            ));
        } else if !refused {
            w.violation("halted, but a new request was not refused SERVICE_HALTED".into());
        }
        return;
    }
    if w.violations.is_empty() {
        if let Some(first) = alarms.first() {
            w.violation(format!(
                "false alarm: a periodic conservation check reported {first} ({} in all)",
                alarms.len()
            ));
        }
        if !report.ok {
            w.violation(format!("false alarm at quiescence: {}", summary(&report)));
        }
        if halts > 0 {
            w.violation(format!(
                "transfers were halted {halts} times with money conserved"
            ));
        }
    }
}
