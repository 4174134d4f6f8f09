//! The partition moves of a process that serves every cell (ADR 0023 §4): the move runner over
//! every reached cell's database and spot-core (`adapters::pg::move_stores`,
//! `adapters::pg::map_moves`, `adapters::spot::moves`), handed to the front's move routes, and
//! the move worker that drives every move that has not ended, resumed after any restart.
//! A cell not reached at start-up is not in the runner: a move that names it waits (its steps
//! fail and are retried) until the process is restarted with the cell up, and so does every
//! other move at its pause and switch (`PgPartitionStores` refuses both in a process that does
//! not reach every cell of the map, whose switch would leave that cell on an older map); a
//! process that reaches every cell drives them meanwhile. A cell added while the process serves
//! joins the runner's ports through [`MoveCells`] (`adding.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use adapters::pg::cell_add::AddedCell;
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

/// The move ports over the cells, kept to add a cell to them while the process serves.
#[derive(Clone)]
pub struct MoveCells {
    pub stores: Arc<PgPartitionStores>,
    pub records: Arc<PgMapMoves>,
    pub engines: Arc<EngineMoves>,
}

impl MoveCells {
    /// Adds `cell`, reached as `parts`, to the map every cell keeps (the map's next version:
    /// `adapters::pg::cell_add`) and to the runner's ports; answers that version.
    pub async fn add(
        &self,
        added: &AddedCell,
        parts: &Reached,
        failpoints: FailPoints,
    ) -> Result<u64, application::StoreError> {
        let (pool, spot) = parts.move_parts();
        let version = self
            .stores
            .add_cell(
                added,
                MoveCell {
                    funding: adapters::FundingLedger::new(pool.clone()),
                    spot: spot.clone(),
                },
                failpoints,
            )
            .await?;
        self.records.add_cell(added.id, PgMoves::new(pool));
        if let Some(client) = spot.tcp_client() {
            self.engines.add_cell(added.id, client.clone());
        }
        Ok(version)
    }
}

impl MoveCells {
    /// Writes `additions` into every cell that lacks one (an addition a crash cut short), in
    /// the background; logged, and tried again at the next start if it fails.
    pub fn complete(&self, additions: Vec<(AddedCell, u64)>) {
        if additions.is_empty() {
            return;
        }
        let stores = Arc::clone(&self.stores);
        tokio::spawn(async move {
            match stores.complete_additions(&additions).await {
                Ok(0) => {}
                Ok(written) => tracing::warn!(written, "added cells written into the cells that lacked them (an addition had been cut short)"),
                Err(e) => tracing::error!(error = %e, "could not finish an addition in every cell; the next start tries again"),
            }
        });
    }
}

/// The runner and records over every cell in `reached`, and the worker started over them.
pub fn start(reached: &BTreeMap<CellId, Reached>, failpoints: FailPoints) -> (MoveDesk, MoveCells) {
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
    let handles = MoveCells {
        stores: Arc::new(PgPartitionStores::new(cells)),
        records: Arc::new(PgMapMoves::new(records)),
        engines: Arc::new(EngineMoves::new(engines)),
    };
    let records: Arc<dyn MoveRecords> = handles.records.clone();
    let runner = MoveRunner::new(
        Arc::clone(&records),
        handles.stores.clone(),
        handles.engines.clone(),
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
    let desk = MoveDesk {
        runner,
        records,
        wake,
    };
    (desk, handles)
}
