//! One cell under HA on this machine (`ledger up --ha`, the failover benchmark, the chaos run's
//! `--ha`): its etcd cluster of three, its PostgreSQL pair under Patroni and its three spot-core
//! replicas, every one a child process, and the supervisor's pass that starts again whatever
//! exited (a leader that stepped down, a killed agent) and writes `members.json`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::etcd::EtcdCluster;
use crate::patroni::{self, PatroniCluster};
use crate::spot::SpotReplicas;

/// How a cell is started.
#[derive(Debug, Clone)]
pub struct CellOptions {
    pub cell: u16,
    /// The spot-core binary.
    pub spot_bin: PathBuf,
    /// Added to each spot-core replica's environment (its token, storage sizes, asset file).
    pub spot_env: Vec<(String, String)>,
    /// Extra spot-core arguments (e.g. `--assets FILE`).
    pub spot_args: Vec<String>,
    pub patroni: patroni::Options,
}

/// The running processes of one cell.
#[derive(Debug)]
pub struct HaCell {
    pub cell: u16,
    pub dir: PathBuf,
    pub etcd: EtcdCluster,
    pub pg: PatroniCluster,
    pub spot: SpotReplicas,
}

/// One process of a cell, as `members.json` and `GET /api/v1/admin/cells` name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Member {
    pub cell: u16,
    /// `postgres`, `spot-core` or `etcd`.
    pub kind: String,
    pub name: String,
    /// `leader`, `standby`/`follower`, `member`, or `down`.
    pub role: String,
    pub address: String,
    pub data_dir: PathBuf,
    pub pid: Option<u32>,
    /// PostgreSQL: the node's Patroni REST URL; spot-core: its replication address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
}

impl HaCell {
    /// Starts etcd, then Patroni (waiting for a synchronous standby), then the three spot-core
    /// replicas, under `dir`.
    pub async fn start(dir: &Path, options: &CellOptions) -> anyhow::Result<HaCell> {
        std::fs::create_dir_all(dir)?;
        let etcd = EtcdCluster::start(&dir.join("etcd"), 3).await?;
        let pg = PatroniCluster::start(
            &etcd.endpoints(),
            &format!("ledger-cell{}", options.cell),
            &dir.join("pg"),
            options.patroni.clone(),
        )
        .await?;
        let env: Vec<(&str, &str)> = options
            .spot_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let spot = SpotReplicas::start_on(
            &options.spot_bin,
            &dir.join("spot"),
            &etcd.endpoints(),
            options.cell,
            &env,
            &options.spot_args,
            ["127.0.0.1"; 3],
        )?;
        Ok(HaCell {
            cell: options.cell,
            dir: dir.to_path_buf(),
            etcd,
            pg,
            spot,
        })
    }

    /// The cell's database URL (every node, with their Patroni REST URLs).
    pub fn database_url(&self, dbname: &str) -> String {
        self.pg.database_url(dbname)
    }

    /// The spot-core address the ledger uses: every replica's, comma-separated.
    pub fn spot_addrs(&self) -> String {
        self.spot.client_addrs()
    }

    /// A supervisor's pass: starts again every etcd member, Patroni agent and spot-core replica
    /// that exited. Returns what it started, by name.
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<String>> {
        let mut started = Vec::new();
        for i in 0..self.etcd.members.len() {
            if !self.etcd.members[i].kid.running() {
                self.etcd.restart(i)?;
                started.push(self.etcd.members[i].name.clone());
            }
        }
        for i in 0..self.pg.nodes.len() {
            if !self.pg.agent_running(i) {
                self.pg.restart_agent(i)?;
                started.push(format!("patroni {}", self.pg.nodes[i].name));
            }
        }
        for i in self.spot.restart_exited()? {
            started.push(format!("spot-core {}", self.spot.replicas[i].name));
        }
        Ok(started)
    }

    /// Every member with its role now (asked of Patroni's REST API and of each replica's
    /// `hello`).
    pub async fn members(&mut self) -> Vec<Member> {
        let mut out = Vec::new();
        for m in self.etcd.members.iter_mut() {
            let running = m.kid.running();
            out.push(Member {
                cell: self.cell,
                kind: "etcd".into(),
                name: m.name.clone(),
                role: if running { "member" } else { "down" }.into(),
                address: format!("127.0.0.1:{}", m.client_port),
                data_dir: m.data_dir.clone(),
                pid: m.kid.pid().filter(|_| running),
                control: None,
            });
        }
        let leader = self.pg.leader().await;
        for i in 0..self.pg.nodes.len() {
            let running = self.pg.agent_running(i);
            let node = &self.pg.nodes[i];
            let role = match (running, leader == Some(i)) {
                (_, true) => "leader",
                (true, false) => "standby",
                (false, false) => "down",
            };
            out.push(Member {
                cell: self.cell,
                kind: "postgres".into(),
                name: node.name.clone(),
                role: role.into(),
                address: format!("127.0.0.1:{}", node.pg_port),
                data_dir: node.data_dir(),
                pid: node.postmaster_pid(),
                control: Some(node.rest_url()),
            });
        }
        let token = self.spot.token().to_owned();
        for r in self.spot.replicas.iter_mut() {
            let running = r.kid.running();
            let role = if !running {
                "down"
            } else if crate::spot::answers_as_leader(&r.client, self.cell, &token).await {
                "leader"
            } else {
                "follower"
            };
            out.push(Member {
                cell: self.cell,
                kind: "spot-core".into(),
                name: r.name.clone(),
                role: role.into(),
                address: r.client.clone(),
                data_dir: r.data_dir.clone(),
                pid: r.kid.pid().filter(|_| running),
                control: Some(r.repl.clone()),
            });
        }
        out
    }
}

/// Writes `members` to `path` (through a temporary file renamed over it).
pub fn write_members(path: &Path, members: &[Member]) -> anyhow::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(members)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Runs the supervisor's pass every `every` for `cells`, writing `members.json` at `path` after
/// each, until the task is dropped.
pub async fn supervise(
    cells: std::sync::Arc<tokio::sync::Mutex<Vec<HaCell>>>,
    path: PathBuf,
    every: Duration,
) {
    loop {
        let mut all = Vec::new();
        {
            let mut cells = cells.lock().await;
            for cell in cells.iter_mut() {
                match cell.restart_exited() {
                    Ok(started) if !started.is_empty() => {
                        tracing::warn!(cell = cell.cell, ?started, "started again what had exited")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(cell = cell.cell, error = %format!("{e:#}"), "restart failed")
                    }
                }
                all.extend(cell.members().await);
            }
        }
        if let Err(e) = write_members(&path, &all) {
            tracing::warn!(error = %format!("{e:#}"), path = %path.display(), "writing members.json failed");
        }
        tokio::time::sleep(every).await;
    }
}
