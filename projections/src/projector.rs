//! The projector: reads the event log in a commit-safe order and applies each event exactly once
//! to every read model (the consumer feed, `transfers_view`, `transfer_balances`,
//! `transfer_state_counts`), storing its position in the same transaction as its rows.
//!
//! Why the order is safe (docs/adr/0002-global-position.md): `global_position` comes from a
//! sequence, so a higher position can commit before a lower one. The projector only reads events
//! whose writing transaction is older than every transaction still running
//! (`tx_id < pg_snapshot_xmin(pg_current_snapshot())`): those transactions have ended, so no
//! event can ever appear below that horizon again. Taking them in (tx_id, global_position) order,
//! and remembering the last pair applied, every event is applied once, in one fixed order. A
//! transaction-scoped advisory lock makes one projector at a time the writer, which is what lets
//! it hand out dense feed positions.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use domain::{AccountType, TransferEvent, TransferState};
use rust_decimal::Decimal;
use sqlx::{PgPool, Postgres, Transaction};

use crate::transfers::TransferRow;

/// The advisory lock the live projector holds while it writes (an arbitrary, fixed key).
pub const LIVE_LOCK_KEY: i64 = 0x4c45_4447_4552_0001;

/// The most events one projector transaction applies; bounds its duration and memory.
pub const BATCH_EVENTS_MAX: i64 = 2000;

/// The aggregate type of transfers in the event table.
pub const TRANSFER_AGGREGATE: &str = "Transfer";

/// How long a background pass sleeps when it found nothing to do.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Why projecting stopped. Every variant leaves the stored position where it was: the batch
/// rolled back, and the next pass retries it.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// An event the projector cannot read (an unknown version needs an upcaster first).
    #[error("event {event_id} cannot be decoded: {detail}")]
    Undecodable { event_id: String, detail: String },
    /// The log contradicts itself (a gap or repeat in a transfer's sequence): projecting on would
    /// write wrong read models, so the projector stops.
    #[error("event {event_id} is out of order: {detail}")]
    OutOfOrder { event_id: String, detail: String },
}

/// One row of the event table with its position.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredEvent {
    pub tx_id: i64,
    pub global_position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: serde_json::Value,
}

impl StoredEvent {
    /// The consumers' de-duplication key (seed 001): built from the aggregate and its sequence,
    /// so the same event always has the same id, on any replay.
    pub fn event_id(&self) -> String {
        event_id(&self.aggregate_type, &self.aggregate_id, self.sequence)
    }

    /// The transfer event this row holds, or `None` for another aggregate type.
    pub fn transfer_event(&self) -> Result<Option<TransferEvent>, ProjectionError> {
        if self.aggregate_type != TRANSFER_AGGREGATE {
            return Ok(None);
        }
        if self.event_version != "1" {
            return Err(ProjectionError::Undecodable {
                event_id: self.event_id(),
                detail: format!("version {} has no upcaster", self.event_version),
            });
        }
        serde_json::from_value(self.payload.clone())
            .map(Some)
            .map_err(|e| ProjectionError::Undecodable {
                event_id: self.event_id(),
                detail: e.to_string(),
            })
    }
}

/// The id of one event: `<aggregate type>:<aggregate id>:<sequence>`.
pub fn event_id(aggregate_type: &str, aggregate_id: &str, sequence: i64) -> String {
    format!("{aggregate_type}:{aggregate_id}:{sequence}")
}

/// Per (user, asset): net FUNDING and SPOT movement caused by transfers, and the amount in
/// flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BalanceDelta {
    pub funding_net: Decimal,
    pub spot_net: Decimal,
    pub in_flight: Decimal,
}

impl BalanceDelta {
    fn account(&mut self, account: &str) -> &mut Decimal {
        if account == AccountType::Funding.as_str() {
            &mut self.funding_net
        } else {
            &mut self.spot_net
        }
    }
}

/// The pure fold shared by the live projector, the replay and point-in-time queries: applies
/// events to transfer rows and accumulates what they do to balances and state counts.
#[derive(Debug, Default)]
pub struct Fold {
    /// Transfers touched, by req_id, in their latest folded state.
    pub rows: HashMap<String, TransferRow>,
    /// Transfers created in this fold (inserted rather than updated).
    pub created: Vec<String>,
    pub balances: HashMap<(i64, String), BalanceDelta>,
    pub state_counts: HashMap<i16, i64>,
}

