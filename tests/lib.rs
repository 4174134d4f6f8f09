//! Integration-test package: the acceptance catalogue lives in `it/`.

pub mod chaos;
