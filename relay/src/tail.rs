//! The consumer side (`ledger tail`): a pull consumer on the relay's stream, durable (JetStream
//! remembers what was acknowledged, so a restart resumes after it) or ephemeral, writing one
//! JSON line per event: `{"stream_sequence", "subject", "event"}` where `event` is the message
//! body, the HTTP feed's JSON of the event. Resumes from a stream sequence
//! (`from_sequence`) or after a feed position (`after_position`: earlier messages are skipped
//! by their `Ledger-Position` header).

use std::io::Write;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use futures_util::StreamExt;

use crate::message::position_of;
use crate::{stream, RelayError};

/// Messages asked for per pull.
const PULL_BATCH: u64 = 256;

/// How long one pull waits for messages.
const PULL_EXPIRES: Duration = Duration::from_secs(1);

/// What to read and from where.
#[derive(Debug, Clone)]
pub struct TailConfig {
    pub nats_url: String,
    pub stream: String,
    /// A durable consumer's name; an ephemeral consumer when `None`.
    pub durable: Option<String>,
    /// Start at this stream sequence (a new consumer only; a durable one resumes by itself).
    pub from_sequence: Option<u64>,
    /// Skip every event at or below this feed position.
    pub after_position: Option<i64>,
    /// Only subjects matching this, e.g. `ledger.events.*.42` (one user's events).
    pub filter_subject: Option<String>,
    /// Stop after this many events (printed ones; skipped ones do not count).
    pub limit: Option<u64>,
}

/// The deliver policy of a new consumer.
pub fn deliver_policy(from_sequence: Option<u64>) -> DeliverPolicy {
    match from_sequence {
        Some(start_sequence) if start_sequence > 1 => {
            DeliverPolicy::ByStartSequence { start_sequence }
        }
        _ => DeliverPolicy::All,
    }
}

/// The line printed for one message.
pub fn line(stream_sequence: u64, subject: &str, body: &[u8]) -> String {
    let event = serde_json::from_slice::<serde_json::Value>(body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(body).into_owned()));
    serde_json::json!({
        "stream_sequence": stream_sequence,
        "subject": subject,
        "event": event,
    })
    .to_string()
}

/// Consumes until `limit` events were written (forever without one); returns how many were.
/// Each message is acknowledged after its line is written and flushed.
pub async fn tail(config: &TailConfig, out: &mut impl Write) -> Result<u64, RelayError> {
    let js = stream::connect(&config.nats_url, 16).await?;
    let st = js
        .get_stream(&config.stream)
        .await
        .map_err(|e| RelayError::Nats(format!("stream {}: {e}", config.stream)))?;
    let consumer_config = pull::Config {
        durable_name: config.durable.clone(),
        deliver_policy: deliver_policy(config.from_sequence),
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        filter_subject: config.filter_subject.clone().unwrap_or_default(),
        ..Default::default()
    };
    let consumer = match &config.durable {
        Some(name) => st.get_or_create_consumer(name, consumer_config).await,
        None => st.create_consumer(consumer_config).await,
    }
    .map_err(|e| RelayError::Nats(format!("create consumer: {e}")))?;
    let mut written = 0u64;
    loop {
        // Ask for no more than is still wanted: a message pulled and never acknowledged would be
        // withheld from the durable consumer's next run until its ack wait ends.
        let want = match config.limit {
            Some(limit) if written >= limit => break,
            Some(limit) => (limit - written).min(PULL_BATCH),
            None => PULL_BATCH,
        };
        let mut batch = consumer
            .batch()
            .max_messages(usize::try_from(want).unwrap_or(1))
            .expires(PULL_EXPIRES)
            .messages()
            .await
            .map_err(|e| RelayError::Nats(format!("pull: {e}")))?;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| RelayError::Nats(format!("receive: {e}")))?;
            let sequence = message
                .info()
                .map_err(|e| RelayError::Nats(format!("message info: {e}")))?
                .stream_sequence;
            let position = message.message.headers.as_ref().and_then(position_of);
            let skip =
                matches!((config.after_position, position), (Some(after), Some(p)) if p <= after);
            if !skip {
                let text = line(
                    sequence,
                    message.message.subject.as_str(),
                    &message.message.payload,
                );
                writeln!(out, "{text}")
                    .and_then(|()| out.flush())
                    .map_err(|e| RelayError::Config(format!("write: {e}")))?;
                written += 1;
            }
            message
                .ack()
                .await
                .map_err(|e| RelayError::Nats(format!("ack: {e}")))?;
        }
    }
    Ok(written)
}

