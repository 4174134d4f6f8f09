//! Scripted faults for the in-memory ports: a test arms a fault at a call site (`StoreCall` for
//! the coordinator's stores, `Call` for an account system), and the next matching call meets it.
//! A crash fault never answers: the manual executor (`testkit::run`) then stops polling and the
//! "process" is dropped exactly there, with every port's durable state left as it was.

use std::sync::{Arc, Mutex};

use domain::{Operation, TransferState};

/// A call of the coordinator's stores (the event log, claims, leases, daily counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCall {
    /// `TransferLog::load`.
    Load,
    /// `TransferLog::append` of a commit whose last event leads to this state; a creation's
    /// (`SourcePending`) also when it is written with its claim and charge (`create_many`).
    Append(TransferState),
    /// `ClientKeys::find`.
    FindClaim,
    /// `ClientKeys::claim`.
    Claim,
    /// `ClientKeys::rekey`.
    Rekey,
    /// `Leases::take`.
    TakeLease,
    /// `Leases::renew`.
    RenewLease,
    /// `Leases::release`.
    ReleaseLease,
    /// `DailyReservations::reserve` (and each charge of `reserve_many`).
    Reserve,
    /// `DailyReservations::release`.
    ReleaseReservation,
    /// Any call of the recovery worker's retry book (kept by the recovery tests' own book).
    RetryBook,
}

/// What a store call meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFault {
    /// Fails before its effect: nothing changed (the caller cannot tell).
    FailBefore,
    /// Takes effect, then fails: the answer is lost (the caller cannot tell).
    FailAfter,
    /// The process dies before the call reaches the store.
    CrashBefore,
    /// The process dies after the store made the call durable, before it saw the answer.
    CrashAfter,
    /// The call waits for the other processes of `run_together` to run first, then goes on.
    Pause,
}

/// A call to an account system, as its call log records it and as its faults are armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    Withdraw,
    Deposit,
    Refund,
    /// `AccountPort::lookup` of this operation.
    Lookup(Operation),
    /// `AccountPort::cancel` of this operation.
    Cancel(Operation),
}

impl Call {
    /// The movement call of `operation`.
    pub fn of(operation: Operation) -> Self {
        match operation {
            Operation::Withdraw => Self::Withdraw,
            Operation::Deposit => Self::Deposit,
            Operation::Refund => Self::Refund,
        }
    }
}

/// What an account-system call meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountFault {
    /// Decided as a refusal with this code, recorded for good (every repeat is refused alike).
    Refuse(String),
    /// Never reached the system: nothing applied, the answer is a network error (a lookup
    /// answers `Unavailable`).
    Unavailable,
    /// Applied (or refused) as usual, then the answer is lost: a timeout.
    AnswerLost,
    /// The process dies before the call leaves it.
    CrashBefore,
    /// The system decides the call, then the process dies before it reads the answer.
    CrashAfter,
    /// The call waits for the other processes of `run_together` to run first, then goes on.
    Pause,
}

/// One armed fault.
#[derive(Debug, Clone)]
struct Armed<S, F> {
    site: S,
    fault: F,
    /// Matching calls let through before this one fires.
    skip: u32,
    /// How many matching calls it fires for (`None`: every one until disarmed).
    times: Option<u32>,
}

/// The faults armed at a set of call sites, shared by a port's clones. Cheap to clone.
#[derive(Debug)]
pub struct Script<S, F> {
    armed: Arc<Mutex<Vec<Armed<S, F>>>>,
}

impl<S, F> Clone for Script<S, F> {
    fn clone(&self) -> Self {
        Self {
            armed: Arc::clone(&self.armed),
        }
    }
}

impl<S, F> Default for Script<S, F> {
    fn default() -> Self {
        Self {
            armed: Arc::default(),
        }
    }
}

impl<S: PartialEq + Copy, F: Clone> Script<S, F> {
    /// The next call at `site` meets `fault`.
    pub fn arm(&self, site: S, fault: F) {
        self.push(site, fault, 0, Some(1));
    }

    /// The call at `site` after `skip` others meets `fault`.
    pub fn arm_after(&self, site: S, skip: u32, fault: F) {
        self.push(site, fault, skip, Some(1));
    }

    /// Every call at `site` meets `fault` until `heal`.
    pub fn arm_always(&self, site: S, fault: F) {
        self.push(site, fault, 0, None);
    }

    /// Disarms every fault at `site`.
    pub fn heal(&self, site: S) {
        self.lock().retain(|a| a.site != site);
    }

    /// Disarms every fault.
    pub fn heal_all(&self) {
        self.lock().clear();
    }

    /// The fault the call at `site` meets, if any (consumed when it fires its last time).
    pub fn take(&self, site: S) -> Option<F> {
        let mut armed = self.lock();
        let index = armed.iter().position(|a| a.site == site)?;
        let entry = &mut armed[index];
        if entry.skip > 0 {
            entry.skip -= 1;
            return None;
        }
        let fault = entry.fault.clone();
        match &mut entry.times {
            Some(1) => {
                armed.remove(index);
            }
            Some(n) => *n -= 1,
            None => {}
        }
        Some(fault)
    }

    fn push(&self, site: S, fault: F, skip: u32, times: Option<u32>) {
        self.lock().push(Armed {
            site,
            fault,
            skip,
            times,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Armed<S, F>>> {
        self.armed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A call that never answers: it marks this thread's process as crashed, and the manual
/// executor (`testkit::run`) drops the process at its next yield.
pub async fn crash<T>() -> T {
    crate::testkit::exec::mark_crashed();
    std::future::pending().await
}
