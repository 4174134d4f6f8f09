//! GraphQL at `/graphql` (async-graphql on axum): transfer history with filters and cursor
//! pagination, one transfer with its events, balances, and counts by state; a websocket
//! subscription (`/graphql/ws`) streaming the caller's transfer state changes; a GraphiQL page
//! (`GET /graphql`). A user sees only their own; an admin sees all. Errors carry the contract's
//! code in `extensions.code`. Queries are bounded before validation by [`cost`] (expanded size,
//! root fields, nesting, in time linear in the document), then in depth and complexity (fields
//! that do I/O cost [`IO_FIELD_COST`]), except introspection, which the schema's size bounds
//! ([`introspection`], [`limits`]); the SDL is at `GET /graphql/schema.graphql`. Their I/O
//! waits its turn in the process's read
//! [`Admission`](edge::admission::Admission), and execution has a time limit. A websocket
//! closes when its token expires.

mod context;
pub mod cost;
pub mod introspection;
mod limits;
mod query;
mod subscription;
mod types;

pub(crate) use query::QueryRoot;
pub(crate) use subscription::SubscriptionRoot;

use std::time::{Duration, SystemTime};

use async_graphql::http::ALL_WEBSOCKET_PROTOCOLS;
use async_graphql::{Data, ErrorExtensionValues, Schema};
use async_graphql_axum::{GraphQLProtocol, GraphQLWebSocket};
use axum::body::Bytes;
use axum::extract::{State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use domain::ErrorCode;

use context::coded;
use edge::auth::{bearer_token, Session};
use edge::error::describe;
use edge::state::AppState;

/// Longest a query may run; past it the caller gets SYSTEM_ERROR and the work is dropped.
pub(crate) const EXECUTION_TIME_MAX: Duration = Duration::from_secs(10);
/// Longest a websocket may wait for its `connection_init` (and token).
pub const WS_INIT_WAIT_MAX: Duration = Duration::from_secs(10);

/// The websocket subprotocols `/graphql/ws` speaks, preferred first (graphql-transport-ws, then
/// the older graphql-ws).
pub const WS_PROTOCOLS: [&str; 2] = ALL_WEBSOCKET_PROTOCOLS;

/// The schema type.
pub(crate) type LedgerSchema = Schema<QueryRoot, async_graphql::EmptyMutation, SubscriptionRoot>;

/// The GraphQL routes, with the schema built once for them; merged into the application router.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/graphql", get(graphiql).post(graphql_post))
        .route("/graphql/ws", get(graphql_ws))
        .route(
            "/graphql/schema.graphql",
            get(limits::schema_sdl::<QueryRoot, async_graphql::EmptyMutation, SubscriptionRoot>),
        )
        .layer(axum::Extension(schema()))
}

/// Builds the schema with its limits, once per router ([`routes`]); each request (or websocket
/// connection) carries the application state and the caller's identity as data. The limits are
/// one extension ([`limits::Limits`]); introspection's bounds come from the schema itself.
pub(crate) fn schema() -> LedgerSchema {
    let bare = Schema::build(QueryRoot, async_graphql::EmptyMutation, SubscriptionRoot).finish();
    let bounds = introspection::Bounds::of_sdl(&bare.sdl());
    Schema::build(QueryRoot, async_graphql::EmptyMutation, SubscriptionRoot)
        .extension(limits::Limits { bounds })
        .finish()
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
async fn graphql_post(
    State(state): State<AppState>,
    axum::Extension(schema): axum::Extension<LedgerSchema>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
    let execution = schema.execute(request.data(identity).data(state.clone()));
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

/// `GET /graphql`: the GraphiQL page for exploring the schema, served from the binary with
/// everything it loads (`console.rs`). It sends the console's token when signed in from the same
/// tab; otherwise paste one into its headers: `{"Authorization": "Bearer <token>"}`.
async fn graphiql() -> Response {
    crate::console::graphiql_page()
}

/// `GET /graphql/ws`: subscriptions over websocket (graphql-ws or graphql-transport-ws). The
/// connection's init payload carries the token: `{"Authorization": "Bearer <token>"}` or
/// `{"token": "<token>"}`. The connection closes when the token expires, or after
/// [`WS_INIT_WAIT_MAX`] without a valid init.
async fn graphql_ws(
    State(state): State<AppState>,
    axum::Extension(schema): axum::Extension<LedgerSchema>,
    protocol: GraphQLProtocol,
    upgrade: WebSocketUpgrade,
) -> Response {
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .max_message_size(edge::config::BODY_BYTES_MAX)
        .max_frame_size(edge::config::BODY_BYTES_MAX)
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
    ws_init_token(payload)
        .and_then(|t| state.jwt.verify_session(t).ok())
        .ok_or_else(|| coded(ErrorCode::Unauthorized))
}

/// The token of a websocket's `connection_init` payload: `{"token": "<token>"}` or
/// `{"Authorization": "Bearer <token>"}` (any case of the scheme, as REST takes it). The front
/// router of a cell map reads it too, to pick the caller's cell (ADR 0017 §5).
pub fn ws_init_token(payload: &serde_json::Value) -> Option<&str> {
    payload.get("token").and_then(|v| v.as_str()).or_else(|| {
        payload
            .get("Authorization")
            .or_else(|| payload.get("authorization"))
            .and_then(|v| v.as_str())
            .and_then(bearer_token)
    })
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
