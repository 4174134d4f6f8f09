//! GraphQL at `/graphql` (async-graphql on axum): transfer history with filters and cursor
//! pagination, one transfer with its events, balances, and counts by state; a websocket
//! subscription (`/graphql/ws`) streaming the caller's transfer state changes; a GraphiQL page
//! (`GET /graphql`). A user sees only their own; an admin sees all. Errors carry the contract's
//! code in `extensions.code`. Queries are bounded in depth and complexity.

use std::time::Duration;

use async_graphql::http::{GraphiQLSource, ALL_WEBSOCKET_PROTOCOLS};
use async_graphql::{
    Context, Data, Enum, ErrorExtensionValues, InputObject, Object, Schema, SimpleObject,
    Subscription,
};
use async_graphql_axum::{GraphQLProtocol, GraphQLWebSocket};
use axum::body::Bytes;
use axum::extract::{State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use domain::{ErrorCode, ReqId, TransferData, TransferEvent, TransferState, UserId};
use futures_util::stream::{self, Stream};
use projections::feed as feed_store;
use projections::{HistoryFilter, PageCursor, TransferRow};
use rust_decimal::Decimal;

use crate::app::AppState;
use crate::auth::Identity;
use crate::error::describe;
use crate::render::{merge_balances, money};

/// Deepest query accepted.
pub const QUERY_DEPTH_MAX: usize = 8;
/// Most complex query accepted (a field counts 1; a page counts its size times its fields).
pub const QUERY_COMPLEXITY_MAX: usize = 2_000;
/// Page size when `first` is not given.
pub const PAGE_SIZE_DEFAULT: i32 = 20;
/// How often a subscription looks for new state changes.
const SUBSCRIPTION_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The schema type.
pub type LedgerSchema = Schema<QueryRoot, async_graphql::EmptyMutation, SubscriptionRoot>;

/// The GraphQL routes; merged into the application router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/graphql", get(graphiql).post(graphql_post))
        .route("/graphql/ws", get(graphql_ws))
}

/// Builds the schema with its limits, once per application (kept in `AppState`); each request
/// (or websocket connection) carries the application state and the caller's identity as data.
pub fn schema() -> LedgerSchema {
    Schema::build(QueryRoot, async_graphql::EmptyMutation, SubscriptionRoot)
        .limit_depth(QUERY_DEPTH_MAX)
        .limit_complexity(QUERY_COMPLEXITY_MAX)
        .finish()
}

/// An error with the contract's code in `extensions.code` and the contract's fixed message.
fn coded(code: ErrorCode) -> async_graphql::Error {
    let mut extensions = ErrorExtensionValues::default();
    extensions.set("code", code.as_str());
    async_graphql::Error {
        message: describe(code).to_owned(),
        source: None,
        extensions: Some(extensions),
    }
}

/// An internal failure: logged with its detail, answered as SYSTEM_ERROR only.
fn internal(detail: impl std::fmt::Display) -> async_graphql::Error {
    tracing::error!(%detail, "graphql resolver failed inside");
    coded(ErrorCode::SystemError)
}

fn caller<'a>(ctx: &'a Context<'_>) -> &'a Identity {
    ctx.data_unchecked::<Identity>()
}

fn app<'a>(ctx: &'a Context<'_>) -> &'a AppState {
    ctx.data_unchecked::<AppState>()
}

/// Transfer direction, the way users filter by it.
#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
pub enum Direction {
    FundingToSpot,
    SpotToFunding,
}

/// History filters; every field is optional. `userId` is for admins.
#[derive(InputObject, Debug, Default)]
pub struct TransferFilter {
    /// A state name: INIT, SOURCE_PENDING, ..., COMMITTED, FAILED, COMPENSATING, ROLLED_BACK.
    pub state: Option<String>,
    pub asset: Option<String>,
    pub direction: Option<Direction>,
    /// Created at or after (RFC 3339).
    pub created_from: Option<DateTime<Utc>>,
    /// Created before (RFC 3339).
    pub created_until: Option<DateTime<Utc>>,
    /// Admins only: one user's transfers.
    pub user_id: Option<u64>,
}

