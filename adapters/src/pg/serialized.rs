//! A commit as the event store's repository takes it (`SerializedEvent`s with their sequences
//! and owner), and the repository's refusals as the log's contract names them: shared by the
//! log's appends (`transfers.rs`) and its funded writes (`funded.rs`).

use std::collections::HashMap;

use application::ports::Commit;
use application::CoordinatorError;
use cqrs_es::persist::{PersistenceError, SerializedEvent};
use cqrs_es::EventEnvelope;
use domain::{Transfer, UserId};

use crate::event_store::OWNER_METADATA_KEY;

/// The owner travels with every event, so the feed can serve one user's stream.
pub(super) fn owner_metadata(owner: Option<UserId>) -> HashMap<String, String> {
    owner
        .map(|owner| HashMap::from([(OWNER_METADATA_KEY.to_owned(), owner.to_string())]))
        .unwrap_or_default()
}

/// A commit's events as the repository stores them: sequences after the expected one, the
/// owner in every event's metadata (what postgres-es's `commit` makes of them).
pub(super) fn serialize(commit: &Commit) -> Result<Vec<SerializedEvent>, CoordinatorError> {
    let metadata = owner_metadata(commit.owner);
    commit
        .events
        .iter()
        .zip(commit.expected_sequence + 1..)
        .map(|(event, sequence)| {
            let envelope = EventEnvelope::<Transfer> {
                aggregate_id: commit.aggregate_id.clone(),
                sequence,
                payload: event.clone(),
                metadata: metadata.clone(),
            };
            SerializedEvent::try_from(&envelope).map_err(persistence)
        })
        .collect()
}

/// A repository's refusal as the log's contract names it: a version check lost is a conflict,
/// anything else an unknown outcome.
pub(super) fn persistence(e: PersistenceError) -> CoordinatorError {
    match e {
        PersistenceError::OptimisticLockError => CoordinatorError::Conflict,
        // The fence's refusal keeps its type (`application::error::Fenced`) as the cause.
        PersistenceError::UnknownError(cause) if cause.is::<application::error::Fenced>() => {
            CoordinatorError::OutcomeUnknown(std::sync::Arc::from(cause))
        }
        other => CoordinatorError::outcome_unknown(other),
    }
}
