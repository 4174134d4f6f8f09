//! A cell's PostgreSQL under Patroni (Debian's `patroni` 3.0.2, its `etcd3` section; etcd 3.4
//! has the v2 API off): one Patroni agent per node, each a child process run as the `postgres`
//! user (initdb and pg_ctl refuse root), each node with its own PostgreSQL port, REST port and
//! data dir. The first agent to take the leader key bootstraps with `initdb`; the others make
//! themselves standbys by base backup.
//!
//! Replication is synchronous and not strict (`synchronous_mode: true`,
//! `synchronous_mode_strict: false`): a commit waits for the synchronous standby while there is
//! one, and only that standby may be promoted; with no standby left the primary commits alone.
//! A failed-over old primary comes back as a standby by itself when its agent runs again
//! (`use_pg_rewind`, or a new base backup when the rewind fails).
//!
//! Timing: Patroni 3.2+ refuse a `ttl` under 20 s; 3.0.2 takes less, and the defaults here are
//! `ttl: 10`, `loop_wait: 2`, `retry_timeout: 3` (a lost leader is replaced 8-10 s after its last
//! key update; `ttl >= loop_wait + 2 * retry_timeout` holds).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::proc::{free_port, is_root, Kid};

/// Where Debian installs Patroni; `PATRONI_BIN` overrides.
pub const DEFAULT_BIN: &str = "/usr/bin/patroni";

/// Where Debian installs PostgreSQL 15's programs; `PG_BIN` overrides.
pub const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// How a cluster is made.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes (2: a primary and its synchronous standby).
    pub nodes: usize,
    /// PostgreSQL's `fsync` (off only in tests, on tmpfs).
    pub fsync: bool,
    /// Patroni's leader key lifetime, seconds.
    pub ttl: u32,
    /// Patroni's loop period, seconds.
    pub loop_wait: u32,
    /// Patroni's retry bound for the DCS and PostgreSQL, seconds.
    pub retry_timeout: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 2,
            fsync: true,
            ttl: 10,
            loop_wait: 2,
            retry_timeout: 3,
        }
    }
}

/// One node: its ports, its directory, its agent.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub pg_port: u16,
    pub rest_port: u16,
    /// The node's directory (config, log, pgpass); the data dir is `dir/data`.
    pub dir: PathBuf,
    agent: Kid,
}

impl Node {
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn rest_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.rest_port)
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("patroni.yml")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("patroni.log")
    }

    /// The postmaster's PID, read from `data/postmaster.pid`, when the file is there.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }
}

/// A change of leader seen by the cluster's watcher.
#[derive(Debug, Clone)]
pub struct LeaderChange {
    pub at: Instant,
    /// The node that led before (`None`: no leader was seen before).
    pub from: Option<usize>,
    pub to: usize,
}

/// The nodes of one Patroni cluster (one scope); every process is killed on drop.
#[derive(Debug)]
pub struct PatroniCluster {
    pub scope: String,
    pub nodes: Vec<Node>,
    bin: PathBuf,
    owner: Option<(u32, u32)>,
    history: Arc<Mutex<Vec<LeaderChange>>>,
    watcher: tokio::task::JoinHandle<()>,
}

/// The Patroni binary, or an error saying how to install it.
pub fn binary() -> anyhow::Result<PathBuf> {
    let bin = PathBuf::from(std::env::var("PATRONI_BIN").unwrap_or_else(|_| DEFAULT_BIN.into()));
    anyhow::ensure!(
        bin.exists(),
        "no patroni at {} (set PATRONI_BIN): `apt-get install -y patroni` installs it \
         (scripts/ensure-ha does)",
        bin.display()
    );
    Ok(bin)
}

fn pg_bin() -> anyhow::Result<PathBuf> {
    let bin = PathBuf::from(std::env::var("PG_BIN").unwrap_or_else(|_| DEFAULT_PG_BIN.into()));
    anyhow::ensure!(
        bin.join("initdb").exists(),
        "no PostgreSQL programs in {} (set PG_BIN)",
        bin.display()
    );
    Ok(bin)
}

