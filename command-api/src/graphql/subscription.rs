//! The subscription root: a caller's transfer state changes from the feed, over websocket.

use async_graphql::{Context, SimpleObject, Subscription};
use chrono::{DateTime, Utc};
use domain::{ErrorCode, TransferEvent};
use futures_util::stream::{self, Stream};
use projections::feed as feed_store;

use super::{app, busy, caller, coded, internal, SUBSCRIPTION_POLL_INTERVAL};
use crate::app::AppState;

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