/// Consumes several streams at once (one per cell of a cell map, ADR 0017 §8), every line to
/// `out`: each stream's lines in its own order, the streams interleaved as their messages come.
/// Each config's own `limit` is ignored; `limit` counts every stream's lines together, and
/// reaching it stops them all. Returns how many lines were written; the first stream that fails
/// ends the whole.
pub async fn tail_all(
    configs: Vec<TailConfig>,
    out: impl Write + Send + 'static,
    limit: Option<u64>,
) -> Result<u64, RelayError> {
    let shared = std::sync::Arc::new(SharedOut {
        out: std::sync::Mutex::new((Box::new(out), 0)),
        limit,
        done: tokio::sync::Notify::new(),
    });
    if limit == Some(0) {
        return Ok(0);
    }
    let tails = configs.into_iter().map(|mut config| {
        config.limit = None;
        let mut writer = LineWriter {
            shared: shared.clone(),
            line: Vec::new(),
        };
        async move { tail(&config, &mut writer).await }
    });
    let all = futures_util::future::try_join_all(tails);
    let written = |s: &SharedOut| s.out.lock().map_or(0, |o| o.1);
    tokio::select! {
        ended = all => match ended {
            Ok(_) => Ok(written(&shared)),
            Err(_) if shared.reached() => Ok(written(&shared)),
            Err(e) => Err(e),
        },
        () = shared.done.notified() => Ok(written(&shared)),
    }
}

/// The output several tails share, and how many lines it took.
struct SharedOut {
    out: std::sync::Mutex<(Box<dyn Write + Send>, u64)>,
    limit: Option<u64>,
    done: tokio::sync::Notify,
}

impl SharedOut {
    fn reached(&self) -> bool {
        let written = self.out.lock().map_or(0, |o| o.1);
        self.limit.is_some_and(|l| written >= l)
    }
}

/// One tail's writer: it collects a line, and writes it whole to the shared output at `flush`
/// (a tail flushes after each line); past the limit it refuses, so that line is not acked.
struct LineWriter {
    shared: std::sync::Arc<SharedOut>,
    line: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.line.is_empty() {
            return Ok(());
        }
        if is_copy(&self.line) {
            // A partition move's copy: the tail of its source cell gave this event already.
            self.line.clear();
            return Ok(());
        }
        let mut guard = self
            .shared
            .out
            .lock()
            .map_err(|_| std::io::Error::other("the output's lock is poisoned"))?;
        let (out, written) = &mut *guard;
        if self.shared.limit.is_some_and(|l| *written >= l) {
            return Err(std::io::Error::other("the limit of lines was reached"));
        }
        out.write_all(&self.line)?;
        out.flush()?;
        self.line.clear();
        *written += 1;
        if self.shared.limit.is_some_and(|l| *written >= l) {
            self.shared.done.notify_one();
        }
        Ok(())
    }
}

/// Whether a tail's `line` carries a partition move's copy of an event (`event.origin`, ADR
/// 0023 §5).
fn is_copy(line: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(line)
        .is_ok_and(|v| v["event"]["origin"].is_object())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moves_copy_is_told_apart() {
        assert!(is_copy(
            br#"{"event":{"position":3,"origin":{"cell":1,"position":9,"move":"m"}}}"#
        ));
        assert!(!is_copy(br#"{"event":{"position":3}}"#));
    }

    #[test]
    fn a_line_wraps_the_body_with_its_sequence_and_subject() {
        let l = line(7, "ledger.events.TransferCreated.3", br#"{"position":5}"#);
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["stream_sequence"], 7);
        assert_eq!(v["subject"], "ledger.events.TransferCreated.3");
        assert_eq!(v["event"]["position"], 5);
        let l = line(1, "s", b"not json");
        assert!(l.contains("\"event\":\"not json\""), "{l}");
    }

    #[test]
    fn a_start_sequence_above_one_starts_there() {
        assert_eq!(deliver_policy(None), DeliverPolicy::All);
        assert_eq!(deliver_policy(Some(1)), DeliverPolicy::All);
        assert_eq!(
            deliver_policy(Some(9)),
            DeliverPolicy::ByStartSequence { start_sequence: 9 }
        );
    }
}
