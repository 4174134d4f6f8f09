//! The chaos run's network faults (`--net-faults N`): the ledgers, spot-core and the PostgreSQL
//! path in namespaces of their own (`crate::netns`), and N faults spread over the run, each on
//! one path (ledgers ↔ spot-core or ledgers ↔ PostgreSQL): answers dropped, a partition that
//! heals, resets, or a peer killed behind a blackhole. Each records how long the ledgers took to
//! hold no established connection to the peer any more (every one noticed dead), which must stay
//! within [`NOTICE_MAX`].

use std::fmt;
use std::net::{SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;

use super::cluster::{Cluster, NetPlace};
use crate::netns::forward::Forwarder;
use crate::netns::{Fault, Net, PathTo};

/// The longest the ledgers may take to notice that a path is dead: TCP_USER_TIMEOUT (10 s) or
/// keepalive's idle bound (8 s) by default, with room for a loaded machine.
pub const NOTICE_MAX: Duration = Duration::from_secs(30);

/// One injected fault and what it took to notice it.
#[derive(Debug, Clone)]
pub struct Detection {
    pub path: PathTo,
    pub fault: Fault,
    /// Connections established with the peer when the fault began.
    pub connections: usize,
    /// From the fault to no established connection left; `None`: not within the time held.
    pub noticed: Option<Duration>,
    /// How long the fault was held.
    pub held: Duration,
    /// The connections still established when the observation gave up (`ss`'s line for each:
    /// process, timers, TCP figures); empty when all were noticed.
    pub left: Vec<String>,
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {}: {} connections, ",
            self.fault.name(),
            self.path.name(),
            self.connections
        )?;
        match self.noticed {
            Some(t) => write!(f, "all noticed dead after {:.1} s", t.as_secs_f64())?,
            None => write!(f, "not all noticed")?,
        }
        write!(f, ", held {:.1} s", self.held.as_secs_f64())?;
        for socket in &self.left {
            write!(f, "\n    still established: {socket}")?;
        }
        Ok(())
    }
}

/// The namespaces and the forwarders of one run, kept to its end.
pub(super) struct NetRun {
    pub net: Arc<Net>,
    /// One per server of the database URL (a failover run has a primary and a standby).
    pub forwarders: Vec<Forwarder>,
}

/// Builds the namespaces and one PostgreSQL forwarder per server of `db_url` (one host, or the
/// comma-separated hosts of a failover pair); the ledgers' URL names the forwarders in the same
/// order, with the same database and parameters, so they still find the writable server.
pub(super) async fn start(db_url: &str) -> anyhow::Result<(NetRun, NetPlace)> {
    let net = Arc::new(tokio::task::spawn_blocking(Net::create).await??);
    let Some((scheme, rest)) = db_url.split_once("://") else {
        anyhow::bail!("database URL {db_url} has no scheme");
    };
    let (userinfo, rest) = rest.rsplit_once('@').unwrap_or(("", rest));
    let (hosts, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut forwarders = Vec::new();
    let mut listening = Vec::new();
    for hostport in hosts.split(',') {
        let upstream: SocketAddr = hostport
            .to_socket_addrs()
            .with_context(|| format!("resolve {hostport}"))?
            .next()
            .with_context(|| format!("{hostport} resolves to nothing"))?;
        let listen = SocketAddr::V4(SocketAddrV4::new(net.root_to_ledger, 0));
        let forwarder = Forwarder::start(listen, upstream).await?;
        let SocketAddr::V4(fwd) = forwarder.addr else {
            anyhow::bail!("the forwarder listens on {}", forwarder.addr);
        };
        listening.push(fwd);
        forwarders.push(forwarder);
    }
    net.set_peers(PathTo::Postgres, listening.clone());
    let at = if userinfo.is_empty() {
        String::new()
    } else {
        format!("{userinfo}@")
    };
    let hosts: Vec<String> = listening.iter().map(ToString::to_string).collect();
    let ledger_db_url = format!("{scheme}://{at}{}{tail}", hosts.join(","));
    let place = NetPlace {
        net: net.clone(),
        ledger_db_url,
    };
    Ok((NetRun { net, forwarders }, place))
}

/// Injects `n` faults, the k-th once k/(n+1) of the transfers have started, each drawn from
/// `kinds` (every path × fault when empty). Blocking: run it on a blocking thread.
pub(super) fn inject(
    run: &NetRun,
    cluster: &Cluster,
    kinds: &[(PathTo, Fault)],
    n: usize,
    progress: (&AtomicUsize, &AtomicBool, usize),
) -> anyhow::Result<Vec<Detection>> {
    let (next, done, transfers) = progress;
    let all: Vec<(PathTo, Fault)> = [PathTo::Spot, PathTo::Postgres]
        .into_iter()
        .flat_map(|p| Fault::ALL.into_iter().map(move |f| (p, f)))
        .collect();
    let kinds = if kinds.is_empty() { &all[..] } else { kinds };
    let mut detections = Vec::new();
    for k in 1..=n {
        let due = transfers * k / (n + 1);
        while next.load(Ordering::SeqCst) < due && !done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let (path, fault) = kinds[rand::rng().random_range(0..kinds.len())];
        detections.push(one(run, cluster, path, fault)?);
    }
    Ok(detections)
}

/// One fault: inject, wait until noticed (a partition for a random while instead), heal.
pub(super) fn one(
    run: &NetRun,
    cluster: &Cluster,
    path: PathTo,
    fault: Fault,
) -> anyhow::Result<Detection> {
    let net = &run.net;
    let connections = net.established(path)?;
    let since = Instant::now();
    net.inject(path, fault)?;
    let noticed = match (fault, path) {
        (Fault::Partition, _) => {
            // A PostgreSQL partition shorter than the TCP user timeout (10 s) is ridden out by
            // retransmission and leaves nothing for recovery: hold it past that bound.
            let range = match path {
                PathTo::Spot => 2_000..15_000,
                PathTo::Postgres => 12_000..16_000,
            };
            let hold = Duration::from_millis(rand::rng().random_range(range));
            let noticed = net.wait_noticed(path, since, hold)?;
            std::thread::sleep(hold.saturating_sub(since.elapsed()));
            noticed
        }
        (Fault::DeadPeer, PathTo::Spot) => {
            cluster.kill_spot_then(0, || net.wait_noticed(path, since, NOTICE_MAX))??
        }
        (Fault::DeadPeer, PathTo::Postgres) => {
            for forwarder in &run.forwarders {
                forwarder.kill();
            }
            net.wait_noticed(path, since, NOTICE_MAX)?
        }
        (Fault::DropAnswers | Fault::Reset, _) => {
            let noticed = net.wait_noticed(path, since, NOTICE_MAX)?;
            std::thread::sleep(Duration::from_millis(500));
            noticed
        }
    };
    let held = since.elapsed();
    let left = if noticed.is_none() && fault != Fault::Partition {
        net.established_detail(path)?
    } else {
        Vec::new()
    };
    net.heal(path)?;
    Ok(Detection {
        path,
        fault,
        connections,
        noticed,
        held,
        left,
    })
}

/// What is wrong with the detections: a fault held to be noticed that was not, within
/// [`NOTICE_MAX`].
pub(super) fn problems(detections: &[Detection]) -> Vec<String> {
    detections
        .iter()
        .filter(|d| d.fault != Fault::Partition)
        .filter(|d| d.noticed.is_none_or(|t| t > NOTICE_MAX))
        .map(|d| format!("network fault not noticed in time: {d}"))
        .collect()
}
