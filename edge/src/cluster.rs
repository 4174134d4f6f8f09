//! What operators see of a cell under HA (docs/adr/0020-high-availability.md): its members and
//! their roles now (`GET /api/v1/admin/cells`, the console's overview), the failovers this
//! process observed (recorded in the cell's `failovers`), and the figures `/metrics` pages on
//! (`ledger_pg_sync_standbys`, `ledger_spot_core_replicas_acknowledging`,
//! `ledger_failover_leaderless_seconds`).
//!
//! One [`Cluster`] per cell, built by start-up over the cell's database URL, its failover
//! records (`application::reads::FailoverRecords`, over the cell's pool) and spot-core client. Its members are the ones start-up gives ([`Cluster::set_members`]: a cell map's
//! `members`, `ledger up --ha`'s processes), else read from the URL's hosts (with their
//! `patroni` URLs) and the spot-core addresses. Each is asked its role when the view is read:
//! a PostgreSQL node its Patroni (`GET /patroni`), a spot-core replica its `hello`; the
//! replication lag is Patroni's (bytes between the leader's WAL position and the standby's,
//! seconds since the standby last replayed while behind) and spot-core leader's (`status` →
//! `replication`, records behind).
//!
//! Observations come from below: the pool's watcher (`schema::failover`, a move of primary and
//! "no primary found") and the spot-core client (a higher epoch from another replica, "no
//! replica answers as leader"). [`Cluster::record_failovers`] takes them every second and writes
//! them into the cell's `failovers`, keeping them while the database does not answer (it is
//! failing over when they happen).

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use application::reads::{FailoverRecord, FailoverRecords, StoredFailover};
use cells::{MemberKind, MemberSpec};
use chrono::{DateTime, Utc};
use schema::failover::{self, PatroniUrl, Servers};
use serde::Serialize;
use serde_json::Value;
use spot_core::client::{ReplicaAnswer, SpotClient};
use spot_core::protocol::{CoreStatus, ReplicationStatus, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use utoipa::ToSchema;

/// How long one member may take to say its role.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(1);

/// How often the observations are written into `failovers`.
pub const RECORD_INTERVAL: Duration = Duration::from_secs(1);

/// Most observations kept unwritten while the database does not answer.
const PENDING_MAX: usize = 1024;

/// One cell's HA view and observations. Cheap to share (`Arc`).
pub struct Cluster {
    database_url: Option<String>,
    records: Option<Arc<dyn FailoverRecords>>,
    spot: Option<SpotClient>,
    given: RwLock<Vec<MemberSpec>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("database_url", &self.database_url.as_ref().map(|_| "<set>"))
            .field("spot", &self.spot.as_ref().map(SpotClient::addr))
            .finish_non_exhaustive()
    }
}

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

impl Cluster {
    /// A cell start-up knows nothing of (an in-process test server): one member of each kind,
    /// no HA.
    pub fn none() -> Self {
        Self {
            database_url: None,
            records: None,
            spot: None,
            given: RwLock::new(Vec::new()),
        }
    }

    /// Over the cell's database (its URL, as the pool was made from it, and its failover
    /// records over that pool) and its spot-core client (`None`: a transport that is not TCP).
    pub fn new(
        database_url: &str,
        records: Arc<dyn FailoverRecords>,
        spot: Option<SpotClient>,
    ) -> Self {
        Self {
            database_url: Some(database_url.to_owned()),
            records: Some(records),
            spot,
            given: RwLock::new(Vec::new()),
        }
    }

    /// The members to show, instead of those read from the addresses (a cell map's `members`,
    /// `ledger up --ha`'s processes). An empty list goes back to the addresses.
    pub fn set_members(&self, members: Vec<MemberSpec>) {
        *self.given.write().unwrap_or_else(|e| e.into_inner()) = members;
    }

    fn servers(&self) -> Option<Arc<Servers>> {
        Servers::parse(self.database_url.as_deref()?).ok()
    }

    /// The database is under Patroni or over several hosts (a watcher follows its primary).
    pub fn pg_ha(&self) -> bool {
        self.servers()
            .is_some_and(|s| s.patroni.is_some() || s.options.len() > 1)
    }

