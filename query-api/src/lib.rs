//! The query side of the HTTP edge: every route that only reads. One transfer and the caller's
//! balances (`rest.rs`), GraphQL (`/graphql`, `/graphql/ws`, with its cost guard), the consumer
//! feed and its SSE stream (what any feed's routes share: `feed_stream.rs`), the operators' read views, the stuck listing and the stored alerts,
//! `/metrics`, and the operators' console with the GraphiQL page, served from files compiled in.
//! Every read goes through the core's queries (`application::Queries`) or the read side's
//! objects (`edge::reads::ReadSide`), with a turn from `edge::admission`; what the handlers share
//! with the command side is the `edge` crate's, below this one.

pub(crate) mod admin_alerts;
pub(crate) mod admin_cells;
pub(crate) mod admin_views;
pub mod console;
pub(crate) mod feed;
pub mod feed_events;
pub mod feed_stream;
pub(crate) mod gauges;
pub mod graphql;
pub(crate) mod ha_metrics;
pub(crate) mod log_routes;
pub mod metrics;
pub mod openapi;
pub(crate) mod ops_metrics;
pub(crate) mod rest;
pub(crate) mod stuck;

/// The feed's page size and a stream's poll interval, which the merged feed of a cell map
/// (`front::feed`) shares with the rest of `feed_stream`.
pub use feed_stream::{FEED_PAGE_SIZE_DEFAULT, STREAM_POLL_INTERVAL};

use axum::http::Method;
use edge::routes::Routes;

/// Every query route but `/metrics` (the binary decides where that is served: [`metrics`]),
/// listed (`edge::routes`).
pub fn router() -> Routes {
    Routes::new()
        .api(
            Method::GET,
            "/api/v1/internal_transfer/{req_id}",
            rest::get_transfer,
        )
        .api(Method::GET, "/api/v1/balances", rest::balances)
        .merge(admin_alerts::routes())
        .merge(stuck::routes())
        .merge(console::routes())
        .merge(admin_views::routes())
        .merge(admin_cells::routes())
        .merge(feed::routes())
        // GraphQL's router carries its schema as a layer of its own: its routes on its word.
        .pages(
            graphql::routes(),
            &[
                (Method::GET, "/graphql"),
                (Method::POST, "/graphql"),
                (Method::GET, "/graphql/ws"),
                (Method::GET, "/graphql/schema.graphql"),
            ],
        )
        .merge(log_routes::routes())
}
