//! The move worker: drives every move that has not ended, one task per move, in the process
//! that serves the cells. It looks for them at start (a move a crash interrupted resumes from
//! its record) and again whenever it is woken (a move just started) or `poll` has passed. Two
//! processes that both drive a move are safe (every save is compare and set, every step's work
//! idempotent); one process drives each move once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::ports::MoveRecords;
use super::record::MoveId;
use super::run::MoveRunner;

/// What a process that runs moves acts through: the runner over every cell, the moves'
/// records, and the worker's bell (ring it when a move starts or is cancelled).
#[derive(Clone)]
pub struct MoveDesk {
    pub runner: MoveRunner,
    pub records: Arc<dyn MoveRecords>,
    pub wake: Arc<Notify>,
}

/// Drives unfinished moves until the process ends.
pub async fn run_worker(
    runner: MoveRunner,
    records: Arc<dyn MoveRecords>,
    wake: Arc<Notify>,
    poll: Duration,
) {
    let driving: Arc<Mutex<BTreeSet<MoveId>>> = Arc::default();
    loop {
        match records.unfinished().await {
            Ok(moves) => {
                for record in moves {
                    let id = record.id.clone();
                    if !driving.lock().expect("the worker's set").insert(id.clone()) {
                        continue;
                    }
                    let (runner, driving) = (runner.clone(), driving.clone());
                    tokio::spawn(async move {
                        match runner.drive(&id).await {
                            Ok(end) => {
                                tracing::info!(move_id = %id, step = end.step.as_str(), reason = ?end.reason, "a partition move ended")
                            }
                            Err(e) => {
                                tracing::error!(move_id = %id, error = %e, "a partition move stopped")
                            }
                        }
                        driving.lock().expect("the worker's set").remove(&id);
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the move worker could not list the moves; it looks again")
            }
        }
        let _ = tokio::time::timeout(poll, wake.notified()).await;
    }
}
