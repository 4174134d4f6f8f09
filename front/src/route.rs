//! The front door of a process that serves several cells (ADR 0017 §5): one router per cell,
//! each the whole of today's application over that cell's state, and this router in front,
//! which picks the cell of each request by its user and forwards the request to that cell's
//! router unchanged.
//!
//! - A user's token: the user's cell, for every route (transfers, bulk, balances, history,
//!   GraphQL, the user's own transfer by req_id, the feed).
//! - An admin's token: a deposit (its external_id claimed across cells first, `claims.rs`), a
//!   single transfer, a user's page or an account's status goes to the cell of the user it
//!   names; a bulk request is split per cell; a route that names only a req_id (a transfer, its
//!   timeline, resolve, repair) is looked up in each cell in turn; the transfers list, the stuck
//!   list, the overview, the alerts and the conservation check fan out to every cell and merge
//!   (`views.rs`, `fanout.rs`); the check's history merges too, and clearing a halt or reading
//!   one run's report goes to the cell its `?cell=N` names (`checks.rs`); an asset change is
//!   written to the home cell, then to every other cell (`views.rs`); every other admin route
//!   (the asset list, the console) goes to the home cell (the lowest id), or the first cell up
//!   while it is down; a GET of the feed (`/api/v1/events`, its stream) reads every cell's
//!   feed, merged (`feed.rs`).
//! - No token, or one that does not verify: the home cell (or the first cell up), which answers
//!   as today (a public route, or the refusal).
//! - GraphQL over a websocket (`/graphql/ws`) carries its token in its `connection_init`
//!   message, not in a header: the front takes the socket itself, reads that message and relays
//!   the socket to the caller's cell, or for an admin to every cell, merged (`ws.rs`).
//! - `GET /healthz` and (on the API's address) `GET /metrics` are answered here for every cell.
//!
//! A cell that is down, or whose share of the requests in flight is taken (its bulkhead,
//! `slot.rs`), is answered at once: 503 SYSTEM_ERROR naming the cell.
//!
//! The placement is the map held now (`map.rs`): reloaded when a cell's stored map is newer, and
//! a user's write (its body buffered) that a cell refuses at the partition fence is sent once
//! more to the user's cell under the reloaded map.

use std::collections::BTreeMap;
use std::sync::Arc;

use application::external_ids::Claim;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use cells::CellId;
use domain::UserId;
use edge::auth::{bearer_token, Identity, JwtKeys};
use edge::config::BODY_BYTES_MAX;
use edge::error::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;
use tower::ServiceExt;

use crate::claims::Claims;
use crate::map::{rebuilt, routes_again, LiveMap};
use crate::slot::{self, Refusal, Slots};

/// The bulk route (`command_api`'s), which an admin's token may fill with users of many cells.
const BULK_PATH: &str = "/api/v1/internal_transfers";

/// The routers of every cell and how users are placed in them. Cheap to clone.
#[derive(Clone)]
pub struct Front {
    /// The cell map routed by, reloadable (`map.rs`).
    pub(crate) map: Arc<LiveMap>,
    pub(crate) slots: Slots,
    home: CellId,
    pub(crate) keys: Arc<JwtKeys>,
    bulk_max: usize,
    claims: Claims,
    /// Whether `/metrics` is served on the API's address (`LEDGER_METRICS_LISTEN=api`).
    metrics_on_api: bool,
    /// The merged feed of every cell (`feed.rs`): an admin's GET of the feed's paths.
    feed: Option<Router>,
    /// The partition moves' routes (`moves.rs`), when the process drives moves.
    pub(crate) moves: Option<application::moves::MoveDesk>,
    /// What adds a cell (`adding.rs`), when the process can.
    pub(crate) adder: Option<Arc<dyn crate::adder::CellAdder>>,
}

/// The user a JSON body names, if it names one (`user_id`).
#[derive(Deserialize)]
struct NamedUser {
    user_id: Option<u64>,
    external_id: Option<String>,
}

impl Front {
    /// The front over `slots` (one per cell the map names), routing by `map`, verifying tokens
    /// with `jwt_secret` as every cell's router does.
    pub fn new(
        map: Arc<LiveMap>,
        slots: Slots,
        jwt_secret: &[u8],
        bulk_max: usize,
        claims: Claims,
        metrics_on_api: bool,
    ) -> Self {
        let home = slots.home();
        Self {
            map,
            slots,
            home,
            keys: Arc::new(JwtKeys::new(jwt_secret)),
            bulk_max,
            claims,
            metrics_on_api,
            feed: None,
            moves: None,
            adder: None,
        }
    }

