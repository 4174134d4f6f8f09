//! An entry's fields as the leaf needs them, read from the event table by one expression list
//! (`eventlog::entries`: the follower's reads, the routes' `entries`, `verify`'s COPY): the
//! domain time is the database's text of it in UTC, put in the leaf's form here (`leaf_time`),
//! the payload is the stored JSON text.

use sqlx::PgPool;
use tlog::Entry;

pub use eventlog::entries::ReceiptEntry;

use crate::leaf_time::LeafTime;

/// One entry of the log, owned.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EntryRow {
    pub position: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub event_type: String,
    pub event_version: String,
    /// In the leaf's form (`YYYY-MM-DDTHH:MM:SS.ffffffZ`).
    pub occurred_at: String,
    pub user_id: Option<i64>,
    pub payload: String,
}

impl EntryRow {
    /// The entry's fields for `tlog`.
    pub fn entry(&self) -> Entry<'_> {
        Entry {
            position: self.position,
            aggregate_type: &self.aggregate_type,
            aggregate_id: &self.aggregate_id,
            sequence: self.sequence,
            event_type: &self.event_type,
            event_version: &self.event_version,
            occurred_at: &self.occurred_at,
            user_id: self.user_id,
            payload: &self.payload,
        }
    }

    /// The exact leaf bytes.
    pub fn leaf(&self) -> Vec<u8> {
        self.entry().leaf()
    }
}

/// The entry at feed `position`, if the log has one.
pub async fn at(pool: &PgPool, position: i64) -> Result<Option<EntryRow>, sqlx::Error> {
    let Some(row) = eventlog::entries::entry_at(pool, position).await? else {
        return Ok(None);
    };
    let occurred_at = LeafTime::from_db(&row.occurred_at)
        .map_err(|why| sqlx::Error::Decode(why.into()))?
        .as_str()
        .to_owned();
    Ok(Some(EntryRow {
        position: row.position,
        aggregate_type: row.aggregate_type,
        aggregate_id: row.aggregate_id,
        sequence: row.sequence,
        event_type: row.event_type,
        event_version: row.event_version,
        occurred_at,
        user_id: row.user_id,
        payload: row.payload,
    }))
}

/// A transfer's events with their feed positions, in sequence order (empty for an unknown
/// req_id).
pub async fn of_transfer(pool: &PgPool, req_id: &str) -> Result<Vec<ReceiptEntry>, sqlx::Error> {
    eventlog::entries::transfer_entries(pool, req_id).await
}

/// The feed positions of the events of each transfer in `req_ids`, in sequence order, by req_id
/// (a req_id without events is absent): the receipts the transfer answers carry, in one query.
pub async fn positions_of<'c>(
    db: impl sqlx::PgExecutor<'c>,
    req_ids: &[String],
) -> Result<std::collections::HashMap<String, Vec<i64>>, sqlx::Error> {
    eventlog::entries::transfer_positions(db, req_ids).await
}
