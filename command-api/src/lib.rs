//! command-api
