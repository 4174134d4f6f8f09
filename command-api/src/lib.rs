//! The HTTP edge of the ledger: the only crate that knows HTTP and JSON. It parses requests, calls
//! the application core (`application::Ledger`) or reads the read models (`projections`), and
//! answers in the contract's shapes; it holds the `ledger` binary, its one `Settings`, and the
//! one start-up module that runs every background task.

pub(crate) mod admin_alerts;
pub(crate) mod admin_assets;
pub(crate) mod admin_recovery;
pub(crate) mod admin_repairs;
pub(crate) mod admin_views;
pub mod admission;
pub(crate) mod app;
pub mod auth;
pub(crate) mod bulk;
pub mod cli;
pub(crate) mod config;
pub mod console;
pub mod error;
pub(crate) mod feed;
pub mod graphql;
pub(crate) mod http_server;
pub(crate) mod invariant;
pub(crate) mod metrics;
pub(crate) mod openapi;
pub(crate) mod ops_metrics;
pub(crate) mod private_pg;
pub mod ratelimit;
pub(crate) mod relay_cli;
pub(crate) mod render;
pub(crate) mod replay;
pub mod routes;
pub(crate) mod settings;
pub mod startup;
pub(crate) mod state;

pub use app::serve_with;
pub use auth::{mint, AdminUser, AuthUser};
pub use error::ApiError;
pub use state::AppState;
