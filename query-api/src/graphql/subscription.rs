//! The subscription root: a caller's transfer state changes from the feed, over websocket.

use application::reads::{FeedEvent, TRANSFER_AGGREGATE};
use async_graphql::{Context, SimpleObject, Subscription};
use chrono::{DateTime, Utc};
use domain::ErrorCode;
use futures_util::stream::{self, Stream};

use super::context::{app, busy, caller, coded, internal, SUBSCRIPTION_POLL_INTERVAL};
use edge::admission::SubscriptionSlot;
use edge::state::AppState;

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
    /// The cell whose feed holds the event, under a cell map (null without one): an admin's
    /// subscription there merges every cell's updates, and `position` is that cell's own.
    pub cell: Option<u16>,
}

/// Streams.
#[derive(Debug, Default)]
pub struct SubscriptionRoot;

#[Subscription]
impl SubscriptionRoot {
    /// The caller's transfer state changes (an admin's: everyone's), or only those of `reqId`:
    /// from now on, or after feed position `after` (to resume without missing any). Under a
    /// cell map this reads one cell's feed (each update names its `cell`); the front router
    /// runs a user's in the user's cell and merges an admin's over every cell. An event
    /// this version cannot decode, or a feed it cannot read, ends the stream with a
    /// SYSTEM_ERROR after the updates before it (the detail goes to the log): an update is never
    /// skipped.
    async fn transfer_updates(
        &self,
        ctx: &Context<'_>,
        req_id: Option<String>,
        after: Option<i64>,
    ) -> async_graphql::Result<impl Stream<Item = async_graphql::Result<TransferUpdate>>> {
        let me = *caller(ctx);
        let state = app(ctx).clone();
        // Held by the stream: the slot frees when the subscription ends.
        let slot = state.admission.subscription(me.user_id).map_err(busy)?;
        let start = match after {
            Some(position) if position >= 0 => position,
            Some(_) => return Err(coded(ErrorCode::BadRequest)),
            None => {
                let _turn = state.admission.read().await.map_err(busy)?;
                state.reads.feed_head().await.map_err(internal)?
            }
        };
        let follow = Follow {
            state,
            after: start,
            user: me
                .access()
                .listing(None)
                .ok()
                .flatten()
                .map(domain::UserId::as_i64),
            req_id,
            pending: Vec::new().into_iter(),
            end: None,
            _slot: slot,
        };
        Ok(stream::unfold(Some(follow), |follow| async move {
            let mut follow = follow?;
            let item = follow.next().await;
            // After an error item the stream ends.
            let more = item.is_ok().then_some(follow);
            Some((item, more))
        }))
    }
}

/// One subscription's place in the feed and what it still has to send.
struct Follow {
    state: AppState,
    /// The last feed position read.
    after: i64,
    user: Option<i64>,
    req_id: Option<String>,
    pending: std::vec::IntoIter<TransferUpdate>,
    /// Why the stream ends once `pending` is sent.
    end: Option<async_graphql::Error>,
    _slot: SubscriptionSlot,
}

impl Follow {
    /// The next update, waiting for one; an error ends the stream.
    async fn next(&mut self) -> async_graphql::Result<TransferUpdate> {
        loop {
            if let Some(update) = self.pending.next() {
                return Ok(update);
            }
            if let Some(end) = self.end.take() {
                return Err(end);
            }
            match next_updates(&self.state, self.after, self.user, self.req_id.as_deref()).await {
                Ok(None) => tokio::time::sleep(SUBSCRIPTION_POLL_INTERVAL).await,
                Ok(Some(batch)) => {
                    self.after = batch.last;
                    self.pending = batch.updates.into_iter();
                    self.end = batch.undecodable.map(internal);
                }
                Err(e) => return Err(internal(format!("subscription ends: feed unreadable: {e}"))),
            }
        }
    }
}

/// What one read of the feed gave a subscription.
struct Batch {
    /// The last position read.
    last: i64,
    updates: Vec<TransferUpdate>,
    /// The first event `domain::stored` refused, with its id: nothing after it is sent.
    undecodable: Option<String>,
}

/// The updates after feed position `after` (the caller's, or only `req_id`'s), each decoded by
/// `domain::stored` (the one payload decoder, with its version check); `None` when there is
/// nothing new or the read side is busy (try again later).
async fn next_updates(
    state: &AppState,
    after: i64,
    user: Option<i64>,
    req_id: Option<&str>,
) -> Result<Option<Batch>, application::StoreError> {
    let Ok(_turn) = state.admission.read().await else {
        return Ok(None);
    };
    let rows = state.reads.feed_after(after, 500, user).await?;
    Ok(batch(rows, req_id, state.reads.cell()))
}

