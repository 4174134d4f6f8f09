//! What every resolver shares: the request's data (the caller's identity, the application
//! state), the contract's error shape (`extensions.code`), and the cost and paging constants. Below
//! the schema (`graphql.rs`) and the roots, imported by all of them.

use std::time::Duration;

use async_graphql::{Context, ErrorExtensionValues};
use domain::ErrorCode;

use edge::admission::Busy;
use edge::auth::Identity;
use edge::error::describe;
use edge::state::AppState;

/// Page size when `first` is not given.
pub const PAGE_SIZE_DEFAULT: i32 = 20;
/// How often a subscription looks for new state changes.
pub(crate) const SUBSCRIPTION_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The complexity of a field that queries the database or spot-core: enough that a request can
/// hold only a few, whatever its aliases.
pub const IO_FIELD_COST: usize = 50;

/// An error with the contract's code in `extensions.code` and the contract's fixed message.
pub(crate) fn coded(code: ErrorCode) -> async_graphql::Error {
    let mut extensions = ErrorExtensionValues::default();
    extensions.set("code", code.as_str());
    async_graphql::Error {
        message: describe(code).to_owned(),
        source: None,
        extensions: Some(extensions),
    }
}

/// An internal failure: logged with its detail, answered as SYSTEM_ERROR only.
pub(crate) fn internal(detail: impl std::fmt::Display) -> async_graphql::Error {
    tracing::error!(%detail, "graphql resolver failed inside");
    coded(ErrorCode::SystemError)
}

/// The caller, as the request (or websocket connection) carries it.
pub(crate) fn caller<'a>(ctx: &'a Context<'_>) -> &'a Identity {
    ctx.data_unchecked::<Identity>()
}

/// The application state, as the request (or websocket connection) carries it.
pub(crate) fn app<'a>(ctx: &'a Context<'_>) -> &'a AppState {
    ctx.data_unchecked::<AppState>()
}

/// The read side is at capacity: the caller may try again shortly.
pub(crate) fn busy(_: Busy) -> async_graphql::Error {
    coded(ErrorCode::RateLimitExceeded)
}
