//! Admission limits of the read surfaces (GraphQL, the event feed and its streams): how much of
//! the database and spot-core they may hold at once, and how many long-lived streams a caller
//! may keep open. They exist so that no reader, however many aliases or streams it opens, can
//! starve another user's transfer of pool connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use domain::UserId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

/// Read-side calls (each a database query or a spot-core call) running at once in one process.
/// The pool has the binary's `config::POOL_CONNECTIONS_MAX` (16) connections; the rest stay for the write
/// path, the projector and the recovery worker.
pub const READ_CALLS_CONCURRENT_MAX: usize = 6;

/// How long a read waits for its turn before it is refused as busy.
pub const READ_WAIT_MAX: Duration = Duration::from_secs(3);

/// Open GraphQL subscriptions per user (per process).
pub const SUBSCRIPTIONS_PER_USER_MAX: usize = 16;

/// Open event streams (`/api/v1/events/stream`) per process.
pub const EVENT_STREAMS_MAX: usize = 32;

/// Refused for now: the read side is at capacity (answered 429 RATE_LIMIT_EXCEEDED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

/// The read side's admission state; one per process, shared by every handler.
#[derive(Debug)]
pub struct Admission {
    reads: Semaphore,
    streams: Arc<Semaphore>,
    subscriptions: Arc<Mutex<HashMap<UserId, usize>>>,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            reads: Semaphore::new(READ_CALLS_CONCURRENT_MAX),
            streams: Arc::new(Semaphore::new(EVENT_STREAMS_MAX)),
            subscriptions: Arc::default(),
        }
    }
}

impl Admission {
    /// A turn for one read-side call; hold it for the call's duration.
    pub async fn read(&self) -> Result<SemaphorePermit<'_>, Busy> {
        self.reads_at_once(1).await
    }

    /// Turns for `calls` read-side calls made at once (taken together, so two readers can never
    /// each hold half of what they need).
    pub async fn reads_at_once(&self, calls: u32) -> Result<SemaphorePermit<'_>, Busy> {
        match tokio::time::timeout(READ_WAIT_MAX, self.reads.acquire_many(calls)).await {
            Ok(Ok(permit)) => Ok(permit),
            // Timed out, or closed (never: the semaphore is never closed).
            _ => Err(Busy),
        }
    }

    /// A slot for one event stream, held as long as the stream is open.
    pub fn event_stream(&self) -> Result<OwnedSemaphorePermit, Busy> {
        self.streams.clone().try_acquire_owned().map_err(|_| Busy)
    }

    /// A slot for one of `user`'s subscriptions, held as long as the subscription is open.
    pub fn subscription(&self, user: UserId) -> Result<SubscriptionSlot, Busy> {
        let mut open = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(user).or_insert(0);
        if *count >= SUBSCRIPTIONS_PER_USER_MAX {
            return Err(Busy);
        }
        *count += 1;
        Ok(SubscriptionSlot {
            open: self.subscriptions.clone(),
            user,
        })
    }
}

/// One open subscription; dropping it frees the slot.
#[derive(Debug)]
pub struct SubscriptionSlot {
    open: Arc<Mutex<HashMap<UserId, usize>>>,
    user: UserId,
}

impl Drop for SubscriptionSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                // No entry outlives a user's last subscription: the map holds only what is open.
                open.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_are_capped_per_user_and_freed_on_drop() {
        let admission = Admission::default();
        let alice = UserId::new(1).unwrap();
        let bob = UserId::new(2).unwrap();
        let mut held: Vec<_> = (0..SUBSCRIPTIONS_PER_USER_MAX)
            .map(|_| admission.subscription(alice).unwrap())
            .collect();
        assert_eq!(admission.subscription(alice).unwrap_err(), Busy);
        assert!(
            admission.subscription(bob).is_ok(),
            "another user is not affected"
        );
        held.pop();
        assert!(admission.subscription(alice).is_ok());
        drop(held);
        assert!(admission.subscriptions.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn reads_wait_for_a_turn_and_streams_are_capped() {
        let admission = Admission::default();
        let turns: Vec<_> = futures_util::future::join_all(
            (0..READ_CALLS_CONCURRENT_MAX).map(|_| admission.read()),
        )
        .await;
        assert!(turns.iter().all(Result::is_ok));
        assert_eq!(admission.reads.available_permits(), 0);
        drop(turns);
        let streams: Vec<_> = (0..EVENT_STREAMS_MAX)
            .map(|_| admission.event_stream().unwrap())
            .collect();
        assert_eq!(admission.event_stream().unwrap_err(), Busy);
        drop(streams);
        assert!(admission.event_stream().is_ok());
    }
}
