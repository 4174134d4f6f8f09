//! The command side of the HTTP edge: every route that asks the core to change something.
//! Create a transfer (one, or many in one request), credit a deposit from outside, set an
//! account's status, change an asset's settings, resolve a stuck transfer by hand, repair one a
//! failover lost, run the conservation check now and lift its halt. Each handler takes its body
//! apart (`body.rs`) in the contract's check order and calls one command of
//! `application::Ledger`; what the handlers share with the query side (auth, the error shape,
//! the state, the OpenAPI field schemas) is the `edge` crate's, below this one.

pub(crate) mod admin_assets;
pub(crate) mod admin_recovery;
pub(crate) mod admin_repairs;
pub mod body;
pub(crate) mod bulk;
pub(crate) mod invariant;
pub mod openapi;
pub mod routes;

use axum::http::Method;
use edge::routes::Routes;

/// Every command route, listed (`edge::routes`); the bulk route's body limit fits `bulk_max`
/// items.
pub fn router(bulk_max: usize) -> Routes {
    Routes::new()
        .api(
            Method::POST,
            "/api/v1/internal_transfer",
            routes::create_transfer,
        )
        .merge(bulk::routes(bulk_max))
        .api(
            Method::POST,
            "/api/v1/admin/deposits",
            routes::admin_deposit,
        )
        .api(
            Method::PUT,
            "/api/v1/admin/accounts/{user_id}/{account_type}/status",
            routes::admin_set_status,
        )
        .merge(admin_assets::routes())
        .merge(admin_recovery::routes())
        .merge(admin_repairs::routes())
        .merge(invariant::routes())
}
