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

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use domain::{AccountType, TransferEvent, TransferState};
use rust_decimal::Decimal;
use rustc_hash::FxHashMap;
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
    /// A bulk rebuild could not run or read the log (not about one event).
    #[error("bulk rebuild: {0}")]
    Bulk(String),
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
        if self.event_version != domain::EVENT_VERSION {
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
    pub rows: FxHashMap<String, TransferRow>,
    /// Transfers created in this fold (inserted rather than updated).
    pub created: Vec<String>,
    pub balances: FxHashMap<(i64, String), BalanceDelta>,
    pub state_counts: FxHashMap<i16, i64>,
}

impl Fold {
    /// Applies one event. Transfer rows the event refers to must be in `rows` already (loaded by
    /// the caller or created by an earlier event of this fold). Returns the transfer's owner, for
    /// the feed.
    pub fn apply(&mut self, stored: &StoredEvent) -> Result<Option<i64>, ProjectionError> {
        let event = stored.transfer_event()?;
        self.apply_decoded(
            &stored.aggregate_type,
            &stored.aggregate_id,
            stored.sequence,
            event.as_ref(),
        )
    }

    /// [`Fold::apply`] for an event whose payload the caller has already decoded (`None` for
    /// another aggregate type), so a batch decodes each payload once, straight from its text.
    pub fn apply_decoded(
        &mut self,
        aggregate_type: &str,
        aggregate_id: &str,
        sequence: i64,
        event: Option<&TransferEvent>,
    ) -> Result<Option<i64>, ProjectionError> {
        let Some(event) = event else {
            return Ok(None);
        };
        let out_of_order = |detail: String| ProjectionError::OutOfOrder {
            event_id: event_id(aggregate_type, aggregate_id, sequence),
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
        } = event
        {
            if sequence != 1 || self.rows.contains_key(aggregate_id) {
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
            .get_mut(aggregate_id)
            .ok_or_else(|| out_of_order("event before its TransferCreated".into()))?;
        if sequence != row.last_sequence + 1 {
            return Err(out_of_order(format!(
                "sequence {} follows {}",
                sequence, row.last_sequence
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
        match event {
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
        row.last_sequence = sequence;
        Ok(Some(row.user_id))
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
        let rows: Vec<EventRow> = sqlx::query_as(&format!("{SELECT_EVENTS} LIMIT $6"))
            .bind(horizon.to_string())
            .bind(cur_tx.to_string())
            .bind(cur_pos)
            .bind(up_tx.to_string())
            .bind(up_pos)
            .bind(BATCH_EVENTS_MAX)
            .fetch_all(&mut *tx)
            .await?;
        let exhausted = i64::try_from(rows.len()).unwrap_or(i64::MAX) < BATCH_EVENTS_MAX;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(Pass {
                applied: 0,
                horizon,
                exhausted,
                feed_head,
            });
        }
        let events = rows
            .into_iter()
            .map(BatchEvent::decode)
            .collect::<Result<Vec<_>, _>>()?;
        let new_head = apply_batch(&mut tx, &events, feed_head, applied_total).await?;
        tx.commit().await?;
        Ok(Pass {
            applied: events.len(),
            horizon,
            exhausted,
            feed_head: new_head,
        })
    }

    /// Applies every event up to `upto` (inclusive) to empty tables, for a bulk rebuild: the same
    /// fold as [`Projector::pass`] over the same (tx_id, global_position) order, but written the
    /// way a bulk load is cheapest, in three stages that run at once: one streaming read of the
    /// log, decoded on its own task; the fold on this task, kept across batches, so a transfer's
    /// row is written once when it reaches a final state (or at the end, if still open) instead
    /// of inserted and updated; and a writer task sending each batch's rows with COPY. Balances
    /// and state counts are written once at the end. It is one transaction holding the lock for
    /// the whole pass: a second writer waits, and the stored position moves once, with
    /// everything. Memory holds the open transfers, the balances and a few batches.
    /// Refused unless nothing was applied yet (the replay's fresh tables). Only for bounds the
    /// caller knows are below the horizon (the replay's target is a position the live projector
    /// already applied), so the set read can never change. Returns the number of events applied;
    /// `progress` gets each batch's size.
    pub async fn bulk_pass(
        &self,
        upto: (i64, i64),
        batch_max: usize,
        mut progress: impl FnMut(usize),
    ) -> Result<usize, ProjectionError> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(self.lock_key)
            .execute(&mut *tx)
            .await?;
        let applied_before: i64 = sqlx::query_scalar(
            "SELECT events_applied FROM projector_cursor WHERE projector = 'main' FOR UPDATE",
        )
        .fetch_one(&mut *tx)
        .await?;
        if applied_before != 0 {
            return Err(ProjectionError::Bulk(format!(
                "a bulk pass needs empty tables; {applied_before} events were applied"
            )));
        }
        let horizon: i64 =
            sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                .fetch_one(&mut *tx)
                .await?;
        let batch_max = batch_max.max(1);
        let (send, mut recv) =
            tokio::sync::mpsc::channel::<Result<Vec<BatchEvent>, ProjectionError>>(2);
        let reader = tokio::spawn(copy_events(
            self.pool.clone(),
            [horizon, 0, 0, upto.0, upto.1],
            batch_max,
            send,
        ));
        // The writer owns the transaction while batches stream, and hands it back at the end.
        // It encodes the rows too (and frees the batch), so the fold does nothing else.
        let (to_writer, mut writes) = tokio::sync::mpsc::channel::<Folded>(2);
        let writer = tokio::spawn(async move {
            while let Some(batch) = writes.recv().await {
                let now = Utc::now();
                let mut feed = FeedCopy::with_capacity(batch.events.len());
                for (e, (position, owner)) in batch.events.iter().zip(batch.feed) {
                    feed.push(
                        position,
                        e,
                        owner,
                        e.event.as_ref().map_or(now, TransferEvent::at),
                    );
                }
                feed.insert(&mut tx).await?;
                let mut transfers = CopyText::with_capacity(batch.finished.len() * 200);
                for row in &batch.finished {
                    transfers.transfer(row);
                }
                transfers.send(&mut tx, COPY_TRANSFERS).await?;
            }
            Ok::<_, sqlx::Error>(tx)
        });
        let mut applied = 0usize;
        let mut feed_head = 0_i64;
        let mut last = None;
        let mut fold = Fold::default();
        let folded = async {
            while let Some(events) = recv.recv().await {
                let events = events?;
                let mut feed = Vec::with_capacity(events.len());
                let mut finished = Vec::new();
                for e in &events {
                    if e.sequence > 1 && e.event.is_some() && !fold.rows.contains_key(&e.aggregate_id) {
                        return Err(ProjectionError::OutOfOrder {
                            event_id: event_id(&e.aggregate_type, &e.aggregate_id, e.sequence),
                            detail: "event for a transfer that is not open (never created, or already final)".into(),
                        });
                    }
                    let owner = fold.apply_decoded(
                        &e.aggregate_type,
                        &e.aggregate_id,
                        e.sequence,
                        e.event.as_ref(),
                    )?;
                    feed_head += 1;
                    feed.push((feed_head, owner));
                    if e.event.as_ref().is_some_and(|ev| ev.resulting_state().is_terminal()) {
                        if let Some(row) = fold.rows.remove(&e.aggregate_id) {
                            finished.push(row);
                        }
                    }
                }
                fold.created.clear();
                let last_here = events.last().map(|e| (e.tx_id, e.global_position));
                let count = events.len();
                if to_writer.send(Folded { events, feed, finished }).await.is_err() {
                    // The writer stopped on an error, which it returns below.
                    break;
                }
                if last_here.is_some() {
                    last = last_here;
                }
                applied += count;
                progress(count);
            }
            Ok(())
        }
        .await;
        drop(to_writer);
        // On an error the reader may still be blocked sending; dropping `recv` ends it, and this
        // waits so no query outlives the call.
        drop(recv);
        reader.await.ok();
        let written = writer
            .await
            .map_err(|e| ProjectionError::Bulk(format!("the bulk writer stopped: {e}")))?;
        folded?;
        let mut tx = written?;
        let mut open = CopyText::with_capacity(fold.rows.len() * 200);
        for row in fold.rows.values() {
            open.transfer(row);
        }
        open.send(&mut tx, COPY_TRANSFERS).await?;
        write_balances(&mut tx, &fold).await?;
        write_counts(&mut tx, &fold).await?;
        if let Some((last_tx, last_pos)) = last {
            sqlx::query(
                "UPDATE projector_cursor SET tx_id = $1::text::xid8, global_position = $2,
                    feed_position = $3, events_applied = $4, updated_at = now()
                 WHERE projector = 'main'",
            )
            .bind(last_tx.to_string())
            .bind(last_pos)
            .bind(feed_head)
            .bind(i64::try_from(applied).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(applied)
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

/// The event query of both passes: events below the horizon ($1), after the stored pair ($2,
/// $3), at or before a bound ($4, $5), in the one fixed order. The ORDER BY names the table's
/// columns (`e.`), not the text-cast output column of the same name, so the
/// (tx_id, global_position) index serves it; ordering by the alias made every pass sort the whole
/// log. The payload is read as its stored JSON text and decoded once in Rust.
const SELECT_EVENTS: &str = "SELECT e.tx_id::text::bigint AS tx_id, e.global_position,
        e.aggregate_type, e.aggregate_id, e.sequence, e.event_version,
        e.payload::text AS payload
     FROM events e
     WHERE e.tx_id < $1::text::xid8
       AND (e.tx_id, e.global_position) > ($2::text::xid8, $3)
       AND (e.tx_id, e.global_position) <= ($4::text::xid8, $5)
     ORDER BY e.tx_id, e.global_position";

/// One row as the event query returns it.
#[derive(sqlx::FromRow)]
struct EventRow {
    tx_id: i64,
    global_position: i64,
    aggregate_type: String,
    aggregate_id: String,
    sequence: i64,
    event_version: String,
    payload: String,
}

/// One event of a batch: where it stands in the log, whose it is, and the transfer event decoded
/// from its payload (`None` for another aggregate type).
struct BatchEvent {
    tx_id: i64,
    global_position: i64,
    aggregate_type: String,
    aggregate_id: String,
    sequence: i64,
    event: Option<TransferEvent>,
}

impl BatchEvent {
    /// Decodes the payload, with the same refusals as [`StoredEvent::transfer_event`].
    fn decode(row: EventRow) -> Result<Self, ProjectionError> {
        let event = Self::transfer_event(
            &row.aggregate_type,
            &row.aggregate_id,
            row.sequence,
            &row.event_version,
            &row.payload,
        )?;
        Ok(Self {
            tx_id: row.tx_id,
            global_position: row.global_position,
            aggregate_type: row.aggregate_type,
            aggregate_id: row.aggregate_id,
            sequence: row.sequence,
            event,
        })
    }

    fn transfer_event(
        aggregate_type: &str,
        aggregate_id: &str,
        sequence: i64,
        event_version: &str,
        payload: &str,
    ) -> Result<Option<TransferEvent>, ProjectionError> {
        if aggregate_type != TRANSFER_AGGREGATE {
            return Ok(None);
        }
        if event_version != domain::EVENT_VERSION {
            return Err(ProjectionError::Undecodable {
                event_id: event_id(aggregate_type, aggregate_id, sequence),
                detail: format!("version {event_version} has no upcaster"),
            });
        }
        serde_json::from_str(payload)
            .map(Some)
            .map_err(|e| ProjectionError::Undecodable {
                event_id: event_id(aggregate_type, aggregate_id, sequence),
                detail: e.to_string(),
            })
    }

    /// Decodes one line of [`copy_events`]' output: [`SELECT_EVENTS`]'s columns in COPY's text
    /// format.
    fn from_copy_line(line: &[u8]) -> Result<Self, ProjectionError> {
        let bad = |column: &str| {
            ProjectionError::Bulk(format!("unreadable {column} in an event row from COPY"))
        };
        let mut fields = line.split(|b| *b == b'\t');
        let mut next = |name: &str| {
            let raw = fields.next().ok_or_else(|| bad(name))?;
            copy_unescape(raw).ok_or_else(|| bad(name))
        };
        let int = |text: std::borrow::Cow<'_, str>, name: &str| {
            text.parse::<i64>().map_err(|_| bad(name))
        };
        let tx_id = int(next("tx_id")?, "tx_id")?;
        let global_position = int(next("global_position")?, "global_position")?;
        let aggregate_type = next("aggregate_type")?;
        let aggregate_id = next("aggregate_id")?;
        let sequence = int(next("sequence")?, "sequence")?;
        let event_version = next("event_version")?;
        let payload = next("payload")?;
        let event = Self::transfer_event(
            &aggregate_type,
            &aggregate_id,
            sequence,
            &event_version,
            &payload,
        )?;
        Ok(Self {
            tx_id,
            global_position,
            aggregate_type: aggregate_type.into_owned(),
            aggregate_id: aggregate_id.into_owned(),
            sequence,
            event,
        })
    }
}

/// One value of COPY's text format, unescaped (borrowed when it holds no backslash). `None` for
/// bytes that are not UTF-8 or an escape this reader does not expect (every column read here is
/// NOT NULL text or a number).
fn copy_unescape(raw: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    if !raw.contains(&b'\\') {
        return std::str::from_utf8(raw)
            .ok()
            .map(std::borrow::Cow::Borrowed);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match bytes.next()? {
            b'\\' => b'\\',
            b't' => b'\t',
            b'n' => b'\n',
            b'r' => b'\r',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'v' => 0x0b,
            _ => return None,
        });
    }
    String::from_utf8(out).ok().map(std::borrow::Cow::Owned)
}

/// Streams [`SELECT_EVENTS`] (bounds inlined: COPY takes no parameters, and they are integers)
/// with `COPY ... TO STDOUT`, decoding each row, in batches of `batch_max` sent to `send`. Much
/// cheaper per row than a row-by-row fetch. Ends at the first error, which it sends.
async fn copy_events(
    pool: PgPool,
    bounds: [i64; 5],
    batch_max: usize,
    send: tokio::sync::mpsc::Sender<Result<Vec<BatchEvent>, ProjectionError>>,
) {
    use futures_util::StreamExt;
    let [horizon, from_tx, from_pos, upto_tx, upto_pos] = bounds;
    let query = SELECT_EVENTS
        .replace("$1::text::xid8", &format!("'{horizon}'::xid8"))
        .replace("$2::text::xid8", &format!("'{from_tx}'::xid8"))
        .replace("$3", &from_pos.to_string())
        .replace("$4::text::xid8", &format!("'{upto_tx}'::xid8"))
        .replace("$5", &upto_pos.to_string());
    let fail = |e: ProjectionError| {
        let send = send.clone();
        async move {
            send.send(Err(e)).await.ok();
        }
    };
    if query.contains('$') {
        // SELECT_EVENTS gained a parameter this substitution does not know.
        return fail(ProjectionError::Bulk(format!(
            "a parameter is left in the COPY query: {query}"
        )))
        .await;
    }
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return fail(e.into()).await,
    };
    let mut stream = match conn
        .copy_out_raw(&format!("COPY ({query}) TO STDOUT"))
        .await
    {
        Ok(stream) => stream,
        Err(e) => return fail(e.into()).await,
    };
    let mut batch = Vec::with_capacity(batch_max);
    // A row may be split across chunks: the unfinished tail waits here for the next chunk.
    let mut carry: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return fail(e.into()).await,
        };
        let mut rest: &[u8] = &chunk;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            let line = if carry.is_empty() {
                &rest[..end]
            } else {
                carry.extend_from_slice(&rest[..end]);
                &carry[..]
            };
            let decoded = BatchEvent::from_copy_line(line);
            carry.clear();
            rest = &rest[end + 1..];
            match decoded {
                Ok(event) => batch.push(event),
                Err(e) => return fail(e).await,
            }
            if batch.len() >= batch_max {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(batch_max));
                if send.send(Ok(full)).await.is_err() {
                    return;
                }
            }
        }
        carry.extend_from_slice(rest);
    }
    if !carry.is_empty() {
        return fail(ProjectionError::Bulk("COPY ended inside a row".into())).await;
    }
    if !batch.is_empty() {
        send.send(Ok(batch)).await.ok();
    }
}

/// The transfers a batch continues but does not create: their rows
/// must be read from the table first. Those it creates cannot be there yet (their TransferCreated
/// was never applied; had it been, the table's primary key refuses the second insert and the
/// batch rolls back). Sorted, without repeats.
fn continued_elsewhere(events: &[BatchEvent]) -> Vec<&str> {
    let created_here: HashSet<&str> = events
        .iter()
        .filter(|e| e.aggregate_type == TRANSFER_AGGREGATE && e.sequence == 1)
        .map(|e| e.aggregate_id.as_str())
        .collect();
    let mut known: Vec<&str> = events
        .iter()
        .filter(|e| e.aggregate_type == TRANSFER_AGGREGATE && e.sequence > 1)
        .map(|e| e.aggregate_id.as_str())
        .filter(|id| !created_here.contains(id))
        .collect();
    known.sort_unstable();
    known.dedup();
    known
}

async fn load_rows(
    tx: &mut Transaction<'static, Postgres>,
    req_ids: &[&str],
) -> Result<Vec<TransferRow>, sqlx::Error> {
    sqlx::query_as("SELECT * FROM transfers_view WHERE req_id = ANY($1)")
        .bind(req_ids)
        .fetch_all(&mut **tx)
        .await
}

/// One folded batch of a bulk pass, for its writer: the events, each one's feed position and
/// owner, and the rows of the transfers that reached a final state in it.
struct Folded {
    events: Vec<BatchEvent>,
    feed: Vec<(i64, Option<i64>)>,
    finished: Vec<TransferRow>,
}

/// Whole transfer rows, as [`CopyText::transfer`] writes them.
const COPY_TRANSFERS: &str =
    "COPY transfers_view (req_id, user_id, from_account, to_account, asset,
    amount, cid, state, state_id, failure_code, failure_message, created_at, updated_at,
    last_sequence) FROM STDIN";

/// Rows in COPY's text format: tab-separated, escaped, `\N` for NULL, one line per row.
struct CopyText {
    data: Vec<u8>,
}

impl CopyText {
    fn with_capacity(bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
        }
    }

