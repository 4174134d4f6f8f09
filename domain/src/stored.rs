//! Reading a stored transfer event back: the one decoder of an event-table payload, with the
//! event version check, shared by every reader of the log (`projections::log` for the
//! projector, the bulk rebuild and the feed; `adapters::event_store` for the raw reads and the
//! conservation check). Pure: the caller reads the row.

use crate::transfer::{TransferEvent, EVENT_VERSION};

/// Why a stored payload is not a transfer event this version can read.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    /// Written under another event version: it needs an upcaster first.
    #[error("version {0} has no upcaster")]
    Version(String),
    /// The payload does not decode as a `TransferEvent`.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// The transfer event of a payload stored under `event_version`, refusing another version
/// before decoding anything. `decode` reads the payload (from JSON text or a parsed value).
pub fn decode_payload(
    event_version: &str,
    decode: impl FnOnce() -> serde_json::Result<TransferEvent>,
) -> Result<TransferEvent, PayloadError> {
    if event_version != EVENT_VERSION {
        return Err(PayloadError::Version(event_version.to_owned()));
    }
    Ok(decode()?)
}

/// [`decode_payload`] of a parsed JSON value.
pub fn decode_value(
    event_version: &str,
    payload: serde_json::Value,
) -> Result<TransferEvent, PayloadError> {
    decode_payload(event_version, || serde_json::from_value(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_version_is_refused_before_its_payload_is_read() {
        let mut read = false;
        let e = decode_payload("2", || {
            read = true;
            serde_json::from_str("{}")
        })
        .unwrap_err();
        assert!(
            matches!(e, PayloadError::Version(ref v) if v == "2"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "version 2 has no upcaster");
        assert!(!read);
    }

    #[test]
    fn a_payload_that_is_not_an_event_is_refused_with_the_json_error() {
        let e = decode_value(EVENT_VERSION, serde_json::json!({"NoSuchEvent": {}})).unwrap_err();
        assert!(matches!(e, PayloadError::Json(_)), "{e:?}");
    }
}
