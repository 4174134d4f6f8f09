//! `POST /api/v1/internal_transfers`: many transfers in one request. The body is taken apart
//! here, item by item, with the single route's own shape checks (`routes::transfer_request`);
//! everything else is the core's one bulk command (`Ledger::request_transfers`), which checks
//! each item as the single route does and makes each step for the whole batch at once.
//!
//! Each item is its own transfer (its own req_id, state machine and recovery): a batch is not
//! one transaction, and a refused item does not stop the others. The answer is 200 with one
//! result per item, in request order; only a request that is not a batch at all (not a JSON
//! object with a `transfers` array, an empty one, or more items than the maximum) is refused
//! whole.

use application::bulk::body_bytes_max;
use application::TransferRequest;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::Method;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::body::{parse_user_id, JsonObject};
use crate::routes::{self, TransferResponse};
use edge::auth::AuthUser;
use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

/// The route's path.
pub const PATH: &str = "/api/v1/internal_transfers";

/// The bulk route, with a body limit that fits `transfers_max` items (the other routes keep
/// theirs).
pub fn routes(transfers_max: usize) -> Routes {
    Routes::new()
        .api(Method::POST, PATH, create_transfers)
        .layer(DefaultBodyLimit::max(body_bytes_max(transfers_max)))
}

/// The answer: one result per item, in request order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkResponse {
    pub results: Vec<BulkResult>,
}

/// One item's result: its transfer (where it stands, as the single route answers it), or its
/// refusal `{code, message}` (a transfer that exists and ended FAILED also carries its `req_id`
/// and `state`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum BulkResult {
    Transfer(TransferResponse),
    #[schema(value_type = edge::openapi::ErrorBody)]
    Refused(Value),
}

/// Many transfers in one request: `{"transfers": [{from, to, asset, amount, cid?, user_id?}, ...]}`.
///
/// A batch is NOT one transaction: each item is its own transfer, with its own req_id, state
/// machine and recovery, exactly as if it had been sent alone to `POST
/// /api/v1/internal_transfer`; some items may commit while others are refused or still in
/// progress, and nothing is undone because another item failed. Each item is checked in the
/// single route's order with its codes, and the answer (200) lists one result per item, in
/// request order: the transfer (`req_id`, `state`, `message`, ... as the single route answers
/// it; `state` is the final one when reached within the request deadline), or `{code, message}`
/// (plus `req_id` and `state` for a transfer that exists and FAILED). A user's token moves only
/// that user's money: an item naming a `user_id` is refused FORBIDDEN. An admin's token may name
/// the `user_id` of each item (its own when absent), for an exchange's back office. A `cid`
/// repeated in a later batch or the single route gets the original transfer; the same `cid`
/// twice in one batch is one transfer with the same body, and refused
/// IDEMPOTENCY_KEY_REUSED for the later item with another body. The per-second rate and the
/// daily limits count transfers, not requests. The items are moved side by side, not one after
/// another: an item cannot count on an earlier item's effect (send such a transfer in a later
/// request). More than `LEDGER_BULK_TRANSFERS_MAX` items
/// (1,000 by default) is refused whole, 400 BAD_REQUEST.
#[utoipa::path(post, path = "/api/v1/internal_transfers",
    request_body = BulkRequest,
    responses((status = 200, description = "one result per item, in request order; each item \
        is its own transfer, and a batch is not one transaction", body = BulkResponse),
        BulkRefusals))]
pub async fn create_transfers(
    State(state): State<AppState>,
    user: AuthUser,
    body: Result<JsonObject, ApiError>,
) -> Result<Json<BulkResponse>, ApiError> {
    // The extractor knows only the other routes' limit; this route's is its own.
    let JsonObject(body) = body.map_err(|e| match e {
        ApiError::PayloadTooLarge(_) => {
            ApiError::PayloadTooLarge(body_bytes_max(state.ledger.bulk_max()))
        }
        other => other,
    })?;
    let items = transfers_of(body, state.ledger.bulk_max())?;
    let mut results: Vec<Option<BulkResult>> = items.iter().map(|_| None).collect();
    let mut positions = Vec::with_capacity(items.len());
    let mut requests = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item_request(item, &user) {
            Ok(request) => {
                positions.push(i);
                requests.push(request);
            }
            Err(e) => results[i] = Some(refused(e)),
        }
    }
    let answers = state.ledger.request_transfers(requests).await;
    let created: Vec<String> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .filter(|d| d.state != domain::TransferState::Failed)
        .map(|d| d.req_id.to_string())
        .collect();
    let mut receipts = if created.is_empty() {
        Default::default()
    } else {
        edge::render::log_positions(&state, &created).await
    };
    for (i, answer) in positions.into_iter().zip(answers) {
        let rendered = answer.map_err(routes::request_error).and_then(|d| {
            let receipt = receipts.remove(&d.req_id.to_string());
            routes::transfer_answer(d, receipt, state.reads.log().cell())
        });
        results[i] = Some(match rendered {
            Ok(Json(transfer)) => BulkResult::Transfer(transfer),
            Err(e) => refused(e),
        });
    }
    let results = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| refused(ApiError::Internal("bulk result missing".into()))))
        .collect();
    Ok(Json(BulkResponse { results }))
}

