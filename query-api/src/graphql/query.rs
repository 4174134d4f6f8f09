//! The query root: history with filters and cursor pagination, one transfer, balances and
//! counts by state. Each field that does I/O costs [`IO_FIELD_COST`] and
//! takes a turn from the read admission.

use application::reads::{HistoryFilter, TransferRow, HISTORY_PAGE_SIZE_MAX};
use async_graphql::{Context, Object};
use domain::{ErrorCode, ReqId, TransferState, UserId};

use super::context::{app, busy, caller, coded, internal, IO_FIELD_COST, PAGE_SIZE_DEFAULT};
use super::types::{
    decode_cursor, encode_cursor, BalanceGql, Direction, PageInfo, StateCount, TransferConnection,
    TransferEdge, TransferFilter, TransferGql,
};
use edge::auth::Identity;
use edge::error::ApiError;
use edge::render::{money, user_balances};

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
        if !(1..=i32::try_from(HISTORY_PAGE_SIZE_MAX).unwrap_or(100)).contains(&first) {
            return Err(coded(ErrorCode::BadRequest));
        }
        let history = history_filter(me, &filter)?;
        let after = match after {
            None => None,
            Some(text) => Some(decode_cursor(&text).ok_or_else(|| coded(ErrorCode::BadRequest))?),
        };
        // One row more than asked tells whether there is a next page.
        let _turn = app(ctx).admission.read().await.map_err(busy)?;
        let rows = app(ctx)
            .reads
            .transfers()
            .history(&history, after.as_ref(), i64::from(first) + 1)
            .await
            .map_err(internal)?;
        Ok(connection(rows, first))
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
        let data = app(ctx).ledger.transfer(&req_id).await.map_err(internal)?;
        Ok(data
            .filter(|d| me.access().may_see(d.user_id))
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
        let named = user_id.map(UserId::new).transpose().map_err(coded)?;
        let user = me.access().one_user(named).map_err(coded)?;
        let state = app(ctx);
        // Three calls at once: two queries and one spot-core call.
        let _turns = state.admission.reads_at_once(3).await.map_err(busy)?;
        let merged = user_balances(state, user).await.map_err(|e| match e {
            ApiError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "spot-core balances unavailable");
                coded(ErrorCode::SystemError)
            }
            other => internal(format!("{other:?}")),
        })?;
        Ok(merged
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
        let counts = app(ctx)
            .reads
            .transfers()
            .state_counts()
            .await
            .map_err(internal)?;
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

/// The read models' filter for `filter`, as `me` may ask it: an admin names any user (or none),
/// a user only themself (FORBIDDEN for another); an unknown state is BAD_REQUEST.
fn history_filter(me: &Identity, filter: &TransferFilter) -> async_graphql::Result<HistoryFilter> {
    // A user asking for someone else's history is refused outright (`access`).
    let named = filter.user_id.map(UserId::new).transpose().map_err(coded)?;
    let user_id = me
        .access()
        .listing(named)
        .map_err(coded)?
        .map(UserId::as_i64);
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
    Ok(HistoryFilter {
        user_id,
        state_id,
        asset: filter.asset.clone(),
        from_account: from_account.map(str::to_owned),
        to_account: to_account.map(str::to_owned),
        created_from: filter.created_from,
        created_until: filter.created_until,
    })
}

/// A page of `first` transfers from `rows`, read one longer than the page to tell whether there
/// is a next one.
fn connection(mut rows: Vec<TransferRow>, first: i32) -> TransferConnection {
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
    TransferConnection {
        page_info: PageInfo {
            has_next_page,
            end_cursor: edges.last().map(|e| e.cursor.clone()),
        },
        edges,
        nodes,
    }
}