    /// Sends an admin's GET of the feed's paths to `feed` (every cell's feed, merged).
    pub fn with_feed(mut self, feed: Router) -> Self {
        self.feed = Some(feed);
        self
    }

    /// The router that takes every request and forwards it.
    pub fn router(self) -> Router {
        Router::new().fallback(route).with_state(self)
    }

    /// `GET /metrics` of every cell (`views.rs`), for a listener of its own.
    pub fn metrics_router(self) -> Router {
        Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let front = self.clone();
                async move { front.metrics().await }
            }),
        )
    }

    /// The cell of `user`, under the map held now.
    pub(crate) fn cell_of(&self, user: UserId) -> CellId {
        self.map.cell_of(user)
    }

    /// Hands `req` to `cell`'s router and returns its answer; a cell that is down or saturated
    /// is answered here at once (503 naming it), so its requests never wait on its pool.
    pub(crate) async fn forward(&self, cell: CellId, req: Request) -> Response {
        let (app, permit) = match self.admitted(cell) {
            Ok(admitted) => admitted,
            Err(why) => return not_admitted(cell, why),
        };
        let answer = answered(app, req).await;
        drop(permit);
        answer
    }

    /// `cell`'s router and a permit of its bulkhead, or why not (`None`: no such cell here).
    fn admitted(&self, cell: CellId) -> Result<(Router, OwnedSemaphorePermit), Option<Refusal>> {
        let slot = self.slots.get(&cell).ok_or(None)?;
        slot.admit().map_err(Some)
    }

    /// The cells, ascending.
    pub(crate) fn cells(&self) -> impl Iterator<Item = CellId> + '_ {
        self.slots.ids().into_iter()
    }

    /// The home cell, or the first cell up while it is down (for the routes any cell answers
    /// alike: the public ones, the asset list).
    pub(crate) fn any_cell(&self) -> CellId {
        let slots = self.slots.all();
        if slots[&self.home].is_up() {
            return self.home;
        }
        slots
            .values()
            .find(|s| s.is_up())
            .map_or(self.home, |s| s.id)
    }

    /// The home cell, where assets are authoritative.
    pub(crate) fn home(&self) -> CellId {
        self.home
    }

    /// An admin's request, by what it names.
    async fn admin(&self, admin: Identity, req: Request) -> Response {
        let path = req.uri().path().to_owned();
        if let Some(user) = user_in_path(&path) {
            return self.forward(self.cell_of(user), req).await;
        }
        if let Some(feed) = self
            .feed
            .as_ref()
            .filter(|_| req.method() == Method::GET && crate::feed::is_feed(&path))
        {
            return match feed.clone().oneshot(req).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
        }
        let post = req.method() == Method::POST;
        if post && path == BULK_PATH {
            return admin_bulk(self, admin, req).await;
        }
        if post && path == "/api/v1/admin/deposits" {
            return self.deposit(admin, req).await;
        }
        if post && path == "/api/v1/internal_transfer" {
            return self.by_named_user(admin, req).await;
        }
        if names_a_req_id(&path) {
            return self.find_in_cells(req).await;
        }
        if let Some(route) = self.check_route(req.method(), &path) {
            return route.run(self, req).await;
        }
        if let Some(answer) = self.admin_view(req.method(), &path) {
            return answer.run(self, req).await;
        }
        self.forward(self.any_cell(), req).await
    }

    /// A body naming `user_id` goes to that user's cell; one that names none (or does not parse:
    /// the cell answers 400 as today) to the admin's own.
    async fn by_named_user(&self, admin: Identity, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let bytes = match buffered(body, BODY_BYTES_MAX).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        };
        let (user, _) = named(&bytes, admin);
        self.to_user(user, parts, bytes).await
    }

    /// An external deposit: its external_id is claimed across cells first (`claims.rs`), then it
    /// goes to its user's cell. A body without an external_id goes there unclaimed: the cell
    /// refuses it as today.
    async fn deposit(&self, admin: Identity, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let bytes = match buffered(body, BODY_BYTES_MAX).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        };
        let (user, external_id) = named(&bytes, admin);
        if let Some(external_id) = external_id {
            match self.claims.claim(&external_id, user).await {
                Ok(claim) => {
                    if let (Some(code), Claim::OtherUser(holder)) = (claim.refusal(), claim) {
                        tracing::warn!(
                            external_id,
                            user = user.get(),
                            holder = holder.get(),
                            "external_id held by another user; deposit refused"
                        );
                        return ApiError::Refused(code).into_response();
                    }
                }
                Err(crate::claims::ClaimError::Down(cell)) => {
                    return slot::refused(cell, &Refusal::Down);
                }
                Err(e) => {
                    tracing::error!(error = %e, "external_id claim failed; deposit refused");
                    return ApiError::Unavailable(e.to_string()).into_response();
                }
            }
        }
        self.to_user(user, parts, bytes).await
    }

    /// Sends a write of `user`'s (its body buffered) to the user's cell; when that cell refuses
    /// it at the partition fence, reloads the map and, if the user lives in another cell under
    /// it, sends it once more there (the refused write wrote nothing). Otherwise the cell's
    /// answer stands, the 503 to retry included.
    pub(crate) async fn to_user(&self, user: UserId, parts: Parts, bytes: Bytes) -> Response {
        let cell = self.cell_of(user);
        let answer = self.forward(cell, rebuilt(&parts, bytes.clone())).await;
        self.again_if_fenced(user, cell, answer, &parts, bytes)
            .await
    }

    /// `answer`, `cell`'s to a write of `user`'s, unless it is the partition fence's refusal and
    /// the user lives in another cell under the reloaded map: then that cell's answer.
    async fn again_if_fenced(
        &self,
        user: UserId,
        cell: CellId,
        answer: Response,
        parts: &Parts,
        bytes: Bytes,
    ) -> Response {
        if !routes_again(&answer) {
            return answer;
        }
        self.map.reload_from(&self.slots).await;
        let now = self.cell_of(user);
        if now == cell {
            return answer;
        }
        tracing::info!(
            user = user.get(),
            from = %cell,
            to = %now,
            "a write fenced in its user's old cell is sent to its new one"
        );
        self.forward(now, rebuilt(parts, bytes)).await
    }

    /// A user's own request: to the user's cell. A write's body is read whole (up to its
    /// route's limit) once the cell's bulkhead has admitted it, as the cell would read it, so
    /// that a write fenced in the user's old cell can be sent to its new one (`map.rs`).
    async fn own(&self, user: UserId, req: Request) -> Response {
        let cell = self.cell_of(user);
        if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
            return self.forward(cell, req).await;
        }
        let limit = if req.uri().path() == BULK_PATH {
            application::bulk::body_bytes_max(self.bulk_max)
        } else {
            BODY_BYTES_MAX
        };
        let (app, permit) = match self.admitted(cell) {
            Ok(admitted) => admitted,
            Err(why) => return not_admitted(cell, why),
        };
        let (parts, body) = req.into_parts();
        let bytes = match buffered(body, limit).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        };
        let answer = answered(app, rebuilt(&parts, bytes.clone())).await;
        drop(permit);
        self.again_if_fenced(user, cell, answer, &parts, bytes)
            .await
    }

    /// A route that names only a req_id: asked of each cell in turn (ADR 0017 §5). The first
    /// answer other than 404 is the answer; a cell that failed (5xx) is remembered, so a req_id
    /// found nowhere while a cell was failing answers that cell's failure, not 404.
    async fn find_in_cells(&self, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let bytes = match buffered(body, BODY_BYTES_MAX).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        };
        let mut failed = None;
        let mut not_found = None;
        for cell in self.cells().collect::<Vec<_>>() {
            let mut copy = Request::builder()
                .method(parts.method.clone())
                .uri(parts.uri.clone())
                .version(parts.version)
                .body(Body::from(bytes.clone()))
                .expect("a copy of a valid request is valid");
            *copy.headers_mut() = parts.headers.clone();
            let answer = self.forward(cell, copy).await;
            match answer.status() {
                StatusCode::NOT_FOUND => not_found = Some(answer),
                s if s.is_server_error() => failed = failed.or(Some(answer)),
                _ => return answer,
            }
        }
        failed
            .or(not_found)
            .unwrap_or_else(|| ApiError::NotFound.into_response())
    }
}

