//! Standby and leadership. A standby tries the stream's lock every `standby_interval`; the
//! leader resyncs (the stream's last message and the checkpoint: it never publishes at or below
//! the larger), then publishes the feed from there with up to `window` publishes in flight,
//! awaits their acks in order and advances the checkpoint after them. Every message names the
//! stream sequence it must follow (`Nats-Expected-Last-Sequence`), so nothing can land out of
//! order or twice, whichever relay sent it. Any failure ends the pipeline; the leader resyncs
//! after a capped backoff, or steps down when the lock's connection is gone.

use std::collections::VecDeque;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::PublishError, publish::PublishAck};
use projections::feed::{self, FEED_PAGE_SIZE_MAX};
use sqlx::PgPool;
use tokio::sync::mpsc::{self, error::TryRecvError};

use crate::checkpoint::{self, Leadership};
use crate::{backoff, message, stream, RelayConfig, RelayError, RelayStats};

/// Pages of the feed read ahead of the publisher.
const PAGES_AHEAD: usize = 4;

/// The checkpoint is written at least every this many acknowledged events...
const CHECKPOINT_EVERY: i64 = 2000;

/// ... and at least this often while acks come in, and whenever the pipeline drains.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// How often an idle leader proves its lock's connection alive.
const HEARTBEAT: Duration = Duration::from_millis(500);

type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

/// How one leadership step ended.
enum Ended {
    /// The lock's connection failed: this relay no longer leads.
    LockLost(sqlx::Error),
    /// The stream is not where the pipeline thought (a repeat, another publisher): read it again.
    Resync(String),
    /// Anything else: retried after a backoff, still leading.
    Failed(RelayError),
}

impl From<RelayError> for Ended {
    fn from(e: RelayError) -> Self {
        Ended::Failed(e)
    }
}

impl From<sqlx::Error> for Ended {
    fn from(e: sqlx::Error) -> Self {
        Ended::Failed(RelayError::Database(e))
    }
}

fn lock_lost(e: sqlx::Error) -> Ended {
    Ended::LockLost(e)
}

/// Stops a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Never returns: standby, leader, standby again when the lock is lost.
pub(crate) async fn standby_and_lead(pool: &PgPool, config: &RelayConfig, stats: &RelayStats) {
    let mut js: Option<jetstream::Context> = None;
    let mut attempt = 0u32;
    loop {
        let lead = match Leadership::try_take(pool, &config.stream, &config.instance).await {
            Ok(Some(lead)) => lead,
            Ok(None) => {
                tokio::time::sleep(config.standby_interval).await;
                continue;
            }
            Err(e) => {
                attempt = attempt.saturating_add(1);
                note_error(pool, config, stats, &format!("take the leader lock: {e}")).await;
                tokio::time::sleep(backoff(attempt, config.backoff_base, config.backoff_max)).await;
                continue;
            }
        };
        stats.set_leader(true);
        tracing::info!(stream = %config.stream, instance = %config.instance, "relay leads");
        let e = lead_while_held(pool, config, stats, lead, &mut js).await;
        stats.set_leader(false);
        note_error(pool, config, stats, &format!("leader lock lost: {e}")).await;
        tokio::time::sleep(config.standby_interval).await;
    }
}

/// Publishes while the lock is held; returns why it was lost.
async fn lead_while_held(
    pool: &PgPool,
    config: &RelayConfig,
    stats: &RelayStats,
    mut lead: Leadership,
    js: &mut Option<jetstream::Context>,
) -> sqlx::Error {
    let mut attempt = 0u32;
    loop {
        let published_before = stats.published();
        let ended = session(pool, config, stats, &mut lead, js).await;
        if stats.published() > published_before {
            attempt = 0;
        }
        match ended {
            Ended::LockLost(e) => return e,
            Ended::Resync(why) => {
                tracing::info!(stream = %config.stream, %why, "relay resyncs with the stream");
            }
            Ended::Failed(e) => {
                attempt = attempt.saturating_add(1);
                let wait = backoff(attempt, config.backoff_base, config.backoff_max);
                tracing::warn!(stream = %config.stream, error = %e, retry_in_ms = wait.as_millis() as u64, "relay publishing failed");
                note_error(pool, config, stats, &e.to_string()).await;
                // Wait, proving the lock still held.
                let until = Instant::now() + wait;
                while Instant::now() < until {
                    tokio::time::sleep(HEARTBEAT.min(until - Instant::now())).await;
                    if let Err(e) = lead.heartbeat().await {
                        return e;
                    }
                }
            }
        }
    }
}

