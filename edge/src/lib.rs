//! What both sides of the HTTP edge share, below them: the bearer tokens (`auth`), the error
//! shape every route answers with (`error`), the read side's admission, the state every handler
//! holds (`state`, with the core's commands and queries and the read side's objects, never a
//! pool or an adapter), the rendering of money and times both sides show, the limits and
//! secrets of the configuration (`config`, `ratelimit`), the OpenAPI field schemas and the
//! document's assembly (`openapi`), the health and fallback routes, and the HTTP server that
//! guards every connection (`http_server`). The command routes (`command-api`) and the query
//! routes (`query-api`) sit above this crate; the `ledger` binary joins them.

pub mod admission;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod error;
pub mod health;
pub mod http_server;
pub mod openapi;
pub mod ratelimit;
pub mod reads;
pub mod render;
pub mod routes;
pub mod state;

pub use auth::{mint, AdminUser, AuthUser};
pub use error::ApiError;
pub use state::AppState;
