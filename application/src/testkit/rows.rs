//! The durable rows the in-memory stores keep (`Durable`: the tables a crash does not lose) and
//! their shared handle (`Rows`), read by the stores, their hook and the tests beside them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::NaiveDate;
use cqrs_es::Aggregate;
use domain::{ReqId, Transfer, TransferEvent, TransferState, UserId};

use crate::daily::DailyUsage;
use crate::ports::ClientKey;

/// One transfer's events, as the `events` table holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    pub events: Vec<TransferEvent>,
    /// The transaction each event was committed in (`Durable::next_tx`), as the log's `tx_id`.
    pub txs: Vec<u64>,
    pub owner: Option<UserId>,
    /// When its last commit was made (`open_transfers.recorded_at`).
    pub recorded_at_ms: u64,
}

impl Stream {
    /// The state its events lead to.
    pub fn state(&self) -> Option<TransferState> {
        self.events.last().map(TransferEvent::resulting_state)
    }

    /// Its events folded.
    pub fn fold(&self) -> Transfer {
        let mut transfer = Transfer::default();
        for event in &self.events {
            transfer.apply(event.clone());
        }
        transfer
    }
}

/// One transfer's row of `transfer_retries`: the lease (application's) and the retry book
/// (the recovery worker's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetryRow {
    pub state: Option<TransferState>,
    pub attempts: i32,
    pub refund_failures: i32,
    pub next_retry_at_ms: u64,
    pub lease_owner: Option<String>,
    pub lease_until_ms: Option<u64>,
    pub refund_alerted: bool,
    pub stuck_alerted: bool,
    pub last_error_category: Option<&'static str>,
}

impl RetryRow {
    /// Nobody holds a live lease at `now_ms`.
    pub fn lease_free(&self, now_ms: u64) -> bool {
        self.lease_until_ms.is_none_or(|until| until < now_ms)
    }
}

/// The durable rows every in-memory store keeps: what survives a crash of any process.
#[derive(Debug, Default)]
pub struct Durable {
    pub streams: BTreeMap<ReqId, Stream>,
    pub claims: BTreeMap<(UserId, String), ClientKey>,
    pub retries: BTreeMap<ReqId, RetryRow>,
    /// The daily limits' counters, per UTC day, kept and decided by the product's one rule.
    pub daily: BTreeMap<NaiveDate, DailyUsage>,
    /// The next commit's transaction number (the log's `tx_id`; every commit is visible at
    /// once, so everything below it is settled for good).
    pub next_tx: u64,
}

impl Durable {
    /// A new commit's transaction number.
    pub fn take_tx(&mut self) -> u64 {
        self.next_tx += 1;
        self.next_tx
    }
}

/// The durable rows, shared by the stores and whoever reads them beside (a test, the
/// simulation's checks). Cheap to clone; clones share the rows.
#[derive(Debug, Clone, Default)]
pub struct Rows(Arc<Mutex<Durable>>);

impl Rows {
    /// The rows, locked.
    pub fn lock(&self) -> MutexGuard<'_, Durable> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
