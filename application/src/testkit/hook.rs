//! The in-memory stores' hook: what each store call meets (a fault before or after its effect,
//! a wait) and what each effect is seen doing. The fast tests' hook is the fault `Script` armed
//! by a scenario; the simulation (`sim`) plugs in its seeded faults, scheduler yields and
//! latency, and its checks of every append.

use async_trait::async_trait;
use domain::{ReqId, TransferEvent, TransferState};

use crate::testkit::faults::{Script, StoreCall, StoreFault};
use crate::testkit::rows::Durable;

/// An effect of a store call, shown to the hook with the rows it acts on.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    /// A commit passed the version check and the claim guard; the rows do not hold it yet.
    Appending {
        req_id: ReqId,
        events: &'a [TransferEvent],
    },
    /// The commit is in the rows.
    Appended {
        req_id: ReqId,
        events: &'a [TransferEvent],
    },
    /// A commit refused: `expected` events were expected before it, the stream holds `at`.
    SequenceTaken {
        req_id: ReqId,
        expected: usize,
        at: usize,
    },
    /// A creation refused: the claim of `cid` no longer names it.
    ClaimMoved { req_id: ReqId, cid: &'a str },
    /// `cid` claimed for `req_id`.
    Claimed { cid: &'a str, req_id: ReqId },
    /// The claim of `cid` moved from `old` (never created) to `new`.
    Rekeyed {
        cid: &'a str,
        old: ReqId,
        new: ReqId,
    },
    /// `owner` took the lease of `req_id`.
    LeaseTaken { req_id: ReqId, owner: &'a str },
    /// The recovery worker's retry book began its attempt number `attempt` (`recovery`'s
    /// in-memory book).
    AttemptBegun {
        attempt: i64,
        req_id: ReqId,
        worker: &'a str,
        state_before: TransferState,
    },
    /// The retry book recorded the end of an attempt on `req_id`.
    AttemptEnded { req_id: ReqId, outcome: &'a str },
}

/// Decides the fault of each store call and observes each effect. Shared by a store's clones.
#[async_trait]
pub trait StoreHook: Send + Sync + std::fmt::Debug {
    /// Before the call at `site` takes effect: the fault it meets, if any. It may wait first.
    async fn before(&self, site: StoreCall) -> Option<StoreFault>;

    /// After the effect of the call at `site`, which met `before` first: the fault it meets now.
    fn after(&self, _site: StoreCall, before: Option<StoreFault>) -> Option<StoreFault> {
        before
    }

    /// An effect on `rows` (locked for the call's effect: the hook must not take them again).
    fn seen(&self, _rows: &Durable, _seen: Seen<'_>) {}
}

/// The default hook: the faults a test armed, each met once where it was armed.
#[async_trait]
impl StoreHook for Script<StoreCall, StoreFault> {
    async fn before(&self, site: StoreCall) -> Option<StoreFault> {
        self.take(site)
    }
}
