//! The HTTP edge of the ledger: the only crate that knows HTTP and JSON. It turns requests into
//! coordinator and adapter calls, answers in the contract's shapes, and holds the `ledger` binary.

pub mod admin_assets;
pub mod admin_recovery;
pub mod admission;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod error;
pub mod feed;
pub mod graphql;
pub mod http_server;
pub mod invariant;
pub mod metrics;
pub mod openapi;
pub mod ratelimit;
pub mod relay_cli;
pub mod replay;
pub mod routes;

pub use app::{build_app, serve_with, serve_with_shutdown, spawn_sweeper, AppState};
pub use auth::{mint, AdminUser, AuthUser};
pub use error::ApiError;
