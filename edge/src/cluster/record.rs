//! The failovers this process observes (the pool watcher's moves of primary, the spot-core
//! client's leader changes), written into the cell's `failovers` every `RECORD_INTERVAL` and
//! kept while the database does not answer.

use std::sync::Arc;
use std::time::Duration;

use application::reads::{FailoverRecord, FailoverRecords};
use cells::MemberKind;
use schema::failover;

use super::{Cluster, RECORD_INTERVAL};

/// Most observations kept unwritten while the database does not answer.
const PENDING_MAX: usize = 1024;

impl Cluster {
    /// Writes every leader change this process observes into the cell's `failovers`, every
    /// [`RECORD_INTERVAL`], keeping what could not be written for the next time. Runs until
    /// dropped.
    pub async fn record_failovers(self: Arc<Self>) {
        let observed_by = observer_name();
        let mut pending: Vec<FailoverRecord> = Vec::new();
        loop {
            tokio::time::sleep(RECORD_INTERVAL).await;
            pending.extend(self.take_observations());
            if pending.len() > PENDING_MAX {
                let excess = pending.len() - PENDING_MAX;
                pending.drain(..excess);
            }
            if pending.is_empty() {
                continue;
            }
            let Some(records) = &self.records else {
                pending.clear();
                continue;
            };
            match insert_failovers(&**records, &pending, &observed_by).await {
                Ok(()) => {
                    for f in &pending {
                        tracing::warn!(kind = f.kind, from = ?f.from, to = %f.to, epoch = ?f.epoch,
                            cause = %f.cause, "failover recorded");
                    }
                    pending.clear();
                }
                Err(e) => {
                    tracing::warn!(error = %e, pending = pending.len(),
                        "failovers not recorded yet (the database does not answer); kept for the next try")
                }
            }
        }
    }

    fn take_observations(&self) -> Vec<FailoverRecord> {
        let mut out = Vec::new();
        if let Some(url) = &self.database_url {
            for m in failover::take_moves(url) {
                out.push(FailoverRecord {
                    at: m.at,
                    kind: MemberKind::Postgres.as_str(),
                    from: m.from.map(|f| self.name_of(MemberKind::Postgres, &f)),
                    to: self.name_of(MemberKind::Postgres, &m.to),
                    epoch: None,
                    cause: m.cause,
                });
            }
        }
        if let Some(spot) = &self.spot {
            for c in spot.take_leader_changes() {
                let from = c.from.map(|f| self.name_of(MemberKind::SpotCore, &f));
                let to = self.name_of(MemberKind::SpotCore, &c.to);
                let cause = match &from {
                    Some(f) if *f == to => {
                        format!("{to} leads again, at a higher epoch {}", c.epoch)
                    }
                    Some(f) => format!(
                        "{f} no longer answered as the leader; {to} answered as the leader of epoch {}",
                        c.epoch
                    ),
                    None => format!("{to} answered as the leader of epoch {}", c.epoch),
                };
                out.push(FailoverRecord {
                    at: c.at,
                    kind: MemberKind::SpotCore.as_str(),
                    from,
                    to,
                    epoch: Some(c.epoch),
                    cause,
                });
            }
        }
        out
    }
}

/// Writes `rows` in one transaction, giving up after 5 s (the database may be failing over).
async fn insert_failovers(
    records: &dyn FailoverRecords,
    rows: &[FailoverRecord],
    observed_by: &str,
) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(5), records.record(rows, observed_by)).await {
        Ok(written) => written.map_err(|e| e.to_string()),
        Err(_) => Err("no answer in time".into()),
    }
}

/// `ledger <pid>@<host>`.
fn observer_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    format!("ledger {}@{host}", std::process::id())
}