async fn note_error(pool: &PgPool, config: &RelayConfig, stats: &RelayStats, error: &str) {
    stats.set_error(error);
    if let Err(e) = checkpoint::record_error(pool, &config.stream, error).await {
        tracing::debug!(error = %e, "could not record the relay's error");
    }
}

/// One resync and the pipeline after it, until something ends it.
async fn session(
    pool: &PgPool,
    config: &RelayConfig,
    stats: &RelayStats,
    lead: &mut Leadership,
    js_slot: &mut Option<jetstream::Context>,
) -> Ended {
    let js = match js_slot {
        Some(js) => js.clone(),
        None => match stream::connect(&config.nats_url, config.window).await {
            Ok(js) => js_slot.insert(js).clone(),
            Err(e) => return e.into(),
        },
    };
    let mut st =
        match stream::ensure(&js, &config.stream, config.duplicate_window, config.cell).await {
            Ok(st) => st,
            Err(e) => return e.into(),
        };
    let end = match stream::end(&mut st).await {
        Ok(end) => end,
        Err(e) => return e.into(),
    };
    let stored = match lead.checkpoint().await {
        Ok(p) => p,
        Err(e) => return lock_lost(e),
    };
    let in_stream = end.last_position.unwrap_or(0);
    let start = stored.max(in_stream);
    if end.last_position.is_some() && in_stream < stored {
        // JetStream acknowledged more than it holds now (its store lost messages, or they were
        // deleted): the positions between are not republished (the rule is never at or below
        // the checkpoint); an operator must replay them into the stream if they matter.
        tracing::warn!(
            stream = %config.stream,
            stream_position = in_stream,
            checkpoint = stored,
            "the stream ends below the checkpoint: positions {}..={stored} are missing from it",
            in_stream + 1
        );
    }
    if in_stream > stored {
        if let Err(e) = lead.advance(in_stream, end.last_sequence).await {
            return lock_lost(e);
        }
    }
    stats.resumed_at(start);
    tracing::info!(
        stream = %config.stream,
        checkpoint = stored,
        stream_position = in_stream,
        stream_sequence = end.last_sequence,
        "relay resumes after position {start}"
    );
    match pump(pool, config, stats, lead, &js, start, end.last_sequence).await {
        Ok(never) => match never {},
        Err(ended) => ended,
    }
}

/// One feed event made into its message ahead of the publisher: the position it carries and the
/// stream sequence its `Nats-Expected-Last-Sequence` names, which the publisher checks before
/// sending it, then the message itself.
struct Prepared {
    position: i64,
    expected: u64,
    message: message::Message,
}

/// A page of the feed made into messages, or why the reader stopped.
type Page = Result<Vec<Prepared>, sqlx::Error>;