/// The `postgres` user's uid and gid, when this process is root.
fn postgres_owner() -> anyhow::Result<Option<(u32, u32)>> {
    if !is_root() {
        return Ok(None);
    }
    let id = |flag: &str| -> anyhow::Result<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output()?;
        anyhow::ensure!(out.status.success(), "there is no `postgres` user");
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

fn chown(path: &Path, owner: Option<(u32, u32)>) -> anyhow::Result<()> {
    if let Some((uid, gid)) = owner {
        let status = Command::new("chown")
            .arg(format!("{uid}:{gid}"))
            .arg(path)
            .status()
            .context("run chown")?;
        anyhow::ensure!(status.success(), "chown {}: {status}", path.display());
    }
    Ok(())
}

/// SIGKILL one process by PID (a process of the cluster's: an agent or a postmaster).
fn sigkill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The PIDs whose parent is `pid` (a postmaster's backends and auxiliary processes).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let child: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        // `pid (comm) state ppid ...`: comm may hold spaces, so read after the last ')'.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == pid).then_some(child)
    })
    .collect()
}

/// `GET url` within `timeout`: the status and the JSON body, if any.
async fn get(http: &reqwest::Client, url: &str) -> Option<(u16, Value)> {
    let resp = http.get(url).send().await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    Some((status, body))
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("an HTTP client")
}

impl PatroniCluster {
    /// Writes one configuration per node under `dir` (which must be reachable by the
    /// `postgres` user: it is given to it), starts every agent against the etcd cluster at
    /// `etcd_endpoints` (`host:port,host:port,...`), and waits until there is a leader and a
    /// synchronous standby streaming from it.
    pub async fn start(
        etcd_endpoints: &str,
        scope: &str,
        dir: &Path,
        options: Options,
    ) -> anyhow::Result<PatroniCluster> {
        let bin = binary()?;
        let pg = pg_bin()?;
        let owner = postgres_owner()?;
        std::fs::create_dir_all(dir)?;
        chown(dir, owner)?;
        let mut nodes = Vec::new();
        for i in 0..options.nodes {
            let name = format!("node{i}");
            let node_dir = dir.join(&name);
            std::fs::create_dir_all(&node_dir)?;
            chown(&node_dir, owner)?;
            nodes.push(Node {
                name: name.clone(),
                pg_port: free_port()?,
                rest_port: free_port()?,
                dir: node_dir,
                agent: Kid::new(format!("patroni {scope}/{name}"), spawn_placeholder()?),
            });
        }
        for node in &nodes {
            let yaml = config(scope, node, etcd_endpoints, &pg, &options);
            std::fs::write(node.config_path(), yaml)?;
        }
        let history = Arc::new(Mutex::new(Vec::new()));
        let rest: Vec<String> = nodes.iter().map(Node::rest_url).collect();
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let watcher = tokio::spawn(watch_leader(rest, names, Arc::clone(&history)));
        let mut cluster = PatroniCluster {
            scope: scope.to_owned(),
            nodes,
            bin,
            owner,
            history,
            watcher,
        };
        for i in 0..cluster.nodes.len() {
            cluster.restart_agent(i)?;
        }
        cluster
            .wait_sync_standby(Duration::from_secs(120))
            .await
            .with_context(|| format!("the Patroni cluster did not form:\n{}", cluster.logs()))?;
        Ok(cluster)
    }

    /// The multi-host URL of `dbname` with the nodes' Patroni REST URLs in the same order
    /// (the `patroni` query parameter, which `schema` takes out before sqlx sees the URL:
    /// `schema/src/failover.rs`).
    pub fn database_url(&self, dbname: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        let rest: Vec<String> = self.nodes.iter().map(Node::rest_url).collect();
        format!(
            "postgres://postgres@{}/{dbname}?target_session_attrs=read-write&patroni={}",
            hosts.join(","),
            rest.join(",")
        )
    }

