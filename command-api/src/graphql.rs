//! GraphQL at `/graphql` (async-graphql on axum): transfer history with filters and cursor
//! pagination, one transfer with its events, balances, and counts by state; a websocket
//! subscription (`/graphql/ws`) streaming the caller's transfer state changes; a GraphiQL page
//! (`GET /graphql`). A user sees only their own; an admin sees all. Errors carry the contract's
//! code in `extensions.code`. Queries are bounded before validation by [`cost`] (expanded size,
//! root fields, nesting, in time linear in the document), then in depth and complexity (fields
//! that do I/O cost [`IO_FIELD_COST`]); their I/O waits its turn in the process's read
//! [`Admission`](crate::admission::Admission), and execution has a time limit. A websocket
//! closes when its token expires.

pub mod cost;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest,
};
use async_graphql::http::{GraphiQLSource, ALL_WEBSOCKET_PROTOCOLS};
use async_graphql::{
    Context, Data, Enum, ErrorExtensionValues, InputObject, Object, Schema, ServerError,
    ServerResult, SimpleObject, Subscription,
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

use crate::admission::Busy;
use crate::app::AppState;
use crate::auth::{bearer_token, Identity, Session};
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
/// The complexity of a field that queries the database or spot-core: enough that a request can
/// hold only a few, whatever its aliases.
pub const IO_FIELD_COST: usize = 50;
/// Longest a query may run; past it the caller gets SYSTEM_ERROR and the work is dropped.
pub const EXECUTION_TIME_MAX: Duration = Duration::from_secs(10);
/// Longest a websocket may wait for its `connection_init` (and token).
pub const WS_INIT_WAIT_MAX: Duration = Duration::from_secs(10);

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
        .extension(CostGuard)
        .finish()
}

/// Runs [`cost::check`] on the parsed document before async-graphql's own checks and
/// validation, whose walks expand every fragment spread (for HTTP and websocket alike).
struct CostGuard;

