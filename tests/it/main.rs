//! The acceptance catalogue (contract §9), one integration binary against a real
//! PostgreSQL and real spot-core processes. Test names carry its ids
//! (`docs/acceptance.md`).

mod helpers;
mod nats;
mod procs;

mod adapters_idempotency;
mod admin_api;
mod alerts;
mod api;
mod attacks;
mod audit_incremental;
mod balance;
mod bulk;
mod cells;
mod cells_feed;
mod chaos;
mod concurrency;
mod concurrency_api;
mod console;
mod crash;
mod defense;
mod feed;
mod fsm;
mod graphql;
mod graphql_introspection;
mod horizon;
mod invariant;
mod ledger_up;
mod old_snapshot;
mod package;
mod pool_safety;
mod private_pg;
mod projections;
mod prometheus;
mod recovery;
mod recovery_safety;
mod relay;
mod rounds;
mod security;
mod spot_durability;
mod tlog;
mod tlog_cells;
mod tlog_receipts;
mod tlog_stream;
mod traces;
