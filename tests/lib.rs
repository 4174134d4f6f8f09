//! Integration-test package: the acceptance catalogue lives in `it/`; the library holds the chaos
//! run, the PostgreSQL control shared by the tests that restart it, and the network namespaces
//! and nftables faults of the network-fault tests.

pub mod chaos;
pub mod netns;
pub mod pg_ctl;
pub mod pg_pair;
pub mod pg_solo;