    /// spot-core is replicated (several addresses).
    pub fn spot_replicated(&self) -> bool {
        self.spot.as_ref().is_some_and(SpotClient::replicated)
    }

    /// The members given, else those the addresses name.
    pub fn members(&self) -> Vec<MemberSpec> {
        let given = self.given.read().unwrap_or_else(|e| e.into_inner()).clone();
        if !given.is_empty() {
            return given;
        }
        let mut out = Vec::new();
        if let Some(servers) = self.servers() {
            for i in 0..servers.options.len() {
                let host = servers.host(i);
                out.push(MemberSpec {
                    kind: MemberKind::Postgres,
                    name: host.clone(),
                    address: host,
                    control: servers
                        .patroni
                        .as_ref()
                        .map(|p| format!("http://{}:{}", p[i].host, p[i].port)),
                });
            }
        }
        if let Some(spot) = &self.spot {
            for addr in spot.replicas() {
                out.push(MemberSpec {
                    kind: MemberKind::SpotCore,
                    name: addr.clone(),
                    address: addr.clone(),
                    control: None,
                });
            }
        }
        out
    }

    /// The name of the member of `kind` at `address`, else the address.
    fn name_of(&self, kind: MemberKind, address: &str) -> String {
        self.members()
            .into_iter()
            .find(|m| m.kind == kind && m.address == address)
            .map_or_else(|| address.to_owned(), |m| m.name)
    }

    /// The cell's view now: every member asked its role at once (each within
    /// [`MEMBER_TIMEOUT`]), the spot-core leader's replication, the last failover.
    pub async fn describe(&self, cell: u16) -> CellHa {
        let members = self.members();
        let pg: Vec<&MemberSpec> = members
            .iter()
            .filter(|m| m.kind == MemberKind::Postgres)
            .collect();
        let spot: Vec<&MemberSpec> = members
            .iter()
            .filter(|m| m.kind == MemberKind::SpotCore)
            .collect();
        let (pg_views, (spot_views, replication), last_failover) = tokio::join!(
            self.describe_postgres(&pg),
            self.describe_spot(&spot),
            self.last_failover()
        );
        CellHa {
            cell,
            ha: self.pg_ha() || self.spot_replicated(),
            members: pg_views.into_iter().chain(spot_views).collect(),
            spot_replication: replication,
            last_failover,
            leaderless: self.leaderless(),
        }
    }

    async fn describe_postgres(&self, members: &[&MemberSpec]) -> Vec<MemberView> {
        let asked = members.iter().map(|m| async move {
            match patroni_of(m, self.servers().as_deref()) {
                Some(url) => (*m, Some(get_patroni(&url).await)),
                None => (*m, None),
            }
        });
        let answers = futures_util::future::join_all(asked).await;
        // The leader's WAL position and its replication rows, for the standbys' lag and sync.
        let leader = answers.iter().find_map(|(_, a)| match a {
            Some(Ok(v)) if is_primary(v) => Some(v.clone()),
            _ => None,
        });
        let in_use = self
            .database_url
            .as_deref()
            .and_then(failover::primary_in_use);
        let single = members.len() == 1;
        let mut out = Vec::with_capacity(answers.len());
        for (m, answer) in answers {
            let mut view = MemberView::new(m);
            match answer {
                Some(Ok(v)) => patroni_view(&mut view, &v, leader.as_ref(), SystemTime::now()),
                Some(Err(e)) => {
                    view.role = "down".into();
                    view.error = Some(e);
                }
                None if single || in_use.as_deref() == Some(m.address.as_str()) => {
                    match self.db_writable().await {
                        Ok(true) => view.role = "leader".into(),
                        Ok(false) => view.role = "standby".into(),
                        Err(e) => {
                            view.role = "down".into();
                            view.error = Some(e);
                        }
                    }
                }
                None => {
                    view.role = "unknown".into();
                    view.error = Some("no Patroni URL for this node".into());
                }
            }
            out.push(view);
        }
        out
    }

    async fn db_writable(&self) -> Result<bool, String> {
        let Some(records) = &self.records else {
            return Err("no database".into());
        };
        let asked = records.writable();
        match tokio::time::timeout(MEMBER_TIMEOUT, asked).await {
            Ok(Ok(w)) => Ok(w),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer in time".into()),
        }
    }

