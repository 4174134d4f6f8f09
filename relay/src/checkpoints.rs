//! The tamper-evident log's signed checkpoints on a JetStream stream of their own (never the
//! event stream), so that a party outside the database holds copies of them
//! (`docs/adr/0016-tamper-evident-log.md`): a history cut or rewritten in PostgreSQL and re-signed
//! with the real key is then caught by `ledger verify --from-stream`, which reads them back.
//!
//! The publisher copies every checkpoint the follower stored (`tlog_checkpoints`) that is larger
//! than the last one on its subject, in size order, each acknowledged before the next: the
//! stream's last message is its own cursor, so nothing is kept in the database (whose writers the
//! stream is meant to be safe from). The message id `<subject>/<size>` makes a repeat after a lost
//! ack (or two publishers at once) a duplicate JetStream drops. The stream refuses deletes and
//! purges. A database whose newest checkpoint is smaller than the stream's last (its tail was cut)
//! is reported as CRITICAL `LOG_REWRITTEN`; nothing older is ever published over it.

use std::time::Duration;

use async_nats::jetstream::{self, stream::StorageType};
use async_nats::HeaderMap;
use bytes::Bytes;
use sqlx::PgPool;

use crate::message::HEADER_MSG_ID;
use crate::stream::REQUEST_TIMEOUT;
use crate::{backoff, RelayError};

/// The checkpoint stream's name when none is given.
pub const CHECKPOINT_STREAM_DEFAULT: &str = "LEDGER_LOG_CHECKPOINTS";

/// The subject of a ledger's checkpoints without a cell map; a cell's are
/// `ledger.log.checkpoints.cell.<N>` ([`subject`]).
pub const CHECKPOINT_SUBJECT: &str = "ledger.log.checkpoints";

/// The tree size a checkpoint message is of.
pub const HEADER_LOG_SIZE: &str = "Ledger-Log-Size";

/// The most checkpoints read from the database at once.
const BATCH_MAX: i64 = 256;

/// How often the database is asked for new checkpoints (they are made every few seconds).
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The subject of the checkpoints of `cell` (`None`: a ledger without a cell map).
pub fn subject(cell: Option<u16>) -> String {
    match cell {
        None => CHECKPOINT_SUBJECT.to_owned(),
        Some(n) => format!("{CHECKPOINT_SUBJECT}.cell.{n}"),
    }
}

/// The checkpoint stream's configuration: file storage, every ledger's and cell's subject, no
/// deletes, no purges.
pub fn stream_config(name: &str) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![
            CHECKPOINT_SUBJECT.to_owned(),
            format!("{CHECKPOINT_SUBJECT}.>"),
        ],
        storage: StorageType::File,
        duplicate_window: Duration::from_secs(120),
        deny_delete: true,
        deny_purge: true,
        description: Some(
            "Signed checkpoints of the ledger's tamper-evident log (C2SP signed notes)".to_owned(),
        ),
        ..Default::default()
    }
}

/// Where and what a publisher publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointTarget {
    pub nats_url: String,
    pub stream: String,
    /// [`subject`] of the log's cell.
    pub subject: String,
}

async fn connect(url: &str) -> Result<jetstream::Context, RelayError> {
    let client = async_nats::ConnectOptions::new()
        .name("ledger-log-checkpoints")
        .connection_timeout(Duration::from_secs(2))
        .request_timeout(Some(REQUEST_TIMEOUT))
        .connect(url)
        .await
        .map_err(|e| RelayError::Nats(format!("connect to {url}: {e}")))?;
    Ok(jetstream::ContextBuilder::new()
        .timeout(REQUEST_TIMEOUT)
        .ack_timeout(REQUEST_TIMEOUT)
        .build(client))
}

async fn ensure(
    js: &jetstream::Context,
    name: &str,
) -> Result<jetstream::stream::Stream, RelayError> {
    js.get_or_create_stream(stream_config(name))
        .await
        .map_err(|e| RelayError::Nats(format!("create or get stream {name}: {e}")))
}

/// Publishes the log's checkpoints to `target` forever: every failure (NATS down, the database
/// unreachable) is retried with capped backoff. Cancel the future to stop it.
pub async fn publish(pool: PgPool, target: CheckpointTarget) {
    let mut attempt = 0u32;
    loop {
        let error = match session(&pool, &target, &mut attempt).await {
            Err(e) => e,
            Ok(never) => match never {},
        };
        attempt = attempt.saturating_add(1);
        let wait = backoff(attempt, Duration::from_millis(200), Duration::from_secs(5));
        tracing::warn!(error = %error, stream = %target.stream, ?wait,
            "checkpoint publishing failed; retrying");
        tokio::time::sleep(wait).await;
    }
}

