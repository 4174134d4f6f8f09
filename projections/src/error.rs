//! Why projecting stopped: the one error type of the live pass, the bulk rebuild, the fold and
//! the point-in-time queries.

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