    // long: one cell's spot-core members described from their hellos and the leader's status, read top to bottom.
    async fn describe_spot(
        &self,
        members: &[&MemberSpec],
    ) -> (Vec<MemberView>, Option<SpotReplication>) {
        let Some(spot) = &self.spot else {
            let views = members
                .iter()
                .map(|m| {
                    let mut v = MemberView::new(m);
                    v.role = "unknown".into();
                    v
                })
                .collect();
            return (views, None);
        };
        let asked = members.iter().map(|m| async move {
            if spot.replicated() {
                (*m, spot.probe_replica(&m.address, MEMBER_TIMEOUT).await)
            } else {
                // A single engine: its `ping` (through the client, with its token).
                let pinged = tokio::time::timeout(MEMBER_TIMEOUT, spot.call(&Request::Ping {}));
                let answer = match pinged.await {
                    Ok(Ok(_)) => ReplicaAnswer::Leader { epoch: 0 },
                    Ok(Err(e)) => ReplicaAnswer::Down {
                        error: e.to_string(),
                    },
                    Err(_) => ReplicaAnswer::Down {
                        error: "no answer in time".into(),
                    },
                };
                (*m, answer)
            }
        });
        let answers = futures_util::future::join_all(asked).await;
        let answering = answers
            .iter()
            .filter(|(_, a)| !matches!(a, ReplicaAnswer::Down { .. }))
            .count();
        let replication = if spot.replicated() {
            // At most the replicas that answer, as `/metrics` reports it (`replicas_answering`).
            leader_status(spot)
                .await
                .and_then(|c| c.replication)
                .map(|mut r| {
                    r.acknowledging = r
                        .acknowledging
                        .min(u32::try_from(answering).unwrap_or(u32::MAX));
                    r
                })
        } else {
            None
        };
        let views = answers
            .into_iter()
            .map(|(m, answer)| {
                let mut view = MemberView::new(m);
                match answer {
                    ReplicaAnswer::Leader { epoch } => {
                        view.role = "leader".into();
                        view.epoch = (epoch > 0).then_some(epoch);
                    }
                    ReplicaAnswer::Follower { .. } => {
                        view.role = "follower".into();
                        view.lag_records = replication.as_ref().and_then(|r| {
                            r.followers
                                .iter()
                                .find(|f| f.name == m.name || f.name == m.address)
                                .map(|f| f.lag)
                        });
                    }
                    ReplicaAnswer::Down { error } => {
                        view.role = "down".into();
                        view.error = Some(error);
                    }
                }
                view
            })
            .collect();
        (views, replication.map(SpotReplication::from))
    }

