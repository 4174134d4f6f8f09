//! A cell's HA view as `Cluster::describe` reads it now: each PostgreSQL member's role from its
//! Patroni, each spot-core replica's from its `hello`, the leader's replication and the last
//! failover, every member asked at once within `MEMBER_TIMEOUT`.

use std::time::SystemTime;

use cells::{MemberKind, MemberSpec};
use schema::failover;
use spot_core::client::{ReplicaAnswer, SpotClient};
use spot_core::protocol::{CoreStatus, Request, Response};

use super::patroni::{get_patroni, is_primary, patroni_of, patroni_view};
use super::views::{CellHa, MemberView, SpotReplication};
use super::{Cluster, MEMBER_TIMEOUT};

impl Cluster {
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
}

/// The spot-core leader's `status` through the client (it goes to the leader).
async fn leader_status(spot: &SpotClient) -> Option<CoreStatus> {
    let asked = tokio::time::timeout(MEMBER_TIMEOUT, spot.call(&Request::Status {}));
    match asked.await {
        Ok(Ok(Response::Ok { core, .. })) => core,
        _ => None,
    }
}