/// The batch's items: the body must be `{"transfers": [...]}` with 1 to `transfers_max` items.
fn transfers_of(
    mut body: Map<String, Value>,
    transfers_max: usize,
) -> Result<Vec<Value>, ApiError> {
    if let Some(key) = body.keys().find(|k| k.as_str() != "transfers") {
        let shown: String = key.chars().take(64).collect();
        return Err(ApiError::BadRequest(format!("unknown field `{shown}`")));
    }
    let items = match body.remove("transfers") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::BadRequest("`transfers` must be an array".into())),
        None => return Err(ApiError::BadRequest("missing field `transfers`".into())),
    };
    if items.is_empty() {
        return Err(ApiError::BadRequest(
            "`transfers` must hold at least one transfer".into(),
        ));
    }
    if items.len() > transfers_max {
        return Err(ApiError::BadRequest(format!(
            "a request holds at most {transfers_max} transfers; this one holds {}",
            items.len()
        )));
    }
    Ok(items)
}

/// One item taken apart, in the order of contract §5.5: authorization first (whose money it moves), then
/// the single route's shape checks.
fn item_request(item: Value, caller: &AuthUser) -> Result<TransferRequest, ApiError> {
    let Value::Object(mut fields) = item else {
        return Err(ApiError::BadRequest(
            "each transfer must be a JSON object".into(),
        ));
    };
    let owner = match fields.remove("user_id").filter(|v| !v.is_null()) {
        None => caller.user_id,
        // A user's token moves only its own money, and names no user (`application::access`).
        Some(_) if !caller.access().may_name_users() => return Err(ApiError::Forbidden),
        Some(named) => parse_user_id(&named)?,
    };
    routes::transfer_request(fields, owner)
}

/// An item's refusal in the error shape; an internal failure's detail goes to the log only.
fn refused(e: ApiError) -> BulkResult {
    match &e {
        ApiError::Internal(detail) => tracing::error!(%detail, "bulk item failed inside"),
        ApiError::Unavailable(detail) | ApiError::Fenced(detail) => {
            tracing::warn!(%detail, "bulk item: backing service unavailable")
        }
        _ => {}
    }
    BulkResult::Refused(e.body())
}

/// `POST /api/v1/internal_transfers`' body (schema only: the handler takes it apart item by
/// item). At most `LEDGER_BULK_TRANSFERS_MAX` items (1,000 by default); more is refused whole,
/// 400 BAD_REQUEST, as is any field but `transfers`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BulkRequest {
    #[schema(schema_with = bulk_items)]
    pub transfers: Vec<BulkItem>,
}

/// The batch's items as the server takes them: each should be a [`BulkItem`], but any value is
/// accepted into the batch, and one that is not a valid item (not an object, a missing or
/// unknown field, a bad value) is refused in its own result, never the whole request (contract
/// §3, "Bulk transfers are not a transaction"). So the array's items are `BulkItem` or anything:
/// a schema that said only `BulkItem` would promise a 4xx the server does not give.
fn bulk_items() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder};
    use utoipa::openapi::{Ref, RefOr, Schema};
    let anything = Schema::Object(
        ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::SchemaType::AnyValue)
            .description(Some(
                "any other value: taken into the batch and refused in its own result \
                 (BAD_REQUEST for a value that is not an object or has an unknown field, the \
                 single route's code for a bad value)",
            ))
            .build(),
    );
    let item = AnyOfBuilder::new()
        .item(RefOr::Ref(Ref::from_schema_name("BulkItem")))
        .item(anything)
        .description(Some(
            "one transfer: a BulkItem (the single route's body; `user_id` with an admin's token)",
        ))
        .build();
    ArrayBuilder::new()
        .items(RefOr::T(Schema::AnyOf(item)))
        .min_items(Some(1))
        .max_items(Some(1000))
        .build()
}

/// One transfer of a batch: the single route's body; `user_id` only with an admin's token.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BulkItem {
    #[schema(schema_with = edge::openapi::from_account)]
    pub from: String,
    #[schema(schema_with = edge::openapi::to_account)]
    pub to: String,
    #[schema(schema_with = edge::openapi::asset)]
    pub asset: String,
    #[schema(schema_with = edge::openapi::amount)]
    pub amount: String,
    /// The client's idempotency key: a repeat (in a later batch or the single route) gets the
    /// original transfer; the same key twice in one batch with another body is refused for
    /// that item.
    #[schema(schema_with = edge::openapi::cid, required = false)]
    pub cid: Option<String>,
    /// Admin tokens only: whose money this item moves (the admin's own when absent). An item
    /// naming a user under a user's token is refused FORBIDDEN.
    #[schema(schema_with = admin_user_id, required = false)]
    pub user_id: Option<u64>,
}

/// A bulk item's `user_id`, with what it is for (`schema_with` drops the field's own doc).
fn admin_user_id() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::from(edge::openapi::user_id())
        .description(Some(
            "Admin tokens only: whose money this item moves (the admin's own when absent). \
             An item naming a user under a user's token is refused FORBIDDEN.",
        ))
        .build()
}

/// The whole request's refusals (an item's are in its result).
pub struct BulkRefusals;

impl utoipa::IntoResponses for BulkRefusals {
    fn responses(
    ) -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
        edge::openapi::refused(&[400, 401, 413, 415])
    }
}