/// The updates of `rows` (transfers' events only; only `req_id`'s, if given), each naming
/// `cell`, up to the first event `domain::stored` refuses; `None` for no rows.
fn batch(rows: Vec<FeedEvent>, req_id: Option<&str>, cell: Option<u16>) -> Option<Batch> {
    let last = rows.last()?.position;
    let mut batch = Batch {
        last,
        updates: Vec::new(),
        undecodable: None,
    };
    for r in rows {
        // Transfers only: a deposit's entry (aggregate `Deposit`, migration 0025) is in the feed
        // but changes no transfer's state.
        if r.aggregate_type != TRANSFER_AGGREGATE {
            continue;
        }
        if req_id.is_some_and(|id| id != r.aggregate_id) {
            continue;
        }
        let event = match domain::stored::decode_value(&r.event_version, r.payload) {
            Ok(event) => event,
            Err(e) => {
                batch.undecodable = Some(format!(
                    "subscription: event {} at feed position {} is undecodable: {e}",
                    r.event_id, r.position
                ));
                break;
            }
        };
        batch.updates.push(TransferUpdate {
            position: r.position,
            event_id: r.event_id,
            req_id: r.aggregate_id,
            user_id: r.user_id,
            event_type: r.event_type,
            state: event.resulting_state().as_str().to_owned(),
            occurred_at: r.occurred_at,
            cell,
        });
    }
    Some(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{TransferEvent, EVENT_VERSION};

    fn row(position: i64, req_id: &str, version: &str, payload: serde_json::Value) -> FeedEvent {
        FeedEvent {
            position,
            event_id: format!("Transfer:{req_id}:{position}"),
            global_position: position,
            aggregate_type: "Transfer".into(),
            aggregate_id: req_id.into(),
            sequence: position,
            event_type: "TransferCommitted".into(),
            event_version: version.into(),
            payload,
            user_id: Some(7),
            occurred_at: chrono::Utc::now(),
            recorded_at: chrono::Utc::now(),
            origin: None,
        }
    }

    fn committed() -> serde_json::Value {
        serde_json::to_value(TransferEvent::TransferCommitted {
            at: chrono::Utc::now(),
        })
        .unwrap()
    }

    #[test]
    fn updates_stop_at_the_first_event_of_an_unknown_version_and_say_which() {
        let rows = vec![
            row(1, "A", EVENT_VERSION, committed()),
            row(2, "A", "2", committed()),
            row(3, "A", EVENT_VERSION, committed()),
        ];
        let batch = batch(rows, None, None).unwrap();
        assert_eq!(batch.last, 3);
        let positions: Vec<i64> = batch.updates.iter().map(|u| u.position).collect();
        assert_eq!(positions, [1], "nothing after the refused event is sent");
        assert_eq!(batch.updates[0].state, "COMMITTED");
        let why = batch.undecodable.unwrap();
        assert!(why.contains("Transfer:A:2"), "{why}");
        assert!(why.contains("version 2 has no upcaster"), "{why}");
    }

    #[test]
    fn a_payload_that_is_not_an_event_is_not_skipped() {
        let rows = vec![row(4, "B", EVENT_VERSION, serde_json::json!({"Nope": {}}))];
        let batch = batch(rows, None, None).unwrap();
        assert!(batch.updates.is_empty());
        assert!(batch.undecodable.is_some());
    }

    #[test]
    fn a_deposit_in_the_feed_is_passed_over_and_the_position_moves_past_it() {
        let mut deposit = row(
            8,
            "ext-1",
            "1",
            serde_json::json!({"ExternalDeposited": {"external_id": "ext-1", "asset": "USDT",
                               "amount": "5", "at": "2026-01-01T00:00:00.000000Z"}}),
        );
        deposit.aggregate_type = "Deposit".into();
        deposit.event_type = "ExternalDeposited".into();
        let rows = vec![row(7, "A", EVENT_VERSION, committed()), deposit];
        let batch = batch(rows, None, None).unwrap();
        assert_eq!(batch.last, 8);
        let positions: Vec<i64> = batch.updates.iter().map(|u| u.position).collect();
        assert_eq!(positions, [7]);
        assert!(batch.undecodable.is_none());
    }

    #[test]
    fn another_transfer_is_filtered_out_before_decoding() {
        let rows = vec![
            row(5, "C", "2", committed()),
            row(6, "D", EVENT_VERSION, committed()),
        ];
        let batch = batch(rows, Some("D"), Some(2)).unwrap();
        assert_eq!(batch.updates.len(), 1);
        assert!(batch.undecodable.is_none());
        assert_eq!(batch.updates[0].cell, Some(2));
        assert!(super::batch(Vec::new(), None, None).is_none());
    }
}
