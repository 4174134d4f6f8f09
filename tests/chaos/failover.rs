//! The chaos run on a private primary and synchronous standby (`--pg-failovers N`,
//! `crate::pg_pair`): the database faults (immediate restarts of the primary and failovers: the
//! primary killed with `-m immediate`, the standby promoted, a new standby made of the old
//! primary's node) spread evenly over the transfers, and how long each failover took to serve
//! transfers again. With cells the pair is one cell's database (the last's), and the time to the
//! first answer is that cell's.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pg_pair::PgPair;

/// What one failover cost, from the kill of the primary.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailoverTimes {
    /// Until the standby was promoted and accepted writes.
    pub promoted: Duration,
    /// Until a new standby streamed synchronously from it (commits wait for one).
    pub standby_back: Duration,
    /// Until a client was answered again (`None`: no transfer was due any more).
    pub first_answer: Option<Duration>,
}

impl fmt::Display for FailoverTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "promoted after {:.2} s, synchronous standby back after {:.2} s, first answer after {}",
            self.promoted.as_secs_f64(),
            self.standby_back.as_secs_f64(),
            self.first_answer
                .map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
        )
    }
}

/// One database fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Restart,
    Failover,
}

/// Restarts and failovers spread evenly over the transfers, in the order they come due.
fn schedule(restarts: usize, failovers: usize, transfers: usize) -> Vec<(usize, Fault)> {
    let spread = |n: usize, fault: Fault| {
        (1..=n)
            .map(move |k| (transfers * k / (n + 1), fault))
            .collect::<Vec<_>>()
    };
    let mut all = spread(restarts, Fault::Restart);
    all.extend(spread(failovers, Fault::Failover));
    all.sort();
    all
}

/// What the fault task needs to know of the run.
pub(super) struct Progress {
    /// Transfers handed to clients so far.
    pub next: Arc<AtomicUsize>,
    /// Each cell's transfers answered so far (one entry without cells).
    pub answered: Arc<Vec<AtomicUsize>>,
    /// The index of the pair's cell (0 without cells): a failover's first answer is its own.
    pub cell: usize,
    pub clients_done: Arc<AtomicBool>,
}

/// Runs the pair's faults as the transfers progress; returns the restarts done and each
/// failover's times.
pub(super) async fn run_faults(
    pair: Arc<PgPair>,
    progress: Progress,
    restarts: usize,
    failovers: usize,
    transfers: usize,
) -> anyhow::Result<(usize, Vec<FailoverTimes>)> {
    let mut times = Vec::new();
    let mut restarted = 0;
    for (due, fault) in schedule(restarts, failovers, transfers) {
        while progress.next.load(Ordering::SeqCst) < due
            && !progress.clients_done.load(Ordering::SeqCst)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match fault {
            Fault::Restart => {
                let p = pair.clone();
                tokio::task::spawn_blocking(move || p.restart_primary()).await??;
                pair.wait_streaming(Duration::from_secs(120)).await?;
                restarted += 1;
            }
            Fault::Failover => times.push(fail_over(&pair, &progress).await?),
        }
    }
    Ok((restarted, times))
}

async fn fail_over(pair: &Arc<PgPair>, progress: &Progress) -> anyhow::Result<FailoverTimes> {
    let answered = &progress.answered[progress.cell];
    let answered_before = answered.load(Ordering::SeqCst);
    let killed = Instant::now();
    let p = pair.clone();
    tokio::task::spawn_blocking(move || p.fail_over()).await??;
    let promoted = killed.elapsed();
    pair.rebuild_standby().await?;
    let standby_back = killed.elapsed();
    let mut first_answer = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && !progress.clients_done.load(Ordering::SeqCst) {
        if answered.load(Ordering::SeqCst) > answered_before {
            first_answer = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(FailoverTimes {
        promoted,
        standby_back,
        first_answer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_spread_and_ordered() {
        let s = schedule(2, 1, 300);
        assert_eq!(
            s,
            [
                (100, Fault::Restart),
                (150, Fault::Failover),
                (200, Fault::Restart)
            ]
        );
        assert!(schedule(0, 0, 10).is_empty());
    }
}
