//! The query routes' part of the OpenAPI document, derived by `utoipa` from their handlers'
//! `#[utoipa::path]` attributes; `edge::openapi::document` joins it with the command side's. The
//! schema-only types below describe the routes whose handlers answer with JSON built in place
//! (`stuck`, `feed`).
// The schema-only types exist for their `ToSchema`/`IntoParams` derives: utoipa reads their
// fields' attributes, no code reads the fields.
#![allow(dead_code)]

use utoipa::{IntoParams, OpenApi, ToSchema};

/// This side's paths, and the schemas they name.
pub fn part() -> utoipa::openapi::OpenApi {
    Queries::openapi()
}

#[derive(OpenApi)]
#[openapi(paths(
    crate::rest::get_transfer,
    crate::rest::balances,
    crate::admin_views::list_transfers,
    crate::admin_views::transfer_timeline,
    crate::admin_views::user_view,
    crate::admin_views::overview,
    crate::admin_views::invariant_history,
    crate::admin_alerts::list_alerts,
    crate::stuck::list_stuck,
    crate::feed::events,
    crate::feed::stream_events,
))]
struct Queries;

/// `GET /api/v1/admin/transfers/stuck`' query; any other parameter is refused (400).
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StuckParams {
    /// Only transfers unchanged at least this long (60,000 when absent); at most
    /// `crate::stuck::STUCK_OLDER_THAN_MS_MAX` (about 100 years).
    #[param(minimum = 0, maximum = 3_155_760_000_000_i64)]
    pub older_than_ms: Option<i64>,
    /// Rows to return; brought within 1 to 500 (100 when absent).
    pub limit: Option<i64>,
}

/// Open transfers unchanged that long, oldest first.
#[derive(Debug, ToSchema)]
pub struct StuckPage {
    pub transfers: Vec<StuckTransfer>,
}

/// One stuck transfer with its retry record (the fields the worker has not set are null).
#[derive(Debug, ToSchema)]
pub struct StuckTransfer {
    pub req_id: String,
    pub user_id: Option<i64>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub asset: Option<String>,
    pub amount: Option<String>,
    pub state: String,
    /// RETRYING, or REFUND_REFUSED (a refund the source refused: an operator's case).
    pub status: String,
    pub updated_at: String,
    pub age_ms: Option<i64>,
    pub attempts: i64,
    pub refund_failures: i64,
    pub last_error_category: Option<String>,
    pub last_attempt_at: Option<String>,
    pub next_retry_at: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<String>,
}

/// `GET /api/v1/events`' query.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FeedParams {
    /// Events with a position above this one (0 when absent).
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Events per page: 1 to 1000 (100 when absent).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// `GET /api/v1/events/stream`' query and headers.
#[derive(Debug, IntoParams)]
pub struct StreamParams {
    /// Events with a position above this one (0 when absent; `Last-Event-ID` wins).
    #[param(minimum = 0)]
    #[into_params(parameter_in = Query)]
    pub after: Option<i64>,
}

/// A page of the feed.
#[derive(Debug, ToSchema)]
pub struct FeedPage {
    pub events: Vec<FeedEvent>,
    /// What to ask with next (`after`).
    pub next_after: i64,
    /// The last position handed out so far.
    pub head: i64,
}

/// One event of the global, gap-free, ordered feed.
#[derive(Debug, ToSchema)]
pub struct FeedEvent {
    pub position: i64,
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: serde_json::Value,
    pub user_id: Option<i64>,
    pub occurred_at: String,
}