    /// The newest row of `failovers`; `None` when there is none or the database did not answer.
    pub async fn last_failover(&self) -> Option<FailoverView> {
        let asked = self.records.as_ref()?.last();
        match tokio::time::timeout(MEMBER_TIMEOUT, asked).await {
            Ok(Ok(row)) => row.map(FailoverView::from),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the last failover failed");
                None
            }
            Err(_) => None,
        }
    }

    /// What this process has no leader of now.
    pub fn leaderless(&self) -> Vec<Leaderless> {
        let now = SystemTime::now();
        self.leaderless_since()
            .into_iter()
            .filter_map(|(kind, since)| {
                let since = since?;
                Some(Leaderless {
                    kind: kind.to_owned(),
                    since: rfc3339(since),
                    seconds: now.duration_since(since).unwrap_or_default().as_secs_f64(),
                })
            })
            .collect()
    }

    /// Each kind this process follows a leader of, with since when it has none.
    fn leaderless_since(&self) -> Vec<(&'static str, Option<SystemTime>)> {
        let mut out = Vec::new();
        if let Some(url) = &self.database_url {
            if self.servers().is_some_and(|s| s.options.len() > 1) {
                out.push(("postgres", failover::leaderless_since(url)));
            }
        }
        if let Some(spot) = self.spot.as_ref().filter(|s| s.replicated()) {
            out.push(("spot-core", spot.leaderless_since()));
        }
        out
    }

    /// The figures of one scrape; `status` is the spot-core `status` the scrape already read
    /// (`None`: no answer).
    pub async fn figures(&self, status: Option<&CoreStatus>) -> HaFigures {
        let pg_sync_standbys = if self.pg_ha() {
            self.sync_standbys().await
        } else {
            None
        };
        let spot_acknowledging = match &self.spot {
            Some(spot) if spot.replicated() => {
                let leaders = status
                    .and_then(|c| c.replication.as_ref())
                    .map_or(0, |r| r.acknowledging);
                Some(leaders.min(self.replicas_answering(spot).await))
            }
            _ => None,
        };
        let now = SystemTime::now();
        let leaderless_seconds = self
            .leaderless_since()
            .into_iter()
            .map(|(kind, since)| {
                let seconds = since.map_or(0.0, |s| {
                    now.duration_since(s).unwrap_or_default().as_secs_f64()
                });
                (kind, seconds)
            })
            .collect();
        HaFigures {
            pg_sync_standbys,
            spot_acknowledging,
            leaderless_seconds,
        }
    }

    /// The replicas that answer their `hello` now (as leader or follower). The leader counts a
    /// follower by how far its acknowledgements are behind, so an idle cell would go on
    /// counting a killed follower until a batch's worth of records passed; one that does not
    /// answer at all is not counted here, whatever the leader says.
    async fn replicas_answering(&self, spot: &SpotClient) -> u32 {
        let asked = spot
            .replicas()
            .iter()
            .map(|addr| spot.probe_replica(addr, MEMBER_TIMEOUT));
        let answers = futures_util::future::join_all(asked).await;
        let alive = answers
            .iter()
            .filter(|a| !matches!(a, ReplicaAnswer::Down { .. }))
            .count();
        u32::try_from(alive).unwrap_or(u32::MAX)
    }

    /// The synchronous standbys the primary names (`pg_stat_replication`).
    async fn sync_standbys(&self) -> Option<i64> {
        let asked = self.records.as_ref()?.sync_standbys();
        tokio::time::timeout(MEMBER_TIMEOUT, asked).await.ok()?.ok()
    }

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
    fn new(m: &MemberSpec) -> Self {
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

fn rfc3339(at: SystemTime) -> String {
    DateTime::<Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The spot-core leader's `status` through the client (it goes to the leader).
async fn leader_status(spot: &SpotClient) -> Option<CoreStatus> {
    let asked = tokio::time::timeout(MEMBER_TIMEOUT, spot.call(&Request::Status {}));
    match asked.await {
        Ok(Ok(Response::Ok { core, .. })) => core,
        _ => None,
    }
}

/// A PostgreSQL member's Patroni: its `control`, else the URL's `patroni` for its host.
fn patroni_of(m: &MemberSpec, servers: Option<&Servers>) -> Option<PatroniUrl> {
    if let Some(control) = &m.control {
        return PatroniUrl::parse(control).ok();
    }
    let servers = servers?;
    let list = servers.patroni.as_ref()?;
    (0..servers.options.len())
        .find(|i| servers.host(*i) == m.address)
        .map(|i| list[i].clone())
}

/// Whether Patroni's `GET /patroni` answer is a running primary's.
fn is_primary(v: &Value) -> bool {
    matches!(v["role"].as_str(), Some("master" | "primary"))
}

/// Fills `view` from its Patroni's answer `v`, with the leader's answer for the lag.
fn patroni_view(view: &mut MemberView, v: &Value, leader: Option<&Value>, now: SystemTime) {
    view.state = v["state"].as_str().map(str::to_owned);
    if is_primary(v) {
        view.role = "leader".into();
        return;
    }
    view.role = match v["role"].as_str() {
        Some("replica" | "standby_leader") => "standby",
        Some("uninitialized") | None => "down",
        Some(_) => "standby",
    }
    .into();
    if view.state.as_deref() != Some("running") {
        view.error = view.state.clone().map(|s| format!("PostgreSQL is {s}"));
    }
    view.sync = Some(v["sync_standby"].as_bool().unwrap_or(false));
    if let Some(leader) = leader {
        // A standby the leader names as synchronous in its replication rows.
        let named_sync = leader["replication"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| {
                r["application_name"].as_str() == Some(view.name.as_str())
                    && matches!(r["sync_state"].as_str(), Some("sync" | "quorum"))
            });
        if named_sync {
            view.sync = Some(true);
        }
        let at = leader["xlog"]["location"].as_i64();
        let got = v["xlog"]["received_location"]
            .as_i64()
            .or_else(|| v["xlog"]["replayed_location"].as_i64());
        if let (Some(at), Some(got)) = (at, got) {
            let behind = (at - got).max(0);
            view.lag_bytes = Some(behind);
            let replayed = v["xlog"]["replayed_location"].as_i64().unwrap_or(got);
            view.lag_seconds = Some(if replayed >= at {
                0.0
            } else {
                v["xlog"]["replayed_timestamp"]
                    .as_str()
                    .and_then(parse_patroni_time)
                    .map_or(0.0, |t| {
                        now.duration_since(t).unwrap_or_default().as_secs_f64()
                    })
            });
        }
    }
}

/// Patroni's timestamps: `2024-05-01 10:00:00.123456+00:00` (PostgreSQL's text form).
fn parse_patroni_time(text: &str) -> Option<SystemTime> {
    let parsed = DateTime::parse_from_rfc3339(text)
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%:z"))
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .ok()?;
    Some(SystemTime::from(parsed.with_timezone(&Utc)))
}

/// `GET /patroni` of `url` as JSON, within [`MEMBER_TIMEOUT`]: HTTP/1.0 on a fresh connection,
/// read to its end (Patroni answers and closes).
async fn get_patroni(url: &PatroniUrl) -> Result<Value, String> {
    let asked = async {
        let mut stream = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|e| format!("Patroni at {}:{}: {e}", url.host, url.port))?;
        let request = format!(
            "GET /patroni HTTP/1.0\r\nHost: {}:{}\r\nUser-Agent: ledger\r\nAccept: application/json\r\n\r\n",
            url.host, url.port
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::with_capacity(2048);
        (&mut stream)
            .take(256 * 1024)
            .read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        parse_http_json(&answer)
    };
    tokio::time::timeout(MEMBER_TIMEOUT, asked)
        .await
        .map_err(|_| {
            format!(
                "Patroni at {}:{} did not answer in time",
                url.host, url.port
            )
        })?
}

/// The JSON body of an HTTP answer (any status: Patroni answers `/patroni` with 503 on a node
/// whose PostgreSQL is not running, with the same body).
fn parse_http_json(answer: &[u8]) -> Result<Value, String> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("an HTTP answer without a body")?;
    serde_json::from_slice(&answer[split + 4..]).map_err(|e| format!("Patroni's answer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(kind: MemberKind, name: &str) -> MemberSpec {
        MemberSpec {
            kind,
            name: name.into(),
            address: "127.0.0.1:1".into(),
            control: None,
        }
    }

    #[test]
    fn a_patroni_answer_says_role_state_sync_and_lag() {
        // Patroni 3.0.2's `GET /patroni`, a leader and its synchronous standby 4096 bytes behind.
        let leader = json!({"state": "running", "role": "master", "server_version": 150000,
            "xlog": {"location": 50_335_744},
            "replication": [{"usename": "replicator", "application_name": "pg2",
                "client_addr": "127.0.0.1", "state": "streaming", "sync_state": "sync",
                "sync_priority": 1}],
            "timeline": 2, "patroni": {"version": "3.0.2", "scope": "ledger-cell1"}});
        let standby = json!({"state": "running", "role": "replica",
            "xlog": {"received_location": 50_331_648, "replayed_location": 50_331_648,
                "replayed_timestamp": "2024-05-01 10:00:00.500000+00:00", "paused": false},
            "timeline": 2});
        let now = SystemTime::from(
            DateTime::parse_from_rfc3339("2024-05-01T10:00:02.5Z")
                .unwrap()
                .with_timezone(&Utc),
        );
        let mut l = MemberView::new(&spec(MemberKind::Postgres, "pg1"));
        patroni_view(&mut l, &leader, Some(&leader), now);
        assert_eq!(
            (l.role.as_str(), l.state.as_deref()),
            ("leader", Some("running"))
        );
        let mut s = MemberView::new(&spec(MemberKind::Postgres, "pg2"));
        patroni_view(&mut s, &standby, Some(&leader), now);
        assert_eq!(s.role, "standby");
        assert_eq!(s.sync, Some(true));
        assert_eq!(s.lag_bytes, Some(4096));
        assert_eq!(s.lag_seconds, Some(2.0));
        // Caught up: no seconds behind; without the leader's answer, no lag at all.
        let caught = json!({"state": "running", "role": "replica", "sync_standby": true,
            "xlog": {"received_location": 50_335_744, "replayed_location": 50_335_744,
                "replayed_timestamp": null}});
        let mut c = MemberView::new(&spec(MemberKind::Postgres, "x"));
        patroni_view(&mut c, &caught, Some(&leader), now);
        assert_eq!(
            (c.lag_bytes, c.lag_seconds, c.sync),
            (Some(0), Some(0.0), Some(true))
        );
        let mut alone = MemberView::new(&spec(MemberKind::Postgres, "x"));
        patroni_view(&mut alone, &caught, None, now);
        assert_eq!(alone.lag_bytes, None);
        // A stopped node.
        let stopped = json!({"state": "stopped", "role": "replica"});
        let mut d = MemberView::new(&spec(MemberKind::Postgres, "x"));
        patroni_view(&mut d, &stopped, Some(&leader), now);
        assert_eq!(d.error.as_deref(), Some("PostgreSQL is stopped"));
    }

    #[test]
    fn an_http_answer_body_is_read_whatever_its_status() {
        let ok = b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n\r\n{\"state\":\"stopped\",\"role\":\"replica\"}";
        assert_eq!(parse_http_json(ok).unwrap()["state"], "stopped");
        assert!(parse_http_json(b"HTTP/1.0 200 OK\r\n").is_err());
        assert!(parse_http_json(b"HTTP/1.0 200 OK\r\n\r\nnot json").is_err());
    }

    /// Failover records whose database never answers (these tests read no records).
    struct Unreachable;

    #[async_trait::async_trait]
    impl FailoverRecords for Unreachable {
        async fn writable(&self) -> Result<bool, application::StoreError> {
            Err(application::StoreError::msg("no database in this test"))
        }
        async fn sync_standbys(&self) -> Result<i64, application::StoreError> {
            Err(application::StoreError::msg("no database in this test"))
        }
        async fn last(&self) -> Result<Option<StoredFailover>, application::StoreError> {
            Err(application::StoreError::msg("no database in this test"))
        }
        async fn record(
            &self,
            _rows: &[FailoverRecord],
            _observed_by: &str,
        ) -> Result<(), application::StoreError> {
            Err(application::StoreError::msg("no database in this test"))
        }
    }

    #[tokio::test]
    async fn members_come_from_the_addresses_unless_given() {
        let url = "postgres://u@127.0.0.1:5433,127.0.0.1:5434/db?patroni=http://127.0.0.1:8008,http://127.0.0.1:8009";
        let spot = SpotClient::new(
            "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003".into(),
            Duration::from_secs(1),
        );
        let cluster = Cluster::new(url, Arc::new(Unreachable), Some(spot));
        assert!(cluster.pg_ha() && cluster.spot_replicated());
        let members = cluster.members();
        assert_eq!(members.len(), 5);
        assert_eq!(members[1].address, "127.0.0.1:5434");
        assert_eq!(members[1].control.as_deref(), Some("http://127.0.0.1:8009"));
        assert_eq!(members[4].name, "127.0.0.1:7003");
        let servers = cluster.servers();
        assert_eq!(
            patroni_of(&members[0], servers.as_deref()).unwrap().port,
            8008
        );
        cluster.set_members(vec![MemberSpec {
            kind: MemberKind::SpotCore,
            name: "r3".into(),
            address: "127.0.0.1:7003".into(),
            control: None,
        }]);
        assert_eq!(
            cluster.name_of(MemberKind::SpotCore, "127.0.0.1:7003"),
            "r3"
        );
        assert_eq!(
            cluster.name_of(MemberKind::SpotCore, "127.0.0.1:7001"),
            "127.0.0.1:7001"
        );
        // Without HA: neither.
        let plain = Cluster::none();
        assert!(!plain.pg_ha() && !plain.spot_replicated());
    }

    #[test]
    fn patroni_times_parse() {
        assert!(parse_patroni_time("2024-05-01 10:00:00.123456+00:00").is_some());
        assert!(parse_patroni_time("2024-05-01T10:00:00Z").is_some());
        assert!(parse_patroni_time("yesterday").is_none());
    }
}
