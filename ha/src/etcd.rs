//! One etcd cluster of three members on this machine (Debian's `etcd-server` 3.4), each a child
//! process with its own data dir and ports. It holds the leader keys: Patroni's (its `etcd3`
//! section) and spot-core's lease (`spot-core/src/replica/lease.rs`). A cluster of three keeps
//! answering with one member gone.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::proc::{free_port, Kid};

/// Where Debian installs etcd; `ETCD_BIN` overrides.
pub const DEFAULT_BIN: &str = "/usr/bin/etcd";

/// One member: its name, ports, data dir and process.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    pub kid: Kid,
}

impl Member {
    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// The cluster's members, started together; stopped (killed) on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    pub members: Vec<Member>,
    bin: PathBuf,
    initial_cluster: String,
}

/// The members' names and (client, peer) ports: those of `dir/ports.json` when the cluster was
/// made there before (a member's data holds its peers' URLs, so a restarted cluster must keep
/// its ports), else free ones, written there.
fn ports(dir: &Path, size: usize) -> anyhow::Result<Vec<(String, u16, u16)>> {
    let file = dir.join("ports.json");
    if let Ok(text) = std::fs::read_to_string(&file) {
        let specs: Vec<(String, u16, u16)> =
            serde_json::from_str(&text).with_context(|| format!("reading {}", file.display()))?;
        anyhow::ensure!(
            specs.len() == size,
            "{} names {} members",
            file.display(),
            specs.len()
        );
        return Ok(specs);
    }
    let mut specs = Vec::new();
    for i in 1..=size {
        specs.push((format!("etcd{i}"), free_port()?, free_port()?));
    }
    std::fs::write(&file, serde_json::to_vec(&specs)?)?;
    Ok(specs)
}

/// The etcd binary, or an error saying how to install it.
pub fn binary() -> anyhow::Result<PathBuf> {
    let bin = PathBuf::from(std::env::var("ETCD_BIN").unwrap_or_else(|_| DEFAULT_BIN.into()));
    anyhow::ensure!(
        bin.exists(),
        "no etcd at {} (set ETCD_BIN): `apt-get install -y etcd-server` installs it \
         (scripts/ensure-ha does)",
        bin.display()
    );
    Ok(bin)
}

impl EtcdCluster {
    /// Starts `size` members under `dir` (one data dir each; put it on tmpfs in tests) and
    /// waits until the cluster has a leader and answers writes.
    pub async fn start(dir: &Path, size: usize) -> anyhow::Result<EtcdCluster> {
        let bin = binary()?;
        std::fs::create_dir_all(dir)?;
        let specs = ports(dir, size)?;
        let initial_cluster = specs
            .iter()
            .map(|(name, _, peer)| format!("{name}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            bin,
            initial_cluster,
        };
        for (name, client_port, peer_port) in specs {
            let data_dir = dir.join(&name);
            std::fs::create_dir_all(&data_dir)?;
            let child = cluster.spawn(&name, client_port, peer_port, &data_dir, "new")?;
            cluster.members.push(Member {
                name: name.clone(),
                client_port,
                peer_port,
                data_dir,
                kid: Kid::new(name, child),
            });
        }
        cluster.wait_healthy(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    fn spawn(
        &self,
        name: &str,
        client_port: u16,
        peer_port: u16,
        data_dir: &Path,
        state: &str,
    ) -> anyhow::Result<std::process::Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.with_extension("log"))?;
        Command::new(&self.bin)
            .args(["--name", name])
            .arg("--data-dir")
            .arg(data_dir)
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &self.initial_cluster,
                "--initial-cluster-state",
                state,
                "--initial-cluster-token",
                "ledger-cell",
                // Elections in a second, not the default's seconds: a lost etcd member is noticed
                // quickly on a loaded 2-core machine, without flapping (10 heartbeats a timeout).
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
                "--logger",
                "zap",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting etcd member {name}"))
    }

    /// Every member's client URL, comma-separated (what Patroni's `etcd3.hosts` and
    /// spot-core's `--etcd` take).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client URLs, `http://...` each.
    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// SIGKILL member `i` (0-based); its data dir stays.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kid.kill();
    }

    /// Start member `i` again on its data dir (it rejoins the cluster it was in).
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let (name, client, peer, dir) = {
            let m = &self.members[i];
            (
                m.name.clone(),
                m.client_port,
                m.peer_port,
                m.data_dir.clone(),
            )
        };
        let child = self.spawn(&name, client, peer, &dir, "existing")?;
        self.members[i].kid.replace(child);
        Ok(())
    }

    /// Waits until a quorum answers a linearizable read through some member.
    pub async fn wait_healthy(&self, timeout: Duration) -> anyhow::Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + timeout;
        loop {
            for url in self.client_urls() {
                let ok = http
                    .post(format!("{url}/v3/kv/range"))
                    .json(&serde_json::json!({ "key": "aGVhbHRo" }))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!("the etcd cluster had no quorum within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three members answer; with one killed the other two still do; it rejoins.
    #[tokio::test]
    async fn three_members_keep_a_quorum_with_one_gone() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut cluster = EtcdCluster::start(dir.path(), 3)
            .await
            .expect("etcd starts");
        cluster.kill(0);
        cluster
            .wait_healthy(Duration::from_secs(10))
            .await
            .expect("two members of three answer");
        cluster.restart(0).expect("restart");
        cluster
            .wait_healthy(Duration::from_secs(10))
            .await
            .expect("answers again");
    }
}