impl Fold {
    /// Applies one event. Transfer rows the event refers to must be in `rows` already (loaded by
    /// the caller or created by an earlier event of this fold). Returns the transfer's owner, for
    /// the feed.
    pub fn apply(&mut self, stored: &StoredEvent) -> Result<Option<i64>, ProjectionError> {
        let Some(event) = stored.transfer_event()? else {
            return Ok(None);
        };
        let out_of_order = |detail: String| ProjectionError::OutOfOrder {
            event_id: stored.event_id(),
            detail,
        };
        if let TransferEvent::TransferCreated {
            req_id,
            user_id,
            from,
            to,
            asset,
            amount,
            cid,
            at,
        } = &event
        {
            if stored.sequence != 1 || self.rows.contains_key(&stored.aggregate_id) {
                return Err(out_of_order(
                    "TransferCreated for an existing transfer".into(),
                ));
            }
            let row = TransferRow {
                req_id: req_id.to_string(),
                user_id: user_id.as_i64(),
                from_account: from.as_str().to_owned(),
                to_account: to.as_str().to_owned(),
                asset: asset.as_str().to_owned(),
                amount: amount.value(),
                cid: cid.clone(),
                state: TransferState::Init.as_str().to_owned(),
                state_id: TransferState::Init.id(),
                failure_code: None,
                failure_message: None,
                created_at: *at,
                updated_at: *at,
                last_sequence: 1,
            };
            *self.state_counts.entry(row.state_id).or_default() += 1;
            let owner = row.user_id;
            self.created.push(row.req_id.clone());
            self.rows.insert(row.req_id.clone(), row);
            return Ok(Some(owner));
        }
        let row = self
            .rows
            .get_mut(&stored.aggregate_id)
            .ok_or_else(|| out_of_order("event before its TransferCreated".into()))?;
        if stored.sequence != row.last_sequence + 1 {
            return Err(out_of_order(format!(
                "sequence {} follows {}",
                stored.sequence, row.last_sequence
            )));
        }
        let prev = TransferState::from_id(row.state_id)
            .ok_or_else(|| out_of_order(format!("unknown stored state {}", row.state_id)))?;
        let next = event.resulting_state();
        *self.state_counts.entry(row.state_id).or_default() -= 1;
        *self.state_counts.entry(next.id()).or_default() += 1;
        let delta = self
            .balances
            .entry((row.user_id, row.asset.clone()))
            .or_default();
        // Money effects follow the state change, not the event's name, so a manual resolution
        // (which may take SOURCE_PENDING to SOURCE_DONE, TARGET_PENDING to COMMITTED, ...) counts
        // exactly like the automatic step it stands for.
        match (prev.is_in_flight(), next.is_in_flight(), next) {
            // The source's withdraw was applied: the money is in flight.
            (false, true, _) => {
                *delta.account(&row.from_account) -= row.amount;
                delta.in_flight += row.amount;
            }
            // The target's deposit was applied.
            (true, false, TransferState::Committed) => {
                *delta.account(&row.to_account) += row.amount;
                delta.in_flight -= row.amount;
            }
            // The source's refund was applied.
            (true, false, TransferState::RolledBack) => {
                *delta.account(&row.from_account) += row.amount;
                delta.in_flight -= row.amount;
            }
            (true, false, other) => {
                return Err(out_of_order(format!(
                    "in-flight money cannot leave to {other}"
                )))
            }
            (false, false, _) | (true, true, _) => {}
        }
        match &event {
            TransferEvent::TransferFailed { code, message, .. }
            | TransferEvent::CompensationStarted { code, message, .. } => {
                row.failure_code = Some(code.clone());
                row.failure_message = Some(message.clone());
            }
            // The aggregate records an operator's FAILED or COMPENSATING with their reason.
            TransferEvent::TransferManuallyResolved {
                to_state: TransferState::Failed | TransferState::Compensating,
                reason,
                ..
            } => {
                row.failure_code = Some("MANUALLY_RESOLVED".to_owned());
                row.failure_message = Some(reason.clone());
            }
            _ => {}
        }
        row.state = next.as_str().to_owned();
        row.state_id = next.id();
        row.updated_at = event.at();
        row.last_sequence = stored.sequence;
        Ok(Some(row.user_id))
    }
}

/// The domain time an event carries, or `fallback` for an event the projector cannot read.
fn occurred_at(stored: &StoredEvent, fallback: DateTime<Utc>) -> DateTime<Utc> {
    match stored.transfer_event() {
        Ok(Some(event)) => event.at(),
        _ => fallback,
    }
}

/// What one projector pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Events applied in this pass.
    pub applied: usize,
    /// The horizon used: every transaction below it had ended, and (when `exhausted`) every event
    /// they wrote is now projected.
    pub horizon: i64,
    /// True when the pass applied everything below the horizon (it was not cut by the batch size
    /// or by `upto`).
    pub exhausted: bool,
    /// The last feed position handed out.
    pub feed_head: i64,
}