/// The user a body names (the admin's own when it names none or does not parse), and its
/// external_id if it names one.
fn named(bytes: &[u8], admin: Identity) -> (UserId, Option<String>) {
    let named = serde_json::from_slice::<NamedUser>(bytes).ok();
    let user = named
        .as_ref()
        .and_then(|n| n.user_id)
        .and_then(|raw| UserId::new(raw).ok())
        .unwrap_or(admin.user_id);
    let external_id = named
        .and_then(|n| n.external_id)
        .filter(|id| !id.is_empty());
    (user, external_id)
}

/// Every request: by its token's user, or to the home cell without one.
async fn route(State(front): State<Front>, req: Request) -> Response {
    if req.method() == Method::GET {
        match req.uri().path() {
            "/healthz" => return slot::healthz(&front.slots),
            "/metrics" if front.metrics_on_api => return front.metrics().await,
            _ => {}
        }
    }
    if Front::is_ws(req.uri().path()) {
        // The token is in the socket's first message, not in a header (`ws.rs`).
        return front.ws_upgrade(req).await;
    }
    let identity = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .and_then(|token| front.keys.verify(token).ok());
    if let Some(cell) = log_cell(&req) {
        // The tamper-evident log of the cell it names (each cell checks who may see what).
        return match CellId::new(cell.into()).filter(|c| front.slots.contains_key(c)) {
            Some(cell) => front.forward(cell, req).await,
            None => ApiError::NotFound.into_response(),
        };
    }
    match identity {
        Some(id) if id.admin && Front::is_moves_path(req.uri().path()) => front.moves(req).await,
        Some(id) if id.admin && Front::is_add_cell(req.method(), req.uri().path()) => {
            front.add_cell(req).await
        }
        Some(id) if id.admin => front.admin(id, req).await,
        Some(id) => front.own(id.user_id, req).await,
        None => front.forward(front.any_cell(), req).await,
    }
}

