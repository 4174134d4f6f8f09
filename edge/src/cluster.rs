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
//!
//! The parts: `views.rs` (the shapes answered), `describe.rs` (the view read now),
//! `patroni.rs` (a PostgreSQL member's Patroni), `record.rs` (the observations written into
//! `failovers`); this file holds `Cluster`, its members and the figures.

mod describe;
mod patroni;
mod record;
mod views;

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use application::reads::FailoverRecords;
use cells::{MemberKind, MemberSpec};
use schema::failover::{self, Servers};
use spot_core::client::{ReplicaAnswer, SpotClient};
use spot_core::protocol::CoreStatus;

use views::rfc3339;
pub use views::{
    CellHa, CellsView, FailoverView, HaFigures, Leaderless, MemberView, SpotFollower,
    SpotReplication,
};

/// How long one member may take to say its role.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(1);

/// How often the observations are written into `failovers`.
pub const RECORD_INTERVAL: Duration = Duration::from_secs(1);

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
}

#[cfg(test)]
mod tests {
    use super::patroni::{parse_http_json, parse_patroni_time, patroni_of, patroni_view};
    use super::*;
    use application::reads::{FailoverRecord, StoredFailover};
    use chrono::{DateTime, Utc};
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
