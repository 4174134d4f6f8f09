//! The event log as the projector reads it: a stored event, its id, and decoding a row's
//! payload into a [`TransferEvent`]. The query both passes read the log with, and its row, are
//! `eventlog::batches`'s. No I/O here.

use domain::TransferEvent;
use eventlog::batches::EventRow;

use crate::error::ProjectionError;

pub use eventlog::TRANSFER_AGGREGATE;

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
    /// The consumers' de-duplication key (contract §8): built from the aggregate and its sequence,
    /// so the same event always has the same id, on any replay.
    pub fn event_id(&self) -> String {
        event_id(&self.aggregate_type, &self.aggregate_id, self.sequence)
    }

    /// The transfer event this row holds, or `None` for another aggregate type.
    pub fn transfer_event(&self) -> Result<Option<TransferEvent>, ProjectionError> {
        decode_transfer_event(
            &self.aggregate_type,
            &self.aggregate_id,
            self.sequence,
            &self.event_version,
            || serde_json::from_value(self.payload.clone()),
        )
    }
}

/// The id of one event: `<aggregate type>:<aggregate id>:<sequence>`.
pub fn event_id(aggregate_type: &str, aggregate_id: &str, sequence: i64) -> String {
    format!("{aggregate_type}:{aggregate_id}:{sequence}")
}

/// The transfer event of one row, or `None` for another aggregate type, through the log's one
/// payload decoder (`domain::stored`: a version without an upcaster is refused before anything
/// is decoded). `decode` reads the payload (from JSON text or an already parsed value).
pub(crate) fn decode_transfer_event(
    aggregate_type: &str,
    aggregate_id: &str,
    sequence: i64,
    event_version: &str,
    decode: impl FnOnce() -> serde_json::Result<TransferEvent>,
) -> Result<Option<TransferEvent>, ProjectionError> {
    if aggregate_type != TRANSFER_AGGREGATE {
        return Ok(None);
    }
    domain::stored::decode_payload(event_version, decode)
        .map(Some)
        .map_err(|e| ProjectionError::Undecodable {
            event_id: event_id(aggregate_type, aggregate_id, sequence),
            detail: e.to_string(),
        })
}

/// One event of a batch: where it stands in the log, whose it is, and the transfer event decoded
/// from its payload (`None` for another aggregate type).
pub(crate) struct BatchEvent {
    pub tx_id: i64,
    pub global_position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event: Option<TransferEvent>,
}

impl BatchEvent {
    /// Decodes the payload, with the same refusals as [`StoredEvent::transfer_event`].
    pub fn decode(row: EventRow) -> Result<Self, ProjectionError> {
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

    /// The transfer event of a payload read as JSON text.
    pub fn transfer_event(
        aggregate_type: &str,
        aggregate_id: &str,
        sequence: i64,
        event_version: &str,
        payload: &str,
    ) -> Result<Option<TransferEvent>, ProjectionError> {
        decode_transfer_event(
            aggregate_type,
            aggregate_id,
            sequence,
            event_version,
            || serde_json::from_str(payload),
        )
    }
}
