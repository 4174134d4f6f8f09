//! PostgreSQL's side of the core's ports: every trait `application` defines for what it asks of
//! a database (`application::ports`: the event log, client keys, leases, daily counters;
//! `application::stores`: the halt flag, alerts, asset settings, the conservation check's
//! records and event-log reads, the open transfers, the failover repairs; of
//! `application::external_ids`: a claim cell's external_id claims (`external_claims`); of
//! `application::cell_map`: the cell's stored map (`cell_map`); of the read side's
//! `application::reads`: the receipts' batched reader (`receipts`), the first trace (`traces`),
//! a cell's failovers and its database's role (`failovers`)) is implemented here over one pool, and [`ports`], [`stores`] and [`ledger`] wire them. The account systems'
//! ports (`application::books`) are `FundingLedger` and `SpotAdapter` themselves.
//!
//! The one place the core meets sqlx: a driver error becomes the core's `StoreError` (or an
//! unknown outcome) here ([`store`], [`unknown`]), so `application` names no database type.

pub mod alerts;
pub mod assets;
pub mod audit;
pub mod cell_add;
pub mod cell_map;
pub(crate) mod claims;
mod claims_reader;
mod driver;
pub mod events;
pub mod external_claims;
pub mod failovers;
mod funded;
pub mod halt;
pub mod lease;
pub mod limits;
pub mod maintenance;
pub mod map_moves;
pub mod move_copy;
pub mod move_stores;
pub mod moves;
pub mod partitions;
pub mod receipts;
pub mod repairs;
mod serialized;
pub mod traces;
pub mod transfers;

use std::sync::{Arc, RwLock};

use application::audit::{CheckError, InvariantReport, Sources};
use application::{Coordinator, Ledger, Ports, StoreError, Stores, SystemClock};
use async_trait::async_trait;
use domain::{AccountPort, AssetRegistry};
use sqlx::PgPool;

use crate::{FundingLedger, SpotAdapter};

pub use driver::{store, unknown};
pub use transfers::{PgClientKeys, PgDailyReservations, PgLeases, PgTransferLog};

/// The coordinator's ports in `pool`'s database, and the system clock. The event log's
/// group-commit appender starts on the current tokio runtime.
pub fn ports(pool: PgPool) -> Ports {
    Ports {
        log: Arc::new(PgTransferLog::new(pool.clone())),
        claims: Arc::new(PgClientKeys::new(pool.clone())),
        leases: Arc::new(PgLeases::new(pool.clone())),
        limits: Arc::new(PgDailyReservations::new(pool)),
        clock: Arc::new(SystemClock),
    }
}

/// `ports` with the event log making `funding`'s movements in its own transactions, with the
/// events announcing and recording them (ADR 0024): `funding` must be over `pool`'s database.
pub fn ports_with_funding(pool: PgPool, funding: FundingLedger) -> Ports {
    Ports {
        log: Arc::new(PgTransferLog::new(pool.clone()).with_funding(funding)),
        ..ports(pool)
    }
}

/// The core's records in `pool`'s database.
pub fn stores(pool: PgPool) -> Stores {
    Stores {
        halt: Arc::new(halt::PgHalt::new(pool.clone())),
        alerts: Arc::new(alerts::PgAlerts::new(pool.clone())),
        assets: Arc::new(assets::PgAssets::new(pool.clone())),
        events: Arc::new(events::PgEventReads::new(pool.clone())),
        checkpoints: Arc::new(audit::PgAudit::new(pool.clone())),
        history: Arc::new(audit::PgAudit::new(pool.clone())),
        open: Arc::new(OpenInPg { pool: pool.clone() }),
        repairs: Arc::new(repairs::PgRepairs::new(pool)),
    }
}

/// A coordinator over `pool`'s ports and the two account systems.
pub fn coordinator(
    pool: PgPool,
    funding: Arc<dyn AccountPort>,
    spot: Arc<dyn AccountPort>,
    assets: Arc<RwLock<AssetRegistry>>,
) -> Coordinator {
    Coordinator::with_ports(ports(pool), funding, spot, assets)
}

/// The ledger over `pool` (its ports and records, and the funding ledger over it, checking the
/// asset list too), spot-core's adapter and the asset list.
pub fn ledger(pool: PgPool, spot: SpotAdapter, assets: AssetRegistry) -> Ledger {
    let registry = Arc::new(RwLock::new(assets));
    let funding = FundingLedger::new(pool.clone()).with_assets(registry.clone());
    Ledger::new(
        ports(pool.clone()),
        stores(pool),
        Arc::new(funding),
        Arc::new(spot),
        registry,
    )
}

/// The open transfers (`open_transfers`), as the idempotency horizon asks of them.
struct OpenInPg {
    pool: PgPool,
}

#[async_trait]
impl application::stores::OpenTransfers for OpenInPg {
    async fn oldest(&self) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar("SELECT min(req_id) FROM open_transfers")
            .fetch_one(&self.pool)
            .await
            .map_err(store)
    }
}

/// What the conservation check reads when the log and its records are in `funding`'s database
/// (tools and tests; the ledger builds its own from its stores).
fn audit_parts(funding: &FundingLedger) -> (events::PgEventReads, audit::PgAudit) {
    (
        events::PgEventReads::new(funding.pool().clone()),
        audit::PgAudit::new(funding.pool().clone()),
    )
}

/// The full conservation check over `funding`'s database and spot-core, storing nothing.
pub async fn check_full(
    funding: &FundingLedger,
    spot: &SpotAdapter,
) -> Result<InvariantReport, CheckError> {
    let (log, records) = audit_parts(funding);
    application::audit::check_full(Sources {
        log: &log,
        funding,
        spot,
        checkpoints: &records,
    })
    .await
}

/// The incremental conservation check over `funding`'s database and spot-core, from and to the
/// checkpoint stored there.
pub async fn check_incremental(
    funding: &FundingLedger,
    spot: &SpotAdapter,
) -> Result<InvariantReport, CheckError> {
    let (log, records) = audit_parts(funding);
    application::audit::check_incremental(Sources {
        log: &log,
        funding,
        spot,
        checkpoints: &records,
    })
    .await
}