/// A projector over one set of read-model tables: the live ones (`schema == None`) or a fresh
/// copy in another schema (the replay).
#[derive(Debug, Clone)]
pub struct Projector {
    pool: PgPool,
    schema: Option<String>,
    lock_key: i64,
}

impl Projector {
    /// The live projector.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            schema: None,
            lock_key: LIVE_LOCK_KEY,
        }
    }

    /// A projector writing the tables of `schema` (created by the replay), under its own lock.
    pub fn in_schema(pool: PgPool, schema: String, lock_key: i64) -> Self {
        Self {
            pool,
            schema: Some(schema),
            lock_key,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Begins a transaction that resolves the read-model tables in this projector's schema.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if let Some(schema) = &self.schema {
            // The event table exists only in `public`, so it still resolves there.
            sqlx::query(&format!("SET LOCAL search_path TO \"{schema}\", public"))
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    /// One pass: applies up to [`BATCH_EVENTS_MAX`] events below the safe horizon (and at or
    /// below `upto`, a (tx_id, global_position) bound, if given) in one transaction, together
    /// with the new stored position.
    pub async fn pass(&self, upto: Option<(i64, i64)>) -> Result<Pass, ProjectionError> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(self.lock_key)
            .execute(&mut *tx)
            .await?;
        let (cur_tx, cur_pos, feed_head, applied_total): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT tx_id::text::bigint, global_position, feed_position, events_applied
             FROM projector_cursor WHERE projector = 'main' FOR UPDATE",
        )
        .fetch_one(&mut *tx)
        .await?;
        // A statement of its own: every transaction below this horizon has ended, so the next
        // statement (with a later snapshot) sees all of their events.
        let horizon: i64 =
            sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                .fetch_one(&mut *tx)
                .await?;
        let (up_tx, up_pos) = upto.unwrap_or((i64::MAX, i64::MAX));
        let events: Vec<StoredEvent> = sqlx::query_as(
            "SELECT tx_id::text::bigint AS tx_id, global_position, aggregate_type, aggregate_id,
                    sequence, event_type, event_version, payload::jsonb AS payload
             FROM events
             WHERE tx_id < $1::text::xid8
               AND (tx_id, global_position) > ($2::text::xid8, $3)
               AND (tx_id, global_position) <= ($4::text::xid8, $5)
             ORDER BY tx_id, global_position
             LIMIT $6",
        )
        .bind(horizon.to_string())
        .bind(cur_tx.to_string())
        .bind(cur_pos)
        .bind(up_tx.to_string())
        .bind(up_pos)
        .bind(BATCH_EVENTS_MAX)
        .fetch_all(&mut *tx)
        .await?;
        let exhausted = i64::try_from(events.len()).unwrap_or(i64::MAX) < BATCH_EVENTS_MAX;
        let Some(last) = events.last() else {
            tx.commit().await?;
            return Ok(Pass {
                applied: 0,
                horizon,
                exhausted,
                feed_head,
            });
        };
        let (last_tx, last_pos) = (last.tx_id, last.global_position);

        let mut fold = Fold::default();
        let known: Vec<String> = {
            let mut ids: Vec<String> = events
                .iter()
                .filter(|e| e.aggregate_type == TRANSFER_AGGREGATE && e.sequence > 1)
                .map(|e| e.aggregate_id.clone())
                .collect();
            ids.sort();
            ids.dedup();
            ids
        };
        if !known.is_empty() {
            let rows: Vec<TransferRow> =
                sqlx::query_as("SELECT * FROM transfers_view WHERE req_id = ANY($1)")
                    .bind(&known)
                    .fetch_all(&mut *tx)
                    .await?;
            fold.rows = rows.into_iter().map(|r| (r.req_id.clone(), r)).collect();
        }
        let now = Utc::now();
        let mut feed = FeedColumns::default();
        for (i, stored) in events.iter().enumerate() {
            let owner = fold.apply(stored)?;
            let position = feed_head + i64::try_from(i).unwrap_or(i64::MAX) + 1;
            feed.push(position, stored, owner, occurred_at(stored, now));
        }
        let new_head = feed_head + i64::try_from(events.len()).unwrap_or(i64::MAX);
        feed.insert(&mut tx).await?;
        write_transfers(&mut tx, &fold).await?;
        write_balances(&mut tx, &fold).await?;
        write_counts(&mut tx, &fold).await?;
        sqlx::query(
            "UPDATE projector_cursor SET tx_id = $1::text::xid8, global_position = $2,
                feed_position = $3, events_applied = $4, updated_at = now()
             WHERE projector = 'main'",
        )
        .bind(last_tx.to_string())
        .bind(last_pos)
        .bind(new_head)
        .bind(applied_total + i64::try_from(events.len()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Pass {
            applied: events.len(),
            horizon,
            exhausted,
            feed_head: new_head,
        })
    }

    /// Projects until every event committed before this call is applied, or until `wait_max`
    /// passes (a transaction still running anywhere on the server holds the horizon back).
    /// Returns whether it caught up.
    pub async fn catch_up(&self, wait_max: Duration) -> Result<bool, ProjectionError> {
        // Every transaction that had committed when this call began has an id below this.
        let target: i64 =
            sqlx::query_scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
                .fetch_one(&self.pool)
                .await?;
        let deadline = Instant::now() + wait_max;
        loop {
            let pass = self.pass(None).await?;
            if pass.exhausted && pass.horizon >= target {
                return Ok(true);
            }
            if pass.exhausted {
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                // The horizon moves when the transactions running now end; they are short.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    /// Projects forever: a pass, then a short sleep when there was nothing to do. Errors are
    /// logged and retried with bounded backoff; the stored position never moves past a failure.
    pub async fn run(self) {
        let mut backoff = POLL_INTERVAL;
        loop {
            match self.pass(None).await {
                Ok(pass) => {
                    backoff = POLL_INTERVAL;
                    if pass.exhausted {
                        tokio::time::sleep(POLL_INTERVAL).await;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "projector pass failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// The feed rows of one pass, as columns for one UNNEST insert.
#[derive(Default)]
struct FeedColumns {
    position: Vec<i64>,
    event_id: Vec<String>,
    global_position: Vec<i64>,
    aggregate_type: Vec<String>,
    aggregate_id: Vec<String>,
    sequence: Vec<i64>,
    event_type: Vec<String>,
    event_version: Vec<String>,
    payload: Vec<serde_json::Value>,
    user_id: Vec<Option<i64>>,
    occurred_at: Vec<DateTime<Utc>>,
}

impl FeedColumns {
    fn push(&mut self, position: i64, e: &StoredEvent, owner: Option<i64>, at: DateTime<Utc>) {
        self.position.push(position);
        self.event_id.push(e.event_id());
        self.global_position.push(e.global_position);
        self.aggregate_type.push(e.aggregate_type.clone());
        self.aggregate_id.push(e.aggregate_id.clone());
        self.sequence.push(e.sequence);
        self.event_type.push(e.event_type.clone());
        self.event_version.push(e.event_version.clone());
        self.payload.push(e.payload.clone());
        self.user_id.push(owner);
        self.occurred_at.push(at);
    }

    async fn insert(self, tx: &mut Transaction<'static, Postgres>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO feed (position, event_id, global_position, aggregate_type, aggregate_id,
                sequence, event_type, event_version, payload, user_id, occurred_at)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[],
                $6::bigint[], $7::text[], $8::text[], $9::jsonb[], $10::bigint[], $11::timestamptz[])",
        )
        .bind(self.position)
        .bind(self.event_id)
        .bind(self.global_position)
        .bind(self.aggregate_type)
        .bind(self.aggregate_id)
        .bind(self.sequence)
        .bind(self.event_type)
        .bind(self.event_version)
        .bind(self.payload)
        .bind(self.user_id)
        .bind(self.occurred_at)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

async fn write_transfers(
    tx: &mut Transaction<'static, Postgres>,
    fold: &Fold,
) -> Result<(), sqlx::Error> {
    let mut rows: Vec<&TransferRow> = fold.rows.values().collect();
    rows.sort_by(|a, b| a.req_id.cmp(&b.req_id));
    let created: std::collections::HashSet<&str> =
        fold.created.iter().map(String::as_str).collect();
    let (new, old): (Vec<&TransferRow>, Vec<&TransferRow>) = rows
        .into_iter()
        .partition(|r| created.contains(r.req_id.as_str()));
    if !new.is_empty() {
        sqlx::query(
            "INSERT INTO transfers_view (req_id, user_id, from_account, to_account, asset, amount,
                cid, state, state_id, failure_code, failure_message, created_at, updated_at,
                last_sequence)
             SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                $6::numeric[], $7::text[], $8::text[], $9::smallint[], $10::text[], $11::text[],
                $12::timestamptz[], $13::timestamptz[], $14::bigint[])",
        )
        .bind(new.iter().map(|r| r.req_id.clone()).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.user_id).collect::<Vec<_>>())
        .bind(
            new.iter()
                .map(|r| r.from_account.clone())
                .collect::<Vec<_>>(),
        )
        .bind(new.iter().map(|r| r.to_account.clone()).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.asset.clone()).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.amount).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.cid.clone()).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.state.clone()).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.state_id).collect::<Vec<_>>())
        .bind(
            new.iter()
                .map(|r| r.failure_code.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            new.iter()
                .map(|r| r.failure_message.clone())
                .collect::<Vec<_>>(),
        )
        .bind(new.iter().map(|r| r.created_at).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.updated_at).collect::<Vec<_>>())
        .bind(new.iter().map(|r| r.last_sequence).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?;
    }
    if !old.is_empty() {
        sqlx::query(
            "UPDATE transfers_view t SET state = u.state, state_id = u.state_id,
                failure_code = u.failure_code, failure_message = u.failure_message,
                updated_at = u.updated_at, last_sequence = u.last_sequence
             FROM UNNEST($1::text[], $2::text[], $3::smallint[], $4::text[], $5::text[],
                $6::timestamptz[], $7::bigint[])
                AS u(req_id, state, state_id, failure_code, failure_message, updated_at, last_sequence)
             WHERE t.req_id = u.req_id",
        )
        .bind(old.iter().map(|r| r.req_id.clone()).collect::<Vec<_>>())
        .bind(old.iter().map(|r| r.state.clone()).collect::<Vec<_>>())
        .bind(old.iter().map(|r| r.state_id).collect::<Vec<_>>())
        .bind(old.iter().map(|r| r.failure_code.clone()).collect::<Vec<_>>())
        .bind(old.iter().map(|r| r.failure_message.clone()).collect::<Vec<_>>())
        .bind(old.iter().map(|r| r.updated_at).collect::<Vec<_>>())
        .bind(old.iter().map(|r| r.last_sequence).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn write_balances(
    tx: &mut Transaction<'static, Postgres>,
    fold: &Fold,
) -> Result<(), sqlx::Error> {
    let mut deltas: Vec<(&(i64, String), &BalanceDelta)> = fold
        .balances
        .iter()
        .filter(|(_, d)| **d != BalanceDelta::default())
        .collect();
    if deltas.is_empty() {
        return Ok(());
    }
    // A fixed order keeps two writers (live and a replay's final step) from deadlocking.
    deltas.sort_by(|a, b| a.0.cmp(b.0));
    sqlx::query(
        "INSERT INTO transfer_balances AS b (user_id, asset, funding_net, spot_net, in_flight)
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::numeric[], $4::numeric[], $5::numeric[])
         ON CONFLICT (user_id, asset) DO UPDATE SET
            funding_net = b.funding_net + EXCLUDED.funding_net,
            spot_net = b.spot_net + EXCLUDED.spot_net,
            in_flight = b.in_flight + EXCLUDED.in_flight",
    )
    .bind(deltas.iter().map(|(k, _)| k.0).collect::<Vec<_>>())
    .bind(deltas.iter().map(|(k, _)| k.1.clone()).collect::<Vec<_>>())
    .bind(
        deltas
            .iter()
            .map(|(_, d)| d.funding_net)
            .collect::<Vec<_>>(),
    )
    .bind(deltas.iter().map(|(_, d)| d.spot_net).collect::<Vec<_>>())
    .bind(deltas.iter().map(|(_, d)| d.in_flight).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn write_counts(
    tx: &mut Transaction<'static, Postgres>,
    fold: &Fold,
) -> Result<(), sqlx::Error> {
    let mut counts: Vec<(i16, i64)> = fold
        .state_counts
        .iter()
        .filter(|(_, n)| **n != 0)
        .map(|(s, n)| (*s, *n))
        .collect();
    if counts.is_empty() {
        return Ok(());
    }
    counts.sort();
    let names: Vec<String> = counts
        .iter()
        .map(|(s, _)| {
            TransferState::from_id(*s)
                .map_or("UNKNOWN", TransferState::as_str)
                .to_owned()
        })
        .collect();
    sqlx::query(
        "INSERT INTO transfer_state_counts AS c (state_id, state, count)
         SELECT * FROM UNNEST($1::smallint[], $2::text[], $3::bigint[])
         ON CONFLICT (state_id) DO UPDATE SET count = c.count + EXCLUDED.count",
    )
    .bind(counts.iter().map(|(s, _)| *s).collect::<Vec<_>>())
    .bind(names)
    .bind(counts.iter().map(|(_, n)| *n).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
