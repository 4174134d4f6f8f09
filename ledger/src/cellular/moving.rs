//! The partition moves of a process that serves every cell (ADR 0023 §4): the move runner over
//! every reached cell's database and spot-core (`adapters::pg::move_stores`,
//! `adapters::pg::map_moves`, `adapters::spot::moves`), handed to the front's move routes, and
//! the move worker that drives every move that has not ended, resumed after any restart.
//! A cell not reached at start-up is not in the runner: a move that names it waits (its steps
//! fail and are retried) until the process is restarted with the cell up, and so does every
//! other move at its pause and switch (`PgPartitionStores` refuses both in a process that does
//! not reach every cell of the map, whose switch would leave that cell on an older map); a
//! process that reaches every cell drives them meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use adapters::pg::map_moves::PgMapMoves;
use adapters::pg::move_stores::{MoveCell, PgPartitionStores};
use adapters::pg::moves::PgMoves;
use adapters::spot::moves::EngineMoves;
use application::moves::{run_worker, MoveDesk, MoveRecords, MoveRunner, MoveSettings, NoHold};
use application::ports::SystemClock;
use application::FailPoints;
use cells::CellId;
use tokio::sync::Notify;

use super::watch::Reached;

/// How often the worker looks for moves besides being woken.
const WORKER_POLL: Duration = Duration::from_secs(2);

/// The runner and records over every cell in `reached`, and the worker started over them.
pub fn start(reached: &BTreeMap<CellId, Reached>, failpoints: FailPoints) -> MoveDesk {
    let mut cells = BTreeMap::new();
    let mut records = BTreeMap::new();
    let mut engines = BTreeMap::new();
    for (id, parts) in reached {
        let (pool, spot) = parts.move_parts();
        records.insert(*id, PgMoves::new(pool.clone()));
        if let Some(client) = spot.tcp_client() {
            engines.insert(*id, client.clone());
        }
        cells.insert(
            *id,
            MoveCell {
                funding: adapters::FundingLedger::new(pool),
                spot,
            },
        );
    }
    let records: Arc<dyn MoveRecords> = Arc::new(PgMapMoves::new(records));
    let runner = MoveRunner::new(
        Arc::clone(&records),
        Arc::new(PgPartitionStores::new(cells)),
        Arc::new(EngineMoves::new(engines)),
        Arc::new(NoHold),
        Arc::new(SystemClock),
        MoveSettings::default(),
    )
    .with_failpoints(failpoints);
    let wake = Arc::new(Notify::new());
    tokio::spawn(run_worker(
        runner.clone(),
        Arc::clone(&records),
        Arc::clone(&wake),
        WORKER_POLL,
    ));
    MoveDesk {
        runner,
        records,
        wake,
    }
}