/// Reads the feed after `after` page by page, ahead of the publisher, and makes each event its
/// message on the way (a page at a time, beside the publisher, whose loop is then a bare
/// publisher's: publish, await acks in order, plus its checks). The message of the event at
/// `after + k` names the stream sequence `expected + k - 1`, as the publisher expects it to.
async fn read_feed(
    pool: PgPool,
    mut after: i64,
    mut expected: u64,
    poll: Duration,
    cell: Option<u16>,
    tx: mpsc::Sender<Page>,
) {
    loop {
        match feed::read_after(&pool, after, FEED_PAGE_SIZE_MAX, None).await {
            Ok(page) if page.is_empty() => tokio::time::sleep(poll).await,
            Ok(page) => {
                after = page.last().map_or(after, |e| e.position);
                let prepared = page
                    .into_iter()
                    .map(|e| {
                        let p = Prepared {
                            position: e.position,
                            expected,
                            message: message::message_for(e, expected, cell),
                        };
                        expected += 1;
                        p
                    })
                    .collect();
                if tx.send(Ok(prepared)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

/// The pipeline: publish from `start + 1` on, each message following the one before it in the
/// stream, acks awaited in order, checkpoint advanced after them. Ends only with an error.
async fn pump(
    pool: &PgPool,
    config: &RelayConfig,
    stats: &RelayStats,
    lead: &mut Leadership,
    js: &jetstream::Context,
    start: i64,
    last_sequence: u64,
) -> Result<std::convert::Infallible, Ended> {
    let (tx, mut rx) = mpsc::channel(PAGES_AHEAD);
    let _reader = AbortOnDrop(tokio::spawn(read_feed(
        pool.clone(),
        start,
        last_sequence,
        config.poll_interval,
        config.cell,
        tx,
    )));
    let mut window = Window {
        size: config.window.max(1),
        pending: VecDeque::new(),
        inflight: VecDeque::with_capacity(config.window.max(1)),
        next_position: start + 1,
        expected: last_sequence,
    };
    let (mut acked, mut acked_sequence) = (start, last_sequence);
    let mut checkpointed = start;
    let mut checkpointed_at = Instant::now();
    loop {
        window.fill(js, &mut rx).await?;
        let Some((position, sequence, ack)) = window.inflight.pop_front() else {
            // Everything sent is acknowledged: wait for the feed, proving the lock meanwhile.
            if acked > checkpointed {
                lead.advance(acked, acked_sequence)
                    .await
                    .map_err(lock_lost)?;
                checkpointed = acked;
                checkpointed_at = Instant::now();
            }
            tokio::select! {
                page = rx.recv() => match page {
                    Some(page) => window.pending = page?.into(),
                    None => return Err(RelayError::Feed("the feed reader stopped".into()).into()),
                },
                () = tokio::time::sleep(HEARTBEAT) => lead.heartbeat().await.map_err(lock_lost)?,
            }
            continue;
        };
        checked_ack(position, sequence, ack.await)?;
        acked = position;
        acked_sequence = sequence;
        stats.acked(position, 1);
        if acked - checkpointed >= CHECKPOINT_EVERY
            || checkpointed_at.elapsed() >= CHECKPOINT_INTERVAL
            || window.inflight.is_empty()
        {
            lead.advance(acked, acked_sequence)
                .await
                .map_err(lock_lost)?;
            checkpointed = acked;
            checkpointed_at = Instant::now();
        }
    }
}

/// The publishes in flight and the messages made but not yet sent.
struct Window {
    /// At most this many publishes in flight.
    size: usize,
    pending: VecDeque<Prepared>,
    /// (feed position, stream sequence it must get, its ack), in publish order.
    inflight: VecDeque<(i64, u64, AckFuture)>,
    /// The feed position the next message carries...
    next_position: i64,
    /// ... and the stream sequence it must follow.
    expected: u64,
}

impl Window {
    /// Publish what the reader has ready until the window is full; a gap in the feed's positions,
    /// a message made for another place in the stream or a stopped reader ends the pipeline.
    async fn fill(
        &mut self,
        js: &jetstream::Context,
        rx: &mut mpsc::Receiver<Page>,
    ) -> Result<(), Ended> {
        while self.inflight.len() < self.size {
            let Some(m) = self.pending.pop_front() else {
                match rx.try_recv() {
                    Ok(page) => {
                        self.pending = page?.into();
                        continue;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        return Err(RelayError::Feed("the feed reader stopped".into()).into())
                    }
                }
            };
            if m.position != self.next_position {
                return Err(RelayError::Feed(format!(
                    "expected position {}, the feed gave {}",
                    self.next_position, m.position
                ))
                .into());
            }
            if m.expected != self.expected {
                return Err(RelayError::Feed(format!(
                    "position {} was made to follow sequence {}, not {}",
                    m.position, m.expected, self.expected
                ))
                .into());
            }
            let message::Message {
                subject,
                headers,
                body,
            } = m.message;
            let ack = js
                .publish_with_headers(subject, headers, body)
                .await
                .map_err(|err| {
                    RelayError::Nats(format!("publish position {}: {err}", m.position))
                })?;
            self.expected += 1;
            self.next_position += 1;
            self.inflight
                .push_back((m.position, self.expected, ack.into_future()));
        }
        Ok(())
    }
}

/// An ack that is not the stream storing `position` at `sequence` sends the leader back to
/// resync (a repeat, or another publisher in between).
fn checked_ack(
    position: i64,
    sequence: u64,
    ack: Result<PublishAck, PublishError>,
) -> Result<(), Ended> {
    let ack = ack.map_err(|e| RelayError::Nats(format!("ack of position {position}: {e}")))?;
    if ack.duplicate {
        return Err(Ended::Resync(format!(
            "position {position} was in the stream already (sequence {})",
            ack.sequence
        )));
    }
    if ack.sequence != sequence {
        return Err(Ended::Resync(format!(
            "position {position} stored at sequence {}, not {sequence}",
            ack.sequence
        )));
    }
    Ok(())
}
