//! The bulk rebuild the replay runs (`Projector::bulk_pass`): the same fold as the live pass over
//! the same order, but read, folded and written the way a bulk load is cheapest, in three stages
//! that run at once (a COPY reader, the fold, a COPY writer).

use eventlog::batches::Bounds;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::mpsc::{Receiver, Sender};

use crate::copy::{event_from_copy_line, CopyText, COPY_TRANSFERS};
use crate::error::ProjectionError;
use crate::fold::Fold;
use crate::log::{event_id, BatchEvent};
use crate::projector::{commit_watermark, Projector};
use crate::rows::TransferRow;
use crate::tables::{self, Cursor};

/// What the reader stage sends: a batch of decoded events, or the error that ended the read.
type EventBatch = Result<Vec<BatchEvent>, ProjectionError>;

impl Projector {
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
    /// caller knows are below the commit watermark (the replay's target is a position the live projector
    /// already applied), so the set read can never change. Returns the number of events applied;
    /// `progress` gets each batch's size.
    pub async fn bulk_pass(
        &self,
        upto: (i64, i64),
        batch_max: usize,
        mut progress: impl FnMut(usize),
    ) -> Result<usize, ProjectionError> {
        // One streaming read of the whole log: a sequential scan may be the best plan for it.
        let mut tx = self.begin_locked(true).await?;
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
        let watermark = commit_watermark(&mut tx).await?;
        let batch_max = batch_max.max(1);
        let (send, mut recv) = tokio::sync::mpsc::channel::<EventBatch>(2);
        let reader = tokio::spawn(copy_events(
            self.pool().clone(),
            Bounds {
                watermark,
                from: (0, 0),
                upto,
            },
            batch_max,
            send,
        ));
        // The writer owns the transaction while batches stream, and hands it back at the end.
        // It encodes the rows too (and frees the batch), so the fold does nothing else.
        let (to_writer, writes) = tokio::sync::mpsc::channel::<Folded>(2);
        let writer = tokio::spawn(write_batches(tx, writes));
        let mut bulk = BulkFold::default();
        let folded = bulk.run(&mut recv, &to_writer, &mut progress).await;
        drop(to_writer);
        // On an error the reader may still be blocked sending; dropping `recv` ends it, and this
        // waits so no query outlives the call.
        drop(recv);
        reader.await.ok();
        let written = writer
            .await
            .map_err(|e| ProjectionError::Bulk(format!("the bulk writer stopped: {e}")))?;
        folded?;
        bulk.finish(written?).await?;
        Ok(bulk.applied)
    }
}

/// One folded batch of a bulk pass, for its writer: the rows of the transfers that reached a final
/// state in it.
struct Folded {
    finished: Vec<TransferRow>,
}

/// The writer stage: sends each folded batch's finished transfer rows with COPY inside `tx`, and
/// hands `tx` back when the fold stops sending.
async fn write_batches(
    mut tx: Transaction<'static, Postgres>,
    mut writes: Receiver<Folded>,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    while let Some(batch) = writes.recv().await {
        let mut transfers = CopyText::with_capacity(batch.finished.len() * 200);
        for row in &batch.finished {
            transfers.transfer(row);
        }
        transfers.send(&mut tx, COPY_TRANSFERS).await?;
    }
    Ok(tx)
}

/// The fold stage: one fold kept across batches, so a transfer's row is written once, when it
/// reaches a final state (or at the end, if still open), instead of inserted and updated.
#[derive(Default)]
struct BulkFold {
    fold: Fold,
    /// Events folded so far.
    applied: usize,
    /// The (tx_id, global_position) of the last event folded.
    last: Option<(i64, i64)>,
}

impl BulkFold {
    /// Folds every batch the reader sends and passes it on to the writer, until the reader ends,
    /// either side fails, or the writer stops (it returns its error itself).
    async fn run(
        &mut self,
        recv: &mut Receiver<EventBatch>,
        to_writer: &Sender<Folded>,
        progress: &mut impl FnMut(usize),
    ) -> Result<(), ProjectionError> {
        while let Some(events) = recv.recv().await {
            let events = events?;
            let last_here = events.last().map(|e| (e.tx_id, e.global_position));
            let count = events.len();
            let folded = self.fold_batch(events)?;
            self.fold.created.clear();
            if to_writer.send(folded).await.is_err() {
                // The writer stopped on an error, which it returns below.
                break;
            }
            if last_here.is_some() {
                self.last = last_here;
            }
            self.applied += count;
            progress(count);
        }
        Ok(())
    }

    /// Folds one batch, for the writer: the rows of the transfers it finished (taken out of the
    /// fold).
    fn fold_batch(&mut self, events: Vec<BatchEvent>) -> Result<Folded, ProjectionError> {
        let mut finished = Vec::new();
        for e in &events {
            if e.sequence > 1 && e.event.is_some() && !self.fold.rows.contains_key(&e.aggregate_id)
            {
                return Err(ProjectionError::OutOfOrder {
                    event_id: event_id(&e.aggregate_type, &e.aggregate_id, e.sequence),
                    detail:
                        "event for a transfer that is not open (never created, or already final)"
                            .into(),
                });
            }
            self.fold.apply_decoded(
                &e.aggregate_type,
                &e.aggregate_id,
                e.sequence,
                e.event.as_ref(),
            )?;
            if e.event
                .as_ref()
                .is_some_and(|ev| ev.resulting_state().is_terminal())
            {
                if let Some(row) = self.fold.rows.remove(&e.aggregate_id) {
                    finished.push(row);
                }
            }
        }
        Ok(Folded { finished })
    }

    /// Writes what only the end knows (the transfers still open, the balances, the state counts,
    /// the stored position) and commits everything.
    async fn finish(&self, mut tx: Transaction<'static, Postgres>) -> Result<(), ProjectionError> {
        let mut open = CopyText::with_capacity(self.fold.rows.len() * 200);
        for row in self.fold.rows.values() {
            open.transfer(row);
        }
        open.send(&mut tx, COPY_TRANSFERS).await?;
        tables::write_balances(&mut tx, &self.fold).await?;
        tables::write_counts(&mut tx, &self.fold).await?;
        if let Some((tx_id, global_position)) = self.last {
            tables::write_cursor(
                &mut tx,
                &Cursor {
                    tx_id,
                    global_position,
                    events_applied: i64::try_from(self.applied).unwrap_or(i64::MAX),
                },
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Streams the log's events within `bounds` with `COPY ... TO STDOUT`
/// (`eventlog::batches::copy_events`), decoding each row, in batches of `batch_max` sent to `send`. Much
/// cheaper per row than a row-by-row fetch. Ends at the first error, which it sends.
async fn copy_events(pool: PgPool, bounds: Bounds, batch_max: usize, send: Sender<EventBatch>) {
    use futures_util::StreamExt;
    let fail = |e: ProjectionError| {
        let send = send.clone();
        async move {
            send.send(Err(e)).await.ok();
        }
    };
    let query = match eventlog::batches::copy_events(bounds) {
        Ok(query) => query,
        Err(e) => return fail(ProjectionError::Bulk(e)).await,
    };
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return fail(e.into()).await,
    };
    let mut stream = match conn.copy_out_raw(&query).await {
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
            let decoded = event_from_copy_line(line);
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
