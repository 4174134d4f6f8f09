//! The relay's JetStream side: connecting, creating or verifying the stream (file storage, the
//! relay's subjects, a duplicate window), and reading where the stream stands: its last sequence
//! and the feed position its last message carries.

use std::time::Duration;

use async_nats::jetstream::{self, stream::StorageType};

use crate::message::{position_of, stream_subjects_for};
use crate::RelayError;

/// How long a JetStream API call or a publish's ack may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How far back from the stream's last sequence to look for a message still there (messages
/// deleted by an operator leave holes; none are deleted by the relay).
const LAST_MESSAGE_SEARCH: u64 = 64;

/// A connection to NATS and its JetStream context, sized for `window` publishes in flight.
pub async fn connect(url: &str, window: usize) -> Result<jetstream::Context, RelayError> {
    let client = async_nats::ConnectOptions::new()
        .name("ledger-relay")
        .connection_timeout(Duration::from_secs(2))
        .request_timeout(Some(REQUEST_TIMEOUT))
        .connect(url)
        .await
        .map_err(|e| RelayError::Nats(format!("connect to {url}: {e}")))?;
    Ok(jetstream::ContextBuilder::new()
        .timeout(REQUEST_TIMEOUT)
        .ack_timeout(REQUEST_TIMEOUT)
        // Abandoned acks (after an error) keep their slot until they time out; room for a
        // second window keeps the next one from waiting on them.
        .max_ack_inflight(window.saturating_mul(3).max(16))
        .backpressure_on_inflight(true)
        .build(client))
}

/// The stream's configuration as the relay creates it.
/// `cell` names the cell whose feed the stream holds (its own subjects); `None` without a map.
pub fn stream_config(
    name: &str,
    duplicate_window: Duration,
    cell: Option<u16>,
) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![stream_subjects_for(cell)],
        storage: StorageType::File,
        duplicate_window,
        description: Some("Ledger events, in feed order, published by `ledger relay`".to_owned()),
        ..Default::default()
    }
}

/// Creates the stream or checks the existing one holds the relay's subjects on file storage.
pub async fn ensure(
    js: &jetstream::Context,
    name: &str,
    duplicate_window: Duration,
    cell: Option<u16>,
) -> Result<jetstream::stream::Stream, RelayError> {
    let mut stream = js
        .get_or_create_stream(stream_config(name, duplicate_window, cell))
        .await
        .map_err(|e| RelayError::Nats(format!("create or get stream {name}: {e}")))?;
    let info = stream
        .info()
        .await
        .map_err(|e| RelayError::Nats(format!("stream {name} info: {e}")))?;
    let wanted = stream_subjects_for(cell);
    if info.config.storage != StorageType::File {
        return Err(RelayError::Config(format!(
            "stream {name} exists with memory storage; the relay needs file storage"
        )));
    }
    if !info.config.subjects.iter().any(|s| s == &wanted) {
        return Err(RelayError::Config(format!(
            "stream {name} exists with subjects {:?}; the relay needs {wanted}",
            info.config.subjects
        )));
    }
    if info.config.duplicate_window != duplicate_window {
        tracing::info!(
            stream = name,
            existing_ms = info.config.duplicate_window.as_millis() as u64,
            "the stream keeps its own duplicate window"
        );
    }
    Ok(stream)
}

/// Where the stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamEnd {
    /// The stream's last sequence (0 when nothing was ever stored).
    pub last_sequence: u64,
    /// The feed position of the last message still in the stream, if any.
    pub last_position: Option<i64>,
}

/// Reads the stream's last sequence and the `Ledger-Position` of its last message (or of the
/// newest message still there, when the last ones were deleted). A message without the header
/// is an error: the stream's subjects belong to the relay alone.
pub async fn end(stream: &mut jetstream::stream::Stream) -> Result<StreamEnd, RelayError> {
    let info = stream
        .info()
        .await
        .map_err(|e| RelayError::Nats(format!("stream info: {e}")))?;
    let last_sequence = info.state.last_sequence;
    let first_sequence = info.state.first_sequence.max(1);
    if last_sequence == 0 || info.state.messages == 0 {
        return Ok(StreamEnd {
            last_sequence,
            last_position: None,
        });
    }
    let lowest = last_sequence
        .saturating_sub(LAST_MESSAGE_SEARCH)
        .max(first_sequence);
    let mut seq = last_sequence;
    while seq >= lowest {
        match stream.get_raw_message(seq).await {
            Ok(message) => {
                let position = position_of(&message.headers).ok_or_else(|| {
                    RelayError::Config(format!(
                        "stream message {seq} carries no Ledger-Position header: \
                         something else publishes on the relay's subjects"
                    ))
                })?;
                return Ok(StreamEnd {
                    last_sequence,
                    last_position: Some(position),
                });
            }
            Err(e)
                if e.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound
                    && seq > lowest =>
            {
                seq -= 1;
            }
            Err(e) if e.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound => break,
            Err(e) => return Err(RelayError::Nats(format!("read stream message {seq}: {e}"))),
        }
    }
    tracing::warn!(
        last_sequence,
        "no message found near the stream's end; resuming from the checkpoint alone"
    );
    Ok(StreamEnd {
        last_sequence,
        last_position: None,
    })
}