/// One connection's work: publish what is pending, then poll. Ends only with an error.
async fn session(
    pool: &PgPool,
    target: &CheckpointTarget,
    attempt: &mut u32,
) -> Result<std::convert::Infallible, RelayError> {
    let js = connect(&target.nats_url).await?;
    let stream = ensure(&js, &target.stream).await?;
    let mut cut_reported = None;
    loop {
        let published = publish_pending(pool, &js, &stream, target, &mut cut_reported).await?;
        *attempt = 0;
        if published == 0 {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// The size of the last checkpoint on `subject`, `None` when there is none.
pub async fn published_size(
    stream: &jetstream::stream::Stream,
    subject: &str,
) -> Result<Option<u64>, RelayError> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => size_of(&message.headers).map(Some).ok_or_else(|| {
            RelayError::Config(format!(
                "the last message on {subject} carries no {HEADER_LOG_SIZE} header: something \
                 else publishes on the log's subjects"
            ))
        }),
        Err(e) if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
            Ok(None)
        }
        Err(e) => Err(RelayError::Nats(format!("last message on {subject}: {e}"))),
    }
}

fn size_of(headers: &HeaderMap) -> Option<u64> {
    headers.get(HEADER_LOG_SIZE)?.as_str().parse().ok()
}

/// Publishes the stored checkpoints larger than the stream's last one on the subject, in order,
/// each acknowledged before the next; how many. Reports a database whose newest checkpoint is
/// below the stream's last (once per size).
async fn publish_pending(
    pool: &PgPool,
    js: &jetstream::Context,
    stream: &jetstream::stream::Stream,
    target: &CheckpointTarget,
    cut_reported: &mut Option<u64>,
) -> Result<usize, RelayError> {
    let last = published_size(stream, &target.subject).await?;
    // The empty tree's checkpoint (size 0) is published too: everything above -1 at first.
    let after = last.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    let pending: Vec<(i64, String)> = sqlx::query_as(
        "SELECT size, note FROM tlog_checkpoints WHERE size > $1 ORDER BY size LIMIT $2",
    )
    .bind(after)
    .bind(BATCH_MAX)
    .fetch_all(pool)
    .await?;
    if pending.is_empty() {
        let stored: Option<i64> = sqlx::query_scalar("SELECT max(size) FROM tlog_checkpoints")
            .fetch_one(pool)
            .await?;
        let (stored, last) = (stored.map_or(0, |s| s.max(0) as u64), last.unwrap_or(0));
        if stored < last && *cut_reported != Some(stored) {
            tracing::error!(
                code = "LOG_REWRITTEN",
                published = last,
                stored,
                stream = %target.stream,
                "CRITICAL: the database's newest checkpoint is older than the one published: \
                 the log's tail was cut"
            );
            *cut_reported = Some(stored);
        }
        return Ok(0);
    }
    for (size, note) in &pending {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_MSG_ID, format!("{}/{size}", target.subject).as_str());
        headers.insert(HEADER_LOG_SIZE, size.to_string().as_str());
        js.publish_with_headers(
            target.subject.clone(),
            headers,
            Bytes::from(note.clone().into_bytes()),
        )
        .await
        .map_err(|e| RelayError::Nats(format!("publish checkpoint {size}: {e}")))?
        .await
        .map_err(|e| RelayError::Nats(format!("checkpoint {size} not acknowledged: {e}")))?;
        tracing::debug!(size, subject = %target.subject, "checkpoint published");
    }
    Ok(pending.len())
}

/// A checkpoint read back from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamNote {
    /// The stream sequence it was stored at.
    pub sequence: u64,
    /// The tree size its header names.
    pub size: Option<u64>,
    /// The signed note's text.
    pub note: String,
}

/// Every checkpoint on `subject` in the stream `stream` of the NATS server at `nats_url`, in
/// stream order (for `ledger verify --from-stream`). A stream that does not exist is an error.
pub async fn read_back(
    nats_url: &str,
    stream: &str,
    subject: &str,
) -> Result<Vec<StreamNote>, RelayError> {
    let js = connect(nats_url).await?;
    let mut st = js
        .get_stream(stream)
        .await
        .map_err(|e| RelayError::Nats(format!("stream {stream}: {e}")))?;
    let info = st
        .info()
        .await
        .map_err(|e| RelayError::Nats(format!("stream {stream} info: {e}")))?;
    let (first, last) = (info.state.first_sequence.max(1), info.state.last_sequence);
    let mut notes = Vec::new();
    for sequence in first..=last {
        let message = match st.get_raw_message(sequence).await {
            Ok(m) => m,
            Err(e) if e.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound => {
                continue
            }
            Err(e) => return Err(RelayError::Nats(format!("read {stream} {sequence}: {e}"))),
        };
        if message.subject.as_str() != subject {
            continue;
        }
        notes.push(StreamNote {
            sequence,
            size: size_of(&message.headers),
            note: String::from_utf8_lossy(&message.payload).into_owned(),
        });
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cell_has_its_subject_inside_the_stream_and_outside_the_events() {
        assert_eq!(subject(None), "ledger.log.checkpoints");
        assert_eq!(subject(Some(3)), "ledger.log.checkpoints.cell.3");
        let config = stream_config(CHECKPOINT_STREAM_DEFAULT);
        assert_eq!(
            config.subjects,
            ["ledger.log.checkpoints", "ledger.log.checkpoints.>"]
        );
        assert!(config.deny_delete && config.deny_purge);
        assert!(!crate::message::stream_subjects().starts_with(CHECKPOINT_SUBJECT));
    }
}