    fn text(&mut self, value: &str) {
        for b in value.bytes() {
            match b {
                b'\\' => self.data.extend_from_slice(b"\\\\"),
                b'\t' => self.data.extend_from_slice(b"\\t"),
                b'\n' => self.data.extend_from_slice(b"\\n"),
                b'\r' => self.data.extend_from_slice(b"\\r"),
                _ => self.data.push(b),
            }
        }
        self.data.push(b'\t');
    }

    fn opt_text(&mut self, value: Option<&str>) {
        match value {
            Some(v) => self.text(v),
            None => self.data.extend_from_slice(b"\\N\t"),
        }
    }

    /// A value whose text needs no escaping (numbers).
    fn display(&mut self, value: impl std::fmt::Display) {
        use std::io::Write;
        // write! into a Vec cannot fail.
        let _ = write!(self.data, "{value}\t");
    }

    fn int(&mut self, value: i64) {
        self.display(value);
    }

    /// Microseconds, cut as sqlx cuts a bound time (PostgreSQL would round more digits), so a
    /// row written here equals the live projector's.
    fn time(&mut self, at: DateTime<Utc>) {
        self.display(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    }

    /// One whole transfer row, in [`COPY_TRANSFERS`]'s columns.
    fn transfer(&mut self, r: &TransferRow) {
        self.text(&r.req_id);
        self.int(r.user_id);
        self.text(&r.from_account);
        self.text(&r.to_account);
        self.text(&r.asset);
        self.display(r.amount);
        self.opt_text(r.cid.as_deref());
        self.text(&r.state);
        self.int(i64::from(r.state_id));
        self.opt_text(r.failure_code.as_deref());
        self.opt_text(r.failure_message.as_deref());
        self.time(r.created_at);
        self.time(r.updated_at);
        self.int(r.last_sequence);
        self.end_row();
    }

    /// Ends a row: the last value's tab becomes the line's end.
    fn end_row(&mut self) {
        if let Some(last) = self.data.last_mut() {
            *last = b'\n';
        }
    }

    async fn send(
        self,
        tx: &mut Transaction<'static, Postgres>,
        statement: &str,
    ) -> Result<(), sqlx::Error> {
        if self.data.is_empty() {
            return Ok(());
        }
        let mut copy = tx.copy_in_raw(statement).await?;
        // A failed send drops `copy`, which aborts the COPY; the transaction then rolls back.
        copy.send(self.data).await?;
        copy.finish().await?;
        Ok(())
    }
}

/// Applies one batch (in log order, right after the stored position) inside `tx`: feed rows at
/// dense positions after `feed_head`, the transfer rows, balances and counts, and the new stored
/// position, so they commit or roll back together. Shared by the live pass and the replay's bulk
/// pass. Returns the new feed head.
async fn apply_batch(
    tx: &mut Transaction<'static, Postgres>,
    events: &[BatchEvent],
    feed_head: i64,
    applied_total: i64,
) -> Result<i64, ProjectionError> {
    let Some(last) = events.last() else {
        return Ok(feed_head);
    };
    let mut fold = Fold::default();
    let known = continued_elsewhere(events);
    if !known.is_empty() {
        fold.rows = load_rows(tx, &known)
            .await?
            .into_iter()
            .map(|r| (r.req_id.clone(), r))
            .collect();
    }
    let now = Utc::now();
    let mut feed = FeedCopy::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let owner = fold.apply_decoded(
            &e.aggregate_type,
            &e.aggregate_id,
            e.sequence,
            e.event.as_ref(),
        )?;
        let position = feed_head + i64::try_from(i).unwrap_or(i64::MAX) + 1;
        // The domain time the event carries; an event of another aggregate has none.
        let at = e.event.as_ref().map_or(now, TransferEvent::at);
        feed.push(position, e, owner, at);
    }
    let new_head = feed_head + i64::try_from(events.len()).unwrap_or(i64::MAX);
    feed.insert(tx).await?;
    write_transfers(tx, &fold).await?;
    write_balances(tx, &fold).await?;
    write_counts(tx, &fold).await?;
    sqlx::query(
        "UPDATE projector_cursor SET tx_id = $1::text::xid8, global_position = $2,
            feed_position = $3, events_applied = $4, updated_at = now()
         WHERE projector = 'main'",
    )
    .bind(last.tx_id.to_string())
    .bind(last.global_position)
    .bind(new_head)
    .bind(applied_total + i64::try_from(events.len()).unwrap_or(i64::MAX))
    .execute(&mut **tx)
    .await?;
    Ok(new_head)
}

