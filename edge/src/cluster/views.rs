//! The shapes of a cell's HA view (`GET /api/v1/admin/cells`, the console) and of the figures
//! `/metrics` pages on: what `Cluster` answers, serialized as the routes give them.

use std::time::SystemTime;

use application::reads::StoredFailover;
use cells::MemberSpec;
use chrono::{DateTime, Utc};
use serde::Serialize;
use spot_core::protocol::ReplicationStatus;
use utoipa::ToSchema;

/// `GET /api/v1/admin/cells`: every cell's members and roles, replication and last failover.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CellsView {
    pub cells: Vec<CellHa>,
    /// Under a cell map: whether a cell did not answer (it is then in `down_cells`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_cells: Option<Vec<u16>>,
}

/// One cell.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CellHa {
    pub cell: u16,
    /// Whether the cell runs under HA: its database URL names several hosts or Patroni, or its
    /// spot-core several replicas.
    pub ha: bool,
    pub members: Vec<MemberView>,
    /// The spot-core leader's view of its followers (a replicated cell whose leader answered).
    pub spot_replication: Option<SpotReplication>,
    /// The newest row of the cell's `failovers`.
    pub last_failover: Option<FailoverView>,
    /// What this process has no leader of now, and since when.
    pub leaderless: Vec<Leaderless>,
}

/// One member and its role now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MemberView {
    /// `postgres` or `spot-core`.
    pub kind: String,
    pub name: String,
    pub address: String,
    /// `leader`, `standby` (PostgreSQL), `follower` (spot-core), `down`, or `unknown` (a
    /// PostgreSQL node without a Patroni URL that the pool does not use).
    pub role: String,
    /// PostgreSQL: Patroni's `state` (`running`, `starting`, ...).
    pub state: Option<String>,
    /// PostgreSQL standby: whether Patroni names it the synchronous standby.
    pub sync: Option<bool>,
    /// spot-core leader: its epoch.
    pub epoch: Option<u64>,
    /// PostgreSQL standby: bytes of WAL it has not received from the leader.
    pub lag_bytes: Option<i64>,
    /// PostgreSQL standby: seconds since it last replayed, while it is behind (0 caught up).
    pub lag_seconds: Option<f64>,
    /// spot-core follower: records behind the leader.
    pub lag_records: Option<u64>,
    /// Why the role is `down` or `unknown`.
    pub error: Option<String>,
}

/// A replicated spot-core leader's `status` → `replication`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SpotReplication {
    pub epoch: u64,
    /// Replicas holding everything acknowledged (the leader included): 3 whole, 2 with no
    /// spare, below 2 no movement is acknowledged.
    pub acknowledging: u32,
    pub followers: Vec<SpotFollower>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SpotFollower {
    pub name: String,
    pub acked_seq: u64,
    /// Records behind the leader's last seq.
    pub lag: u64,
}

/// A row of `failovers`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FailoverView {
    /// RFC 3339, UTC.
    pub at: String,
    /// `postgres` or `spot-core`.
    pub kind: String,
    pub from_member: Option<String>,
    pub to_member: String,
    pub epoch: Option<i64>,
    pub cause: String,
    pub observed_by: String,
}

/// This process has found no leader of `kind` since `since`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Leaderless {
    pub kind: String,
    /// RFC 3339, UTC.
    pub since: String,
    pub seconds: f64,
}

/// What `/metrics` reports of HA.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HaFigures {
    /// `ledger_pg_sync_standbys`: only for a database under Patroni or over several hosts.
    pub pg_sync_standbys: Option<i64>,
    /// `ledger_spot_core_replicas_acknowledging`: only for a replicated cell; the leader's
    /// count, at most the replicas that answer a `hello` now (0 when no leader answered).
    pub spot_acknowledging: Option<u32>,
    /// `ledger_failover_leaderless_seconds{kind}`: each kind this process follows a leader of.
    pub leaderless_seconds: Vec<(&'static str, f64)>,
}

impl From<StoredFailover> for FailoverView {
    fn from(r: StoredFailover) -> Self {
        Self {
            at: r.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            kind: r.kind,
            from_member: r.from_member,
            to_member: r.to_member,
            epoch: r.epoch,
            cause: r.cause,
            observed_by: r.observed_by,
        }
    }
}

impl From<ReplicationStatus> for SpotReplication {
    fn from(r: ReplicationStatus) -> Self {
        Self {
            epoch: r.epoch,
            acknowledging: r.acknowledging,
            followers: r
                .followers
                .into_iter()
                .map(|f| SpotFollower {
                    name: f.name,
                    acked_seq: f.acked_seq,
                    lag: f.lag,
                })
                .collect(),
        }
    }
}

impl MemberView {
    pub(super) fn new(m: &MemberSpec) -> Self {
        Self {
            kind: m.kind.as_str().to_owned(),
            name: m.name.clone(),
            address: m.address.clone(),
            role: "unknown".into(),
            state: None,
            sync: None,
            epoch: None,
            lag_bytes: None,
            lag_seconds: None,
            lag_records: None,
            error: None,
        }
    }
}

pub(super) fn rfc3339(at: SystemTime) -> String {
    DateTime::<Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
