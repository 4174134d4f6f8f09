//! The GraphQL object and input types of the schema (transfers, their events, pages, balances,
//! counts) and the opaque page cursor, converted from the read models and the core's data.

use application::reads::{PageCursor, TransferRow};
use async_graphql::{Context, Enum, InputObject, Object, SimpleObject};
use chrono::{DateTime, Utc};
use domain::{ReqId, TransferData};
use rust_decimal::Decimal;

use super::context::{app, busy, internal, IO_FIELD_COST};
use edge::render::money;

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
    /// The feed positions of the transfer's events so far, in order: its entries in the
    /// tamper-evident log, a receipt to prove later (`GET /api/v1/log/proof/inclusion`).
    #[graphql(complexity = "IO_FIELD_COST")]
    async fn log_positions(&self, ctx: &Context<'_>) -> async_graphql::Result<Vec<i64>> {
        let _turn = app(ctx).admission.read().await.map_err(busy)?;
        let ids = [self.req_id.clone()];
        // Through the receipts' reader: a page of transfers resolves this field for each of
        // them at once, and those lookups go as one read.
        let mut positions = app(ctx)
            .reads
            .receipts()
            .positions_of(&ids)
            .await
            .map_err(internal)?;
        Ok(positions.remove(&self.req_id).unwrap_or_default())
    }
    /// The cell whose log holds `logPositions`, under a cell map (null without one).
    async fn log_cell(&self, ctx: &Context<'_>) -> Option<u16> {
        app(ctx).reads.log().cell()
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

pub(super) fn encode_cursor(row: &TransferGql) -> String {
    format!("{}_{}", row.created_at.timestamp_micros(), row.req_id)
}

pub(super) fn decode_cursor(text: &str) -> Option<PageCursor> {
    let (micros, req_id) = text.split_once('_')?;
    let created_at = DateTime::<Utc>::from_timestamp_micros(micros.parse().ok()?)?;
    ReqId::parse(req_id).ok()?;
    Some(PageCursor {
        created_at,
        req_id: req_id.to_owned(),
    })
}
