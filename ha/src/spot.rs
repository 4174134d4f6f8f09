//! A cell's three spot-core replicas (docs/adr/0020-high-availability.md §3), each a child
//! process with its own data dir, client port and replication port, leadership from the etcd
//! cluster's lease. The harness can kill a replica (SIGKILL: a machine lost), wipe its data dir
//! (a disk lost) and start it again on the same ports.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::proc::{free_port, wait_port, Kid};

/// One replica: its name, addresses, data dir and process.
#[derive(Debug)]
pub struct Replica {
    pub name: String,
    pub client: String,
    pub repl: String,
    pub data_dir: PathBuf,
    pub kid: Kid,
}

/// The three replicas of one cell.
#[derive(Debug)]
pub struct SpotReplicas {
    pub replicas: Vec<Replica>,
    bin: PathBuf,
    etcd: String,
    cell: u16,
    extra_env: Vec<(String, String)>,
    extra_args: Vec<String>,
}

/// True when the spot-core at `addr` answers a `hello` for `cell` as its leader.
pub async fn answers_as_leader(addr: &str, cell: u16, token: &str) -> bool {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut stream = tokio::io::BufReader::new(stream);
        let hello =
            serde_json::json!({"op": "hello", "token": token, "cell": cell}).to_string() + "\n";
        stream.get_mut().write_all(hello.as_bytes()).await.ok()?;
        let mut line = String::new();
        stream.read_line(&mut line).await.ok()?;
        Some(line.contains("\"role\":\"leader\""))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

impl SpotReplicas {
    /// Starts three replicas of `cell` under `dir` with the spot-core binary `bin`, the etcd
    /// endpoints `etcd` (`host:port,...`), and `env` added to each process's environment (the
    /// token, storage sizes). Waits until each listens.
    pub fn start(
        bin: &Path,
        dir: &Path,
        etcd: &str,
        cell: u16,
        env: &[(&str, &str)],
    ) -> anyhow::Result<SpotReplicas> {
        SpotReplicas::start_on(bin, dir, etcd, cell, env, &[], ["127.0.0.1"; 3])
    }

    /// `start`, with `args` added to each replica's command line and replica `i` on the loopback
    /// address `hosts[i]` (each its own, e.g. 127.0.0.11-13, so that nftables can cut one replica off from the others while a client on
    /// 127.0.0.1 still reaches it: the replicas connect to each other from their own address).
    pub fn start_on(
        bin: &Path,
        dir: &Path,
        etcd: &str,
        cell: u16,
        env: &[(&str, &str)],
        args: &[String],
        hosts: [&str; 3],
    ) -> anyhow::Result<SpotReplicas> {
        let mut specs = Vec::new();
        for (i, host) in hosts.iter().enumerate() {
            specs.push((
                format!("r{}", i + 1),
                format!("{host}:{}", free_port()?),
                format!("{host}:{}", free_port()?),
            ));
        }
        let mut set = SpotReplicas {
            replicas: Vec::new(),
            bin: bin.to_path_buf(),
            etcd: etcd.to_owned(),
            cell,
            extra_env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            extra_args: args.to_vec(),
        };
        for (name, client, repl) in &specs {
            let data_dir = dir.join(name);
            let replica = Replica {
                name: name.clone(),
                client: client.clone(),
                repl: repl.clone(),
                data_dir,
                kid: Kid::new(name.clone(), set.placeholder()?),
            };
            set.replicas.push(replica);
        }
        for i in 0..3 {
            set.restart(i)?;
        }
        Ok(set)
    }

    /// A child that has already exited, so `restart` has something to replace.
    fn placeholder(&self) -> anyhow::Result<std::process::Child> {
        Ok(Command::new("true").spawn()?)
    }

    /// `name=repl` of the replicas other than `i`.
    fn peers_of(&self, i: usize) -> String {
        self.replicas
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, r)| format!("{}={}", r.name, r.repl))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every replica's client address, comma-separated: what the ledger's spot-core address
    /// is for a replicated cell.
    pub fn client_addrs(&self) -> String {
        self.replicas
            .iter()
            .map(|r| r.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The token the replicas were given (`SPOT_CORE_TOKEN` in their environment), or empty.
    pub fn token(&self) -> &str {
        self.extra_env
            .iter()
            .find(|(k, _)| k == "SPOT_CORE_TOKEN")
            .map_or("", |(_, v)| v.as_str())
    }

    /// The replica answering as the leader, if one does.
    pub async fn leader(&self) -> Option<usize> {
        for (i, r) in self.replicas.iter().enumerate() {
            if answers_as_leader(&r.client, self.cell, self.token()).await {
                return Some(i);
            }
        }
        None
    }

    /// SIGKILL replica `i` (a machine lost).
    pub fn kill(&mut self, i: usize) {
        self.replicas[i].kid.kill();
    }

    /// Deletes replica `i`'s data dir (a disk lost); kill it first.
    pub fn wipe(&mut self, i: usize) -> anyhow::Result<()> {
        let dir = &self.replicas[i].data_dir;
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("wiping {}", dir.display()))?;
        }
        Ok(())
    }

    /// Starts replica `i` (again) on its data dir and ports; waits until it listens.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let peers = self.peers_of(i);
        let r = &self.replicas[i];
        std::fs::create_dir_all(r.data_dir.parent().unwrap_or(Path::new(".")))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(r.data_dir.with_extension("log"))?;
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--listen", &r.client])
            .arg("--data-dir")
            .arg(&r.data_dir)
            .args(["--replica", &r.name, "--repl-listen", &r.repl])
            .args(["--peers", &peers, "--etcd", &self.etcd])
            .args(["--cell-id", &self.cell.to_string()])
            .arg("--exit-with-stdin")
            .args(&self.extra_args)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting spot-core replica {}", r.name))?;
        let client = r.client.clone();
        self.replicas[i].kid.replace(child);
        wait_port(&client, Duration::from_secs(60))
    }

    /// Restarts every replica that has exited (a supervisor's pass: a leader that stepped down
    /// aborts and comes back as a follower).
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<usize>> {
        let mut restarted = Vec::new();
        for i in 0..self.replicas.len() {
            if !self.replicas[i].kid.running() {
                self.restart(i)?;
                restarted.push(i);
            }
        }
        Ok(restarted)
    }
}
