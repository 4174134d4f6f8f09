//! The recovery worker's fast loop: given/when/then tests of `RecoveryWorker::pass` over the
//! in-memory ports of `application::testkit` and the in-memory retry book of `recovery::testkit`. Each test
//! states what is durable before (transfers left open, leases, the book's rows, faults armed),
//! one pass of a fresh worker process, and what it did: events appended, calls made to each
//! account system, the pass's report, and the book's attempt log, backoff, leases and alerts.

mod pass;

use std::sync::Arc;
use std::time::Duration;

use application::testkit::scenario::given_req_id;
use application::testkit::{RetryRow, Scenario, Then};
use application::CoordinatorError;
use domain::TransferState;
use recovery::worker::PassReport;
use recovery::{RecoveryConfig, RecoveryWorker};

use recovery::testkit::{Attempt, MemRetryBook};

/// The worker's settings in every test.
pub fn config() -> RecoveryConfig {
    RecoveryConfig {
        stale_after: Duration::from_secs(5),
        lease: Duration::from_secs(60),
        backoff_ms_base: 500,
        backoff_ms_max: 8_000,
        target_pending_alert_after: Duration::from_secs(60),
        refund_failures_alert: 3,
        ..RecoveryConfig::default()
    }
}

/// A coordinator `Scenario` with the worker's retry book beside it.
pub struct WorkerScenario {
    pub given: Scenario,
    pub book: MemRetryBook,
}

impl WorkerScenario {
    pub fn new(given: Scenario) -> Self {
        let book = MemRetryBook::new(given.world.store.clone());
        Self { given, book }
    }

    /// The given transfer was left in `state` and has sat unchanged past `stale_after`.
    pub fn left_in(given: Scenario, state: TransferState) -> Self {
        let given = given.given_transfer_in(state);
        let scenario = Self::new(given);
        scenario.wait(config().stale_after + Duration::from_secs(1));
        scenario
    }

    /// Time passes.
    pub fn wait(&self, by: Duration) {
        self.given.world.clock().advance(by);
    }

    /// One pass of a fresh worker process.
    pub fn when_pass(&self) -> Then<'_, Result<PassReport, CoordinatorError>> {
        let book: Arc<dyn recovery::RetryBook> = Arc::new(self.book.clone());
        self.given.when(|coordinator| async move {
            RecoveryWorker::with_book(coordinator, config(), book)
                .pass()
                .await
        })
    }

    /// The attempt log.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.book.rows().attempts.clone()
    }

    /// The given transfer's row of `transfer_retries`.
    pub fn retry_row(&self) -> RetryRow {
        self.given.world.store.rows().retries[&given_req_id()].clone()
    }
}

/// The report a pass answered; panics on an error or a crash.
pub fn report(then: &Then<'_, Result<PassReport, CoordinatorError>>) -> PassReport {
    then.answer().clone().expect("the pass answered")
}