/// The feed rows of one batch, sent with one `COPY ... FROM STDIN` in the binary format (the
/// server parses no text, and times go as the integers they are stored as). A feed row is what
/// the projector decides (position, which event, owner, time); the event itself stays in the log
/// and the `feed` view joins it (migration 0006).
struct FeedCopy {
    data: Vec<u8>,
}

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl FeedCopy {
    /// Four fields per row.
    const FIELDS: i16 = 4;

    fn with_capacity(events: usize) -> Self {
        let mut data = Vec::with_capacity(32 + events * 42);
        // Signature, flags (no OIDs), header extension length.
        data.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
        data.extend_from_slice(&0_i32.to_be_bytes());
        data.extend_from_slice(&0_i32.to_be_bytes());
        Self { data }
    }

    fn int8(&mut self, value: i64) {
        self.data.extend_from_slice(&8_i32.to_be_bytes());
        self.data.extend_from_slice(&value.to_be_bytes());
    }

    fn push(&mut self, position: i64, e: &BatchEvent, owner: Option<i64>, at: DateTime<Utc>) {
        self.data.extend_from_slice(&Self::FIELDS.to_be_bytes());
        self.int8(position);
        self.int8(e.global_position);
        match owner {
            Some(user) => self.int8(user),
            // NULL: length -1, no bytes.
            None => self.data.extend_from_slice(&(-1_i32).to_be_bytes()),
        }
        // timestamptz: microseconds since PostgreSQL's epoch.
        self.int8(at.timestamp_micros() - PG_EPOCH_MICROS);
    }

    async fn insert(mut self, tx: &mut Transaction<'static, Postgres>) -> Result<(), sqlx::Error> {
        // The file trailer.
        self.data.extend_from_slice(&(-1_i16).to_be_bytes());
        let mut copy = tx
            .copy_in_raw(
                "COPY feed_index (position, global_position, user_id, occurred_at)
                 FROM STDIN (FORMAT binary)",
            )
            .await?;
        // A failed send drops `copy`, which aborts the COPY; the transaction then rolls back.
        copy.send(self.data).await?;
        copy.finish().await?;
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

#[cfg(test)]
mod tests {
    use super::copy_unescape;

    #[test]
    fn copy_text_values_are_unescaped_as_postgres_escapes_them() {
        assert_eq!(copy_unescape(b"plain").as_deref(), Some("plain"));
        // A JSON payload holding a quote, a backslash and a tab inside a string.
        assert_eq!(
            copy_unescape(br#"{"m":"a \\"q\\" \\\\ \\t"}"#).as_deref(),
            Some(r#"{"m":"a \"q\" \\ \t"}"#)
        );
        assert_eq!(copy_unescape(b"a\\tb\\nc").as_deref(), Some("a\tb\nc"));
        // NULL (\N) or an unknown escape is not a value this reader accepts.
        assert_eq!(copy_unescape(b"\\N"), None);
        assert_eq!(copy_unescape(b"x\\"), None);
        assert_eq!(copy_unescape(b"\xff"), None);
    }
}
