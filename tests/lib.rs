//! Integration-test package: the acceptance catalogue lives in `it/`; the library holds the chaos
//! run and the PostgreSQL control shared by the tests that restart it.

pub mod chaos;
pub mod pg_ctl;
pub mod pg_pair;
