//! The HTTP edge of the ledger: the only crate that knows HTTP and JSON. It parses requests, calls
//! the application core (`application::Ledger`) or reads the read models (`projections`), and
//! answers in the contract's shapes; it holds the `ledger` binary, its one `Settings`, and the
//! one start-up module that runs every background task.

pub mod admin_alerts;
pub mod admin_assets;
pub mod admin_recovery;
pub mod admin_repairs;
pub mod admin_views;
pub mod admission;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod console;
pub mod error;
pub mod feed;
pub mod graphql;
pub mod http_server;
pub mod invariant;
pub mod metrics;
pub mod openapi;
pub mod ops_metrics;
pub mod ratelimit;
pub mod relay_cli;
pub mod render;
pub mod replay;
pub mod routes;
pub mod settings;
pub mod startup;
pub mod state;

pub use app::{build_app, serve_with, serve_with_shutdown};
pub use auth::{mint, AdminUser, AuthUser};
pub use error::ApiError;
pub use state::AppState;