/// One event of a transfer.
#[derive(SimpleObject, Debug, Clone)]
pub struct TransferEventGql {
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    /// The state the transfer was in right after this event.
    pub state: String,
    pub occurred_at: DateTime<Utc>,
    /// The raw position in the event table.
    pub global_position: i64,
}

/// A transfer.
#[derive(Debug, Clone)]
pub struct TransferGql {
    req_id: String,
    user_id: i64,
    from: String,
    to: String,
    asset: String,
    amount: Decimal,
    state: String,
    failure_code: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<TransferRow> for TransferGql {
    fn from(r: TransferRow) -> Self {
        Self {
            req_id: r.req_id,
            user_id: r.user_id,
            from: r.from_account,
            to: r.to_account,
            asset: r.asset,
            amount: r.amount,
            state: r.state,
            failure_code: r.failure_code,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

impl From<TransferData> for TransferGql {
    fn from(d: TransferData) -> Self {
        Self {
            req_id: d.req_id.to_string(),
            user_id: d.user_id.as_i64(),
            from: d.from.as_str().to_owned(),
            to: d.to.as_str().to_owned(),
            asset: d.asset.to_string(),
            amount: d.amount.value(),
            state: d.state.as_str().to_owned(),
            failure_code: d.failure.map(|(code, _)| code),
            created_at: d.created_at,
            updated_at: d.updated_at,
        }
    }
}

#[Object(name = "Transfer")]
impl TransferGql {
    async fn req_id(&self) -> &str {
        &self.req_id
    }
    async fn user_id(&self) -> i64 {
        self.user_id
    }
    async fn from(&self) -> &str {
        &self.from
    }
    async fn to(&self) -> &str {
        &self.to
    }
    async fn asset(&self) -> &str {
        &self.asset
    }
    /// Plain decimal text, never a float.
    async fn amount(&self) -> String {
        money(self.amount)
    }
    async fn state(&self) -> &str {
        &self.state
    }
    async fn failure_code(&self) -> Option<&str> {
        self.failure_code.as_deref()
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.updated_at
    }
    /// The transfer's events, in order, from the event log itself.
    #[graphql(complexity = "10 * child_complexity")]
    async fn events(&self, ctx: &Context<'_>) -> async_graphql::Result<Vec<TransferEventGql>> {
        let req_id = ReqId::parse(&self.req_id).map_err(internal)?;
        let events = app(ctx)
            .ledger
            .transfer_events(&req_id)
            .await
            .map_err(|e| internal(application::error_chain(&e)))?;
        Ok(events
            .into_iter()
            .map(|e| TransferEventGql {
                sequence: e.sequence,
                event_type: e.event_type,
                event_version: e.event_version,
                state: e.event.resulting_state().as_str().to_owned(),
                occurred_at: e.event.at(),
                global_position: e.global_position,
            })
            .collect())
    }
}

/// Where the next page starts.
#[derive(SimpleObject, Debug, Clone)]
pub struct PageInfo {
    pub has_next_page: bool,
    /// Pass as `after` for the next page. Opaque.
    pub end_cursor: Option<String>,
}

#[derive(SimpleObject, Debug, Clone)]
pub struct TransferEdge {
    pub cursor: String,
    pub node: TransferGql,
}

/// A page of history, newest first.
#[derive(SimpleObject, Debug, Clone)]
pub struct TransferConnection {
    pub edges: Vec<TransferEdge>,
    pub nodes: Vec<TransferGql>,
    pub page_info: PageInfo,
}

/// One asset's balances.
#[derive(SimpleObject, Debug, Clone)]
pub struct BalanceGql {
    pub user_id: i64,
    pub asset: String,
    pub funding: String,
    pub spot: String,
    pub in_flight: String,
}

#[derive(SimpleObject, Debug, Clone)]
pub struct StateCount {
    pub state: String,
    pub state_id: i32,
    pub count: i64,
}

fn encode_cursor(row: &TransferGql) -> String {
    format!("{}_{}", row.created_at.timestamp_micros(), row.req_id)
}

fn decode_cursor(text: &str) -> Option<PageCursor> {
    let (micros, req_id) = text.split_once('_')?;
    let created_at = DateTime::<Utc>::from_timestamp_micros(micros.parse().ok()?)?;
    ReqId::parse(req_id).ok()?;
    Some(PageCursor {
        created_at,
        req_id: req_id.to_owned(),
    })
}

/// The read side of the schema.
#[derive(Debug, Default)]
pub struct QueryRoot;

#[Object]
impl QueryRoot {
    /// The caller's transfers (an admin's: everyone's, or `filter.userId`'s), newest first,
    /// `first` (1..=100, default 20) per page, after the cursor `after`.
    #[graphql(complexity = "(first.unwrap_or(20).clamp(1, 100) as usize) * child_complexity + 1")]
    async fn transfers(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
        filter: Option<TransferFilter>,
    ) -> async_graphql::Result<TransferConnection> {
        let me = caller(ctx);
        let filter = filter.unwrap_or_default();
        let first = first.unwrap_or(PAGE_SIZE_DEFAULT);
        if !(1..=i32::try_from(projections::transfers::HISTORY_PAGE_SIZE_MAX).unwrap_or(100))
            .contains(&first)
        {
            return Err(coded(ErrorCode::BadRequest));
        }
        let user_id = match (me.admin, filter.user_id) {
            (true, requested) => requested
                .map(|u| UserId::new(u).map(UserId::as_i64))
                .transpose()
                .map_err(coded)?,
            // A user asking for someone else's history is refused outright.
            (false, Some(u)) if u != me.user_id.get() => return Err(coded(ErrorCode::Forbidden)),
            (false, _) => Some(me.user_id.as_i64()),
        };
        let state_id = match &filter.state {
            None => None,
            Some(name) => Some(
                TransferState::parse(name)
                    .ok_or_else(|| coded(ErrorCode::BadRequest))?
                    .id(),
            ),
        };
        let (from_account, to_account) = match filter.direction {
            None => (None, None),
            Some(Direction::FundingToSpot) => (Some("FUNDING"), Some("SPOT")),
            Some(Direction::SpotToFunding) => (Some("SPOT"), Some("FUNDING")),
        };
        let after = match after {
            None => None,
            Some(text) => Some(decode_cursor(&text).ok_or_else(|| coded(ErrorCode::BadRequest))?),
        };
        let history = HistoryFilter {
            user_id,
            state_id,
            asset: filter.asset.clone(),
            from_account: from_account.map(str::to_owned),
            to_account: to_account.map(str::to_owned),
            created_from: filter.created_from,
            created_until: filter.created_until,
        };
        // One row more than asked tells whether there is a next page.
        let mut rows = app(ctx)
            .view
            .history(&history, after.as_ref(), i64::from(first) + 1)
            .await
            .map_err(internal)?;
        let has_next_page = rows.len() > usize::try_from(first).unwrap_or(0);
        rows.truncate(usize::try_from(first).unwrap_or(0));
        let nodes: Vec<TransferGql> = rows.into_iter().map(Into::into).collect();
        let edges: Vec<TransferEdge> = nodes
            .iter()
            .map(|n| TransferEdge {
                cursor: encode_cursor(n),
                node: n.clone(),
            })
            .collect();
        Ok(TransferConnection {
            page_info: PageInfo {
                has_next_page,
                end_cursor: edges.last().map(|e| e.cursor.clone()),
            },
            edges,
            nodes,
        })
    }

    /// One transfer, folded from its events. `null` when it does not exist or is not the
    /// caller's (the two are indistinguishable).
    async fn transfer(
        &self,
        ctx: &Context<'_>,
        req_id: String,
    ) -> async_graphql::Result<Option<TransferGql>> {
        let me = caller(ctx);
        let Ok(req_id) = ReqId::parse(&req_id) else {
            return Ok(None);
        };
        let data = app(ctx)
            .ledger
            .coordinator()
            .load(&req_id)
            .await
            .map_err(internal)?;
        Ok(data
            .filter(|d| me.admin || d.user_id == me.user_id)
            .map(Into::into))
    }

    /// FUNDING and SPOT balances and in-flight amounts per asset: the caller's, or for an
    /// admin, `userId`'s.
    async fn balances(
        &self,
        ctx: &Context<'_>,
        user_id: Option<u64>,
    ) -> async_graphql::Result<Vec<BalanceGql>> {
        let me = caller(ctx);
        let user = match user_id {
            None => me.user_id,
            Some(u) if me.admin || u == me.user_id.get() => UserId::new(u).map_err(coded)?,
            Some(_) => return Err(coded(ErrorCode::Forbidden)),
        };
        let state = app(ctx);
        let (funding, spot, in_flight) = tokio::join!(
            state.ledger.funding().balances(user),
            state.ledger.spot().balances(user),
            state.view.in_flight(user.as_i64()),
        );
        let funding = funding.map_err(internal)?;
        let spot = spot.map_err(|e| {
            tracing::warn!(error = %e, "spot-core balances unavailable");
            coded(ErrorCode::SystemError)
        })?;
        let in_flight = in_flight.map_err(internal)?;
        Ok(merge_balances(funding, spot, in_flight)
            .into_iter()
            .map(|b| BalanceGql {
                user_id: user.as_i64(),
                asset: b.asset,
                funding: money(b.funding),
                spot: money(b.spot),
                in_flight: money(b.in_flight),
            })
            .collect())
    }

    /// How many transfers are in each state (admins only).
    async fn state_counts(&self, ctx: &Context<'_>) -> async_graphql::Result<Vec<StateCount>> {
        if !caller(ctx).admin {
            return Err(coded(ErrorCode::Forbidden));
        }
        let counts = app(ctx).view.state_counts().await.map_err(internal)?;
        Ok(counts
            .into_iter()
            .map(|(state_id, state, count)| StateCount {
                state,
                state_id: i32::from(state_id),
                count,
            })
            .collect())
    }
}

/// One state change of a transfer, as the subscription sends it.
#[derive(SimpleObject, Debug, Clone)]
pub struct TransferUpdate {
    /// The event's feed position.
    pub position: i64,
    pub event_id: String,
    pub req_id: String,
    pub user_id: Option<i64>,
    pub event_type: String,
    /// The state right after the event.
    pub state: String,
    pub occurred_at: DateTime<Utc>,
}

/// Streams.
#[derive(Debug, Default)]
pub struct SubscriptionRoot;

#[Subscription]
impl SubscriptionRoot {
    /// The caller's transfer state changes (an admin's: everyone's), or only those of `reqId`:
    /// from now on, or after feed position `after` (to resume without missing any).
    async fn transfer_updates(
        &self,
        ctx: &Context<'_>,
        req_id: Option<String>,
        after: Option<i64>,
    ) -> async_graphql::Result<impl Stream<Item = TransferUpdate>> {
        let me = *caller(ctx);
        let pool = app(ctx).ledger.pool().clone();
        let start = match after {
            Some(position) if position >= 0 => position,
            Some(_) => return Err(coded(ErrorCode::BadRequest)),
            None => feed_store::head(&pool).await.map_err(internal)?,
        };
        let user = (!me.admin).then(|| me.user_id.as_i64());
        let state = (pool, start, Vec::<TransferUpdate>::new().into_iter());
        Ok(stream::unfold(
            state,
            move |(pool, mut after, mut pending)| {
                let req_id = req_id.clone();
                async move {
                    loop {
                        if let Some(update) = pending.next() {
                            return Some((update, (pool, after, pending)));
                        }
                        match feed_store::read_after(&pool, after, 500, user).await {
                            Ok(rows) if rows.is_empty() => {
                                tokio::time::sleep(SUBSCRIPTION_POLL_INTERVAL).await;
                            }
                            Ok(rows) => {
                                after = rows.last().map_or(after, |r| r.position);
                                let updates: Vec<TransferUpdate> = rows
                                    .into_iter()
                                    .filter(|r| {
                                        req_id.as_ref().is_none_or(|id| *id == r.aggregate_id)
                                    })
                                    .filter_map(|r| {
                                        let event: TransferEvent =
                                            serde_json::from_value(r.payload.clone()).ok()?;
                                        Some(TransferUpdate {
                                            position: r.position,
                                            event_id: r.event_id,
                                            req_id: r.aggregate_id,
                                            user_id: r.user_id,
                                            event_type: r.event_type,
                                            state: event.resulting_state().as_str().to_owned(),
                                            occurred_at: r.occurred_at,
                                        })
                                    })
                                    .collect();
                                pending = updates.into_iter();
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "subscription ends: feed unreadable");
                                return None;
                            }
                        }
                    }
                }
            },
        ))
    }
}

/// A GraphQL-shaped error response with a contract code, for failures before execution.
fn error_response(status: StatusCode, code: ErrorCode, message: &str) -> Response {
    let body = serde_json::json!({
        "data": null,
        "errors": [{ "message": message, "extensions": { "code": code.as_str() } }],
    });
    (status, Json(body)).into_response()
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// `POST /graphql`: needs a bearer token; the body is a GraphQL request in JSON.
async fn graphql_post(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let identity = match bearer(&headers).map(|t| state.jwt.verify(t)) {
        Some(Ok(identity)) => identity,
        _ => {
            return error_response(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                describe(ErrorCode::Unauthorized),
            )
        }
    };
    let request: async_graphql::Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(_) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "request body is not a GraphQL request in JSON",
            )
        }
    };
    let mut response = state
        .graphql
        .execute(request.data(identity).data(state.clone()))
        .await;
    // Parse, validation, depth and complexity errors come without a code: they are the
    // caller's malformed requests.
    for error in &mut response.errors {
        let extensions = error
            .extensions
            .get_or_insert_with(ErrorExtensionValues::default);
        if extensions.get("code").is_none() {
            extensions.set("code", ErrorCode::BadRequest.as_str());
        }
    }
    Json(response).into_response()
}

/// `GET /graphql`: the GraphiQL page for exploring the schema (paste a token into its headers:
/// `{"Authorization": "Bearer <token>"}`).
async fn graphiql() -> Html<String> {
    Html(
        GraphiQLSource::build()
            .endpoint("/graphql")
            .subscription_endpoint("/graphql/ws")
            .title("ledger GraphQL")
            .finish(),
    )
}

/// `GET /graphql/ws`: subscriptions over websocket (graphql-ws or graphql-transport-ws). The
/// connection's init payload carries the token: `{"Authorization": "Bearer <token>"}` or
/// `{"token": "<token>"}`.
async fn graphql_ws(
    State(state): State<AppState>,
    protocol: GraphQLProtocol,
    upgrade: WebSocketUpgrade,
) -> Response {
    let schema = state.graphql.clone();
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .on_upgrade(move |socket| {
            GraphQLWebSocket::new(socket, schema, protocol)
                .on_connection_init(move |payload| async move {
                    let token = payload
                        .get("token")
                        .and_then(|v| v.as_str())
                        .map(str::to_owned)
                        .or_else(|| {
                            payload
                                .get("Authorization")
                                .or_else(|| payload.get("authorization"))
                                .and_then(|v| v.as_str())
                                .and_then(|v| v.strip_prefix("Bearer ").map(str::to_owned))
                        });
                    let identity = token
                        .as_deref()
                        .map(|t| state.jwt.verify(t))
                        .and_then(Result::ok)
                        .ok_or_else(|| coded(ErrorCode::Unauthorized))?;
                    let mut data = Data::default();
                    data.insert(identity);
                    data.insert(state);
                    Ok(data)
                })
                .serve()
        })
        .into_response()
}