/// The answer to a request `cell` did not admit: 503 naming it (down or saturated), or 500
/// for a cell this process does not serve.
fn not_admitted(cell: CellId, why: Option<Refusal>) -> Response {
    match why {
        Some(why) => slot::refused(cell, &why),
        None => ApiError::Internal(format!("no router for cell {cell}")).into_response(),
    }
}

/// `app`'s answer to `req`.
async fn answered(app: Router, req: Request) -> Response {
    match app.oneshot(req).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The body, read whole up to `bytes_max`; beyond it, the contract's 413.
async fn buffered(body: Body, bytes_max: usize) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, bytes_max)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(bytes_max).into_response())
}

/// A request rebuilt from `parts` with a new JSON body (its length recomputed).
fn with_body(parts: &axum::http::request::Parts, body: Vec<u8>) -> Request {
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version)
        .body(Body::from(body))
        .expect("a copy of a valid request is valid");
    *req.headers_mut() = parts.headers.clone();
    req.headers_mut().remove(CONTENT_LENGTH);
    req
}

/// `/api/v1/admin/users/{user_id}` and `/api/v1/admin/accounts/{user_id}/{account_type}/status`:
/// the user it names.
fn user_in_path(path: &str) -> Option<UserId> {
    let rest = path
        .strip_prefix("/api/v1/admin/users/")
        .or_else(|| path.strip_prefix("/api/v1/admin/accounts/"))?;
    let raw = rest.split('/').next()?.parse::<u64>().ok()?;
    UserId::new(raw).ok()
}

/// The cell a tamper-evident log route names (`/api/v1/log/...?cell=N`), if it names one; one
/// that names none goes by its token as any route, to the caller's own cell.
fn log_cell(req: &Request) -> Option<u16> {
    if !req.uri().path().starts_with("/api/v1/log/") {
        return None;
    }
    let query = req.uri().query()?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("cell="))?
        .parse()
        .ok()
}

/// The routes that name a req_id and no user: a transfer, its timeline, resolve, repair, its
/// log receipt.
fn names_a_req_id(path: &str) -> bool {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| !rest.is_empty() && rest != "stuck")
    };
    under("/api/v1/internal_transfer/")
        || under("/api/v1/admin/transfers/")
        || under("/api/v1/admin/repairs/")
        || under("/api/v1/log/receipts/")
}