impl ExtensionFactory for CostGuard {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(CostGuard)
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for CostGuard {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        mut request: async_graphql::Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<async_graphql::Request> {
        // Parsed once here; async-graphql reuses the parse.
        let document = request.parsed_query()?;
        if let Err(refusal) = cost::check(document) {
            let mut error = ServerError::new(refusal.message(), None);
            let mut extensions = ErrorExtensionValues::default();
            extensions.set("code", ErrorCode::BadRequest.as_str());
            error.extensions = Some(extensions);
            return Err(error);
        }
        next.run(ctx, request).await
    }
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

/// The read side is at capacity: the caller may try again shortly.
fn busy(_: Busy) -> async_graphql::Error {
    coded(ErrorCode::RateLimitExceeded)
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
    #[graphql(complexity = "IO_FIELD_COST + 10 * child_complexity")]
    async fn events(&self, ctx: &Context<'_>) -> async_graphql::Result<Vec<TransferEventGql>> {
        let _turn = app(ctx).admission.read().await.map_err(busy)?;
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
    #[graphql(
        complexity = "(first.unwrap_or(20).clamp(1, 100) as usize) * child_complexity + IO_FIELD_COST"
    )]
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
        let _turn = app(ctx).admission.read().await.map_err(busy)?;
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
    #[graphql(complexity = "IO_FIELD_COST + child_complexity")]
    async fn transfer(
        &self,
        ctx: &Context<'_>,
        req_id: String,
    ) -> async_graphql::Result<Option<TransferGql>> {
        let me = caller(ctx);
        let Ok(req_id) = ReqId::parse(&req_id) else {
            return Ok(None);
        };
        let _turn = app(ctx).admission.read().await.map_err(busy)?;
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
    #[graphql(complexity = "IO_FIELD_COST + child_complexity")]
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
        // Three calls at once: two queries and one spot-core call.
        let _turns = state.admission.reads_at_once(3).await.map_err(busy)?;
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
    #[graphql(complexity = "IO_FIELD_COST + child_complexity")]
    async fn state_counts(&self, ctx: &Context<'_>) -> async_graphql::Result<Vec<StateCount>> {
        if !caller(ctx).admin {
            return Err(coded(ErrorCode::Forbidden));
        }
        let _turn = app(ctx).admission.read().await.map_err(busy)?;
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
        let state = app(ctx).clone();
        // Held by the stream: the slot frees when the subscription ends.
        let slot = state.admission.subscription(me.user_id).map_err(busy)?;
        let start = match after {
            Some(position) if position >= 0 => position,
            Some(_) => return Err(coded(ErrorCode::BadRequest)),
            None => {
                let _turn = state.admission.read().await.map_err(busy)?;
                feed_store::head(state.ledger.pool())
                    .await
                    .map_err(internal)?
            }
        };
        let user = (!me.admin).then(|| me.user_id.as_i64());
        let pending = Vec::<TransferUpdate>::new().into_iter();
        Ok(stream::unfold(
            (state, start, pending, slot),
            move |(state, mut after, mut pending, slot)| {
                let req_id = req_id.clone();
                async move {
                    loop {
                        if let Some(update) = pending.next() {
                            return Some((update, (state, after, pending, slot)));
                        }
                        match next_updates(&state, after, user, req_id.as_deref()).await {
                            Ok(None) => tokio::time::sleep(SUBSCRIPTION_POLL_INTERVAL).await,
                            Ok(Some((last, updates))) => {
                                after = last;
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

/// The updates after feed position `after` (the caller's, or only `req_id`'s), with the last
/// position read; `None` when there is nothing new or the read side is busy (try again later).
async fn next_updates(
    state: &AppState,
    after: i64,
    user: Option<i64>,
    req_id: Option<&str>,
) -> Result<Option<(i64, Vec<TransferUpdate>)>, sqlx::Error> {
    let Ok(_turn) = state.admission.read().await else {
        return Ok(None);
    };
    let rows = feed_store::read_after(state.ledger.pool(), after, 500, user).await?;
    let Some(last) = rows.last().map(|r| r.position) else {
        return Ok(None);
    };
    let updates = rows
        .into_iter()
        .filter(|r| req_id.is_none_or(|id| id == r.aggregate_id))
        .filter_map(|r| {
            let event: TransferEvent = serde_json::from_value(r.payload.clone()).ok()?;
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
    Ok(Some((last, updates)))
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
    bearer_token(
        headers
            .get(axum::http::header::AUTHORIZATION)?
            .to_str()
            .ok()?,
    )
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
    let execution = state
        .graphql
        .execute(request.data(identity).data(state.clone()));
    let Ok(mut response) = tokio::time::timeout(EXECUTION_TIME_MAX, execution).await else {
        tracing::warn!(user = %identity.user_id, "graphql query stopped at its time limit");
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::SystemError,
            "the query ran past its time limit",
        );
    };
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
/// `{"token": "<token>"}`. The connection closes when the token expires, or after
/// [`WS_INIT_WAIT_MAX`] without a valid init.
async fn graphql_ws(
    State(state): State<AppState>,
    protocol: GraphQLProtocol,
    upgrade: WebSocketUpgrade,
) -> Response {
    let schema = state.graphql.clone();
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .max_message_size(crate::config::BODY_BYTES_MAX)
        .max_frame_size(crate::config::BODY_BYTES_MAX)
        .on_upgrade(move |socket| async move {
            let (expiry_tx, expiry_rx) = tokio::sync::watch::channel::<Option<SystemTime>>(None);
            let served = GraphQLWebSocket::new(socket, schema, protocol)
                .on_connection_init(move |payload| async move {
                    let session = ws_session(&state, &payload)?;
                    expiry_tx.send_replace(Some(session.expires_at));
                    let mut data = Data::default();
                    data.insert(session.identity);
                    data.insert(state);
                    Ok(data)
                })
                .serve();
            // Dropping the served connection closes the socket.
            tokio::select! {
                () = served => {}
                () = ws_deadline(expiry_rx) => {
                    tracing::debug!("websocket closed: no valid init in time, or its token expired");
                }
            }
        })
        .into_response()
}

/// Verifies the token of a websocket's init payload.
fn ws_session(state: &AppState, payload: &serde_json::Value) -> async_graphql::Result<Session> {
    let token = payload.get("token").and_then(|v| v.as_str()).or_else(|| {
        payload
            .get("Authorization")
            .or_else(|| payload.get("authorization"))
            .and_then(|v| v.as_str())
            .and_then(bearer_token)
    });
    token
        .and_then(|t| state.jwt.verify_session(t).ok())
        .ok_or_else(|| coded(ErrorCode::Unauthorized))
}

/// Completes when a websocket must close: [`WS_INIT_WAIT_MAX`] after it opened without a
/// verified token, or when the verified token expires.
async fn ws_deadline(mut expiry: tokio::sync::watch::Receiver<Option<SystemTime>>) {
    let verified = tokio::time::timeout(WS_INIT_WAIT_MAX, expiry.wait_for(Option::is_some)).await;
    let Ok(Ok(expires_at)) = verified.map(|r| r.map(|v| *v)) else {
        return;
    };
    let left = expires_at
        .and_then(|at| at.duration_since(SystemTime::now()).ok())
        .unwrap_or_default();
    tokio::time::sleep(left).await;
}
