//! The processes a cell runs under HA (docs/adr/0020-high-availability.md), started on this
//! machine as child processes and stopped with their owner (`ledger up --ha`, the HA tests, the
//! failover benchmark):
//!
//! - `etcd`: one etcd cluster of three members, the leases that name the leaders;
//! - `patroni`: the cell's PostgreSQL nodes under Patroni, synchronous replication;
//! - `proc`: what every child shares (a free port, a child killed on drop, waiting for a port).
//!
//! Nothing here decides who leads: etcd does, through Patroni's leader key and spot-core's
//! lease (`spot-core/src/replica`).

pub mod cell;
pub mod etcd;
pub mod patroni;
pub mod proc;
pub mod spot;
