//! The one place a driver error becomes the core's: a `StoreError` for the records, an unknown
//! outcome for the coordinator's ports.

use application::{CoordinatorError, StoreError};

/// A driver error as the core's store error.
pub fn store(e: sqlx::Error) -> StoreError {
    if eventlog::append::is_fenced(&e) {
        // The partition fence's refusal (ADR 0023 §2), typed so the edge answers 503 with
        // `Ledger-Route-Again` (the front routes the request again) and never a 500.
        return StoreError::new(application::error::Fenced(e.to_string()));
    }
    StoreError::new(e)
}

/// A driver error on a coordinator's port: the outcome is unknown.
pub fn unknown(e: sqlx::Error) -> CoordinatorError {
    CoordinatorError::outcome_unknown(e)
}