/// An admin's bulk request across cells (DESIGN §15): items naming users of several cells are
/// split into one batch per cell, sent to the cells at once, and answered as one batch in request
/// order. A batch is not a transaction, so splitting it changes nothing a client may rely on:
/// each item is its own transfer, checked and answered as if sent alone. A body the cells would
/// refuse whole (not JSON, no `transfers`, empty, too many items) goes whole to the admin's own
/// cell, which refuses it with today's answer. A cell that cannot answer its part (down, halted,
/// its rate limit) gives each of its items that answer's `{code, message}`.
async fn admin_bulk(front: &Front, admin: Identity, req: Request) -> Response {
    let own = front.cell_of(admin.user_id);
    let (parts, body) = req.into_parts();
    let bytes = match buffered(body, application::bulk::body_bytes_max(front.bulk_max)).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused,
    };
    let whole = |bytes: Vec<u8>| with_body(&parts, bytes);
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(&bytes) else {
        return front.forward(own, whole(bytes.to_vec())).await;
    };
    let items = match doc.get("transfers") {
        Some(Value::Array(items)) if !items.is_empty() && items.len() <= front.bulk_max => items,
        _ => return front.forward(own, whole(bytes.to_vec())).await,
    };
    let mut groups: BTreeMap<CellId, Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let user = item
            .get("user_id")
            .and_then(Value::as_u64)
            .and_then(|raw| UserId::new(raw).ok());
        let cell = user.map_or(own, |u| front.cell_of(u));
        groups.entry(cell).or_default().push(i);
    }
    if groups.len() == 1 {
        let cell = *groups.keys().next().expect("one group");
        return front.forward(cell, whole(bytes.to_vec())).await;
    }
    let parts_answered = groups.iter().map(|(cell, indices)| {
        let mut part = doc.clone();
        let chosen: Vec<Value> = indices.iter().map(|&i| items[i].clone()).collect();
        part.insert("transfers".to_owned(), Value::Array(chosen));
        let body = serde_json::to_vec(&part).expect("JSON values serialize");
        front.forward(*cell, with_body(&parts, body))
    });
    let answers = futures_util::future::join_all(parts_answered).await;
    let mut results: Vec<Value> = vec![Value::Null; items.len()];
    for (indices, answer) in groups.values().zip(answers) {
        for (i, result) in indices
            .iter()
            .zip(part_results(answer, indices.len()).await)
        {
            results[*i] = result;
        }
    }
    (StatusCode::OK, Json(json!({ "results": results }))).into_response()
}

/// One cell's part of the answer: its results in order, or its refusal for each item.
async fn part_results(answer: Response, count: usize) -> Vec<Value> {
    let status = answer.status();
    let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .unwrap_or_else(|| {
            let unavailable = ApiError::Unavailable("a cell's bulk answer did not parse".into());
            json!({"code": unavailable.code(), "message": unavailable.message()})
        });
    if status == StatusCode::OK {
        if let Some(Value::Array(results)) = body.get("results") {
            if results.len() == count {
                return results.clone();
            }
        }
    }
    vec![body; count]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_a_path_names() {
        assert_eq!(
            user_in_path("/api/v1/admin/users/42").map(UserId::get),
            Some(42)
        );
        assert_eq!(user_in_path("/api/v1/admin/users/0"), None);
        assert_eq!(
            user_in_path("/api/v1/admin/accounts/7/FUNDING/status").map(UserId::get),
            Some(7)
        );
        assert_eq!(
            user_in_path("/api/v1/admin/accounts/x/FUNDING/status"),
            None
        );
        assert_eq!(user_in_path("/api/v1/admin/users/x"), None);
        assert_eq!(user_in_path("/api/v1/admin/transfers"), None);
    }

    #[test]
    fn the_routes_that_name_only_a_req_id() {
        assert!(names_a_req_id(
            "/api/v1/internal_transfer/01J0000000000000000000000"
        ));
        assert!(names_a_req_id("/api/v1/admin/transfers/01J0/resolve"));
        assert!(names_a_req_id("/api/v1/admin/repairs/01J0"));
        assert!(!names_a_req_id("/api/v1/admin/transfers/stuck"));
        assert!(!names_a_req_id("/api/v1/admin/transfers/"));
        assert!(!names_a_req_id("/api/v1/admin/transfers"));
    }
}