    /// `postgres://postgres@127.0.0.1:<port>/<dbname>` of node `i` alone.
    pub fn node_url(&self, i: usize, dbname: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{dbname}",
            self.nodes[i].pg_port
        )
    }

    /// The node whose Patroni answers 200 on `/primary` (the leader, running as primary).
    pub async fn leader(&self) -> Option<usize> {
        let http = http_client();
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some((200, _)) = get(&http, &format!("{}/primary", node.rest_url())).await {
                return Some(i);
            }
        }
        None
    }

    /// Waits until a leader answers on `/primary`, reports a synchronous standby streaming
    /// from it (its `/patroni` replication rows: PostgreSQL's view), and that standby is the
    /// one the DCS names (`/cluster`'s `sync_standby`: Patroni writes its `/sync` key only
    /// after PostgreSQL reports the standby synchronous, and promotes only the standby that key
    /// names); returns (leader, standby).
    pub async fn wait_sync_standby(&self, timeout: Duration) -> anyhow::Result<(usize, usize)> {
        let http = http_client();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader().await {
                let url = format!("{}/patroni", self.nodes[leader].rest_url());
                if let Some((200, body)) = get(&http, &url).await {
                    let standby = body["replication"].as_array().and_then(|rows| {
                        rows.iter().find_map(|r| {
                            let streaming = r["state"] == "streaming" && r["sync_state"] == "sync";
                            let name = r["application_name"].as_str()?;
                            let i = self.nodes.iter().position(|n| n.name == name)?;
                            streaming.then_some(i)
                        })
                    });
                    let named = get(&http, &format!("{}/cluster", self.nodes[leader].rest_url()))
                        .await
                        .and_then(|(_, body)| {
                            body["members"].as_array()?.iter().find_map(|m| {
                                let name = m["name"].as_str()?;
                                (m["role"] == "sync_standby")
                                    .then(|| self.nodes.iter().position(|n| n.name == name))?
                            })
                        });
                    if let Some(standby) = standby.filter(|s| named == Some(*s)) {
                        return Ok((leader, standby));
                    }
                }
            }
            if Instant::now() > deadline {
                bail!("no leader with a synchronous standby streaming within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until some node leads (answers 200 on `/primary`), up to `timeout`.
    pub async fn wait_leader(&self, timeout: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.leader().await {
                return Ok(i);
            }
            if Instant::now() > deadline {
                bail!("no Patroni leader within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The machine of node `i` lost at once: its agent, its postmaster and the postmaster's
    /// children SIGKILLed together.
    pub fn kill_machine(&mut self, i: usize) {
        let postmaster = self.nodes[i].postmaster_pid();
        self.nodes[i].agent.kill();
        if let Some(pid) = postmaster {
            let children = children_of(pid);
            sigkill(pid);
            for child in children {
                sigkill(child);
            }
        }
    }

    /// SIGKILL node `i`'s postmaster alone (its agent sees PostgreSQL crash).
    pub fn kill_postmaster(&mut self, i: usize) {
        if let Some(pid) = self.nodes[i].postmaster_pid() {
            sigkill(pid);
        }
    }

    /// SIGKILL node `i`'s agent alone (its PostgreSQL runs on, unmanaged).
    pub fn kill_agent(&mut self, i: usize) {
        self.nodes[i].agent.kill();
    }

    /// True while node `i`'s agent runs.
    pub fn agent_running(&mut self, i: usize) -> bool {
        self.nodes[i].agent.running()
    }

    /// Starts node `i`'s agent (again) on its configuration and data dir, as a supervisor
    /// would: a node that lost its leadership comes back as a standby (rewound if needed).
    pub fn restart_agent(&mut self, i: usize) -> anyhow::Result<()> {
        let node = &self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.log_path())?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg(node.config_path())
            .current_dir(&node.dir)
            .env("HOME", &node.dir)
            .env_remove("PGPASSFILE")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some((uid, gid)) = self.owner {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid).env("USER", "postgres");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting patroni for {}", node.name))?;
        self.nodes[i].agent.replace(child);
        Ok(())
    }

    /// The leader changes the watcher saw (polled every 100 ms), oldest first.
    pub fn history(&self) -> Vec<LeaderChange> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every node's Patroni (and PostgreSQL) log, for a failed test's message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(n.log_path()).unwrap_or_default();
                // Patroni's and PostgreSQL's own lines (they start with the date), not the
                // Python tracebacks under a warning.
                let tail: Vec<&str> = text
                    .lines()
                    .rev()
                    .filter(|l| l.starts_with("20"))
                    .take(80)
                    .collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {} ---\n{}\n", n.name, tail.join("\n"))
            })
            .collect()
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        self.watcher.abort();
        for i in 0..self.nodes.len() {
            self.kill_machine(i);
        }
    }
}

/// A child that has exited at once, so that every node has a `Kid` before its first start.
fn spawn_placeholder() -> anyhow::Result<std::process::Child> {
    Command::new("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("run true")
}

/// Polls the nodes' `/primary` and records each change of leader.
async fn watch_leader(
    rest: Vec<String>,
    names: Vec<String>,
    history: Arc<Mutex<Vec<LeaderChange>>>,
) {
    let http = http_client();
    let mut current: Option<usize> = None;
    loop {
        for (i, url) in rest.iter().enumerate() {
            if let Some((200, _)) = get(&http, &format!("{url}/primary")).await {
                if current != Some(i) {
                    tracing::info!(leader = %names[i], "Patroni leader seen");
                    history
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(LeaderChange {
                            at: Instant::now(),
                            from: current,
                            to: i,
                        });
                    current = Some(i);
                }
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One node's Patroni configuration.
// long: one Patroni YAML file, written out key by key.
fn config(scope: &str, node: &Node, etcd: &str, pg_bin: &Path, o: &Options) -> String {
    let hosts: String = etcd.split(',').map(|h| format!("\n    - {h}")).collect();
    let fsync = if o.fsync { "on" } else { "off" };
    let dir = node.dir.display();
    let data = node.data_dir();
    let data = data.display();
    format!(
        r#"scope: {scope}
namespace: /ledger/
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts:{hosts}
bootstrap:
  dcs:
    ttl: {ttl}
    loop_wait: {loop_wait}
    retry_timeout: {retry}
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        synchronous_commit: 'on'
        max_connections: 300
        wal_receiver_status_interval: 1s
  initdb:
    - encoding: UTF8
    - auth: trust
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: '{dir}'
    fsync: '{fsync}'
    shared_buffers: 32MB
    max_connections: 300
tags:
  nofailover: false
  noloadbalance: false
"#,
        name = node.name,
        rest = node.rest_port,
        ttl = o.ttl,
        loop_wait = o.loop_wait,
        retry = o.retry_timeout,
        port = node.pg_port,
        bin = pg_bin.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair forms with a synchronous standby; the leader's machine lost, the standby leads;
    /// the old node's agent started again, it comes back as the synchronous standby.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pair_fails_over_and_the_old_node_comes_back_as_standby() {
        let base = if Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm")
        } else {
            tempfile::tempdir()
        }
        .expect("a temporary directory");
        let etcd = crate::etcd::EtcdCluster::start(&base.path().join("etcd"), 3)
            .await
            .expect("etcd");
        let options = Options {
            fsync: false,
            ..Options::default()
        };
        let mut cluster = PatroniCluster::start(
            &etcd.endpoints(),
            "ha-unit",
            &base.path().join("pg"),
            options,
        )
        .await
        .expect("the pair forms");
        let (leader, standby) = cluster
            .wait_sync_standby(Duration::from_secs(5))
            .await
            .expect("a synchronous standby");
        let killed = Instant::now();
        cluster.kill_machine(leader);
        let new = cluster
            .wait_leader(Duration::from_secs(30))
            .await
            .expect("a new leader");
        assert_eq!(new, standby, "{}", cluster.logs());
        eprintln!(
            "promoted {:.1} s after the kill",
            killed.elapsed().as_secs_f64()
        );
        cluster.restart_agent(leader).expect("restart");
        let (l, s) = cluster
            .wait_sync_standby(Duration::from_secs(90))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
        assert_eq!((l, s), (standby, leader));
        // Its agent alone: the leader key expires, the standby is promoted; started again, the
        // old primary (still running, unmanaged) is demoted, rewound and follows.
        let (leader, standby) = (l, s);
        let killed = Instant::now();
        cluster.kill_agent(leader);
        let deadline = Instant::now() + Duration::from_secs(40);
        while cluster.leader().await != Some(standby) {
            assert!(
                Instant::now() < deadline,
                "no promotion\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "agent killed: promoted {:.1} s after the kill",
            killed.elapsed().as_secs_f64()
        );
        cluster.restart_agent(leader).expect("restart");
        let (l, s) = cluster
            .wait_sync_standby(Duration::from_secs(90))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
        assert_eq!((l, s), (standby, leader));
        let seen = cluster.history();
        assert!(seen.len() >= 3, "{seen:?}");
        assert_eq!(seen.last().map(|c| c.to), Some(standby));
    }
}
