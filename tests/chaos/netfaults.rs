//! The chaos run's network faults (`--net-faults N`): the ledgers, spot-core and the PostgreSQL
//! path in namespaces of their own (`crate::netns`), and N faults spread over the run, each on
//! one path (ledgers ↔ spot-core or ledgers ↔ PostgreSQL): answers dropped, a partition that
//! heals, resets, or a peer killed behind a blackhole. Each records how long the ledgers took to
//! hold no established connection to the peer any more (every one noticed dead), which must stay
//! within [`NOTICE_MAX`]. With cells every cell's spot-core and database (through a forwarder of
//! its own) are paths of their own, and the k-th fault is cell (k mod N) + 1's, so each cell has
//! one when there are at least as many faults as cells; that is one cell over from the k-th
//! PostgreSQL restart (cell ((k - 1) mod N) + 1's), due at the same point when there are as many
//! of each, so a restart and a fault meet in two cells, never in one. What every cell committed
//! while one cell's path was cut is recorded with the fault (printed, not asserted).

use std::fmt;
use std::net::{SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;

use super::cluster::{Cluster, NetPlace};
use crate::netns::forward::Forwarder;
use crate::netns::{Fault, Net, PathTo, Target};

/// The longest the ledgers may take to notice that a path is dead: TCP_USER_TIMEOUT (10 s) or
/// keepalive's idle bound (8 s) by default, with room for a loaded machine.
pub const NOTICE_MAX: Duration = Duration::from_secs(30);

/// One injected fault and what it took to notice it.
#[derive(Debug, Clone)]
pub struct Detection {
    pub path: PathTo,
    /// The cell whose path it was (`None`: a run without cells).
    pub cell: Option<u16>,
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
    /// With cells: the transfers of each cell (in cell order) answered COMMITTED from the fault
    /// to its heal; empty without cells.
    pub committed_meanwhile: Vec<usize>,
}

impl Detection {
    /// The path of the cell the fault was put on.
    pub fn target(&self) -> Target {
        Target {
            path: self.path,
            cell: self.cell,
        }
    }
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {}: {} connections, ",
            self.fault.name(),
            self.target(),
            self.connections
        )?;
        match self.noticed {
            Some(t) => write!(f, "all noticed dead after {:.1} s", t.as_secs_f64())?,
            None => write!(f, "not all noticed")?,
        }
        write!(f, ", held {:.1} s", self.held.as_secs_f64())?;
        if !self.committed_meanwhile.is_empty() {
            let each: Vec<String> = self
                .committed_meanwhile
                .iter()
                .enumerate()
                .map(|(i, n)| format!("cell {} {n}", i + 1))
                .collect();
            write!(f, "; committed meanwhile: {}", each.join(", "))?;
        }
        for socket in &self.left {
            write!(f, "\n    still established: {socket}")?;
        }
        Ok(())
    }
}

/// The namespaces and the forwarders of one run, kept to its end.
pub(super) struct NetRun {
    pub net: Arc<Net>,
    /// Each cell's (in cell order; one without cells): one per server of its database URL (a
    /// failover run has a primary and a standby).
    pub forwarders: Vec<Vec<Forwarder>>,
}

/// Builds the namespaces and, for each cell's database URL (`dbs`: its cell, `None` without
/// cells, and its URL), one PostgreSQL forwarder per server of the URL (one host, or the
/// comma-separated hosts of a failover pair); the ledgers' URL names the forwarders in the same
/// order, with the same database and parameters, so they still find the writable server.
pub(super) async fn start(dbs: &[(Option<u16>, String)]) -> anyhow::Result<(NetRun, NetPlace)> {
    let net = Arc::new(tokio::task::spawn_blocking(Net::create).await??);
    let mut forwarders = Vec::new();
    let mut ledger_db_urls = Vec::new();
    for (cell, db_url) in dbs {
        let (cell_forwarders, listening, ledger_db_url) = forward(&net, db_url).await?;
        let path = Target {
            path: PathTo::Postgres,
            cell: *cell,
        };
        net.set_peers(path, listening);
        forwarders.push(cell_forwarders);
        ledger_db_urls.push(ledger_db_url);
    }
    let place = NetPlace {
        net: net.clone(),
        ledger_db_urls,
    };
    Ok((NetRun { net, forwarders }, place))
}

/// One forwarder per server of `db_url` on the root end of the ledgers' link: the forwarders,
/// their addresses, and the URL naming them instead of the servers.
async fn forward(
    net: &Net,
    db_url: &str,
) -> anyhow::Result<(Vec<Forwarder>, Vec<SocketAddrV4>, String)> {
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
    let at = if userinfo.is_empty() {
        String::new()
    } else {
        format!("{userinfo}@")
    };
    let hosts: Vec<String> = listening.iter().map(ToString::to_string).collect();
    let ledger_db_url = format!("{scheme}://{at}{}{tail}", hosts.join(","));
    Ok((forwarders, listening, ledger_db_url))
}

/// How far the run is: transfers handed to clients, whether the clients are done, the run's
/// transfers, and each cell's transfers answered COMMITTED so far (in cell order).
pub(super) struct Progress<'a> {
    pub next: &'a AtomicUsize,
    pub done: &'a AtomicBool,
    pub transfers: usize,
    pub committed: &'a [AtomicUsize],
}

impl Progress<'_> {
    fn committed(&self) -> Vec<usize> {
        self.committed
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .collect()
    }
}

/// Injects `n` faults, the k-th once k/(n+1) of the transfers have started, on the cell at
/// index k mod cells, each of a kind from `kinds` (every path × fault when empty) taken in
/// a shuffled order, round again when there are more faults than kinds (so no kind repeats
/// before every one was drawn). Blocking: run it on a blocking thread.
pub(super) fn inject(
    run: &NetRun,
    cluster: &Cluster,
    kinds: &[(PathTo, Fault)],
    n: usize,
    progress: &Progress<'_>,
) -> anyhow::Result<Vec<Detection>> {
    let all: Vec<(PathTo, Fault)> = [PathTo::Spot, PathTo::Postgres]
        .into_iter()
        .flat_map(|p| Fault::ALL.into_iter().map(move |f| (p, f)))
        .collect();
    let mut kinds = if kinds.is_empty() {
        all
    } else {
        kinds.to_vec()
    };
    rand::seq::SliceRandom::shuffle(&mut kinds[..], &mut rand::rng());
    let mut detections = Vec::new();
    for k in 1..=n {
        let due = progress.transfers * k / (n + 1);
        while progress.next.load(Ordering::SeqCst) < due && !progress.done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let (path, fault) = kinds[(k - 1) % kinds.len()];
        let index = k % cluster.spots.len();
        detections.push(one(run, cluster, (path, index), fault, progress)?);
    }
    Ok(detections)
}

/// One fault on `path` of the cell at `index`: inject, wait until noticed (a partition for a
/// random while instead), heal.
pub(super) fn one(
    run: &NetRun,
    cluster: &Cluster,
    (path, index): (PathTo, usize),
    fault: Fault,
    progress: &Progress<'_>,
) -> anyhow::Result<Detection> {
    let net = &run.net;
    let cell = cluster.spots[index].cell;
    let target = Target { path, cell };
    let connections = connected(net, target)?;
    let committed_before = progress.committed();
    let since = Instant::now();
    net.inject(target, fault)?;
    let noticed = match (fault, path) {
        (Fault::Partition, _) => {
            // A PostgreSQL partition shorter than the TCP user timeout (10 s) is ridden out by
            // retransmission and leaves nothing for recovery: hold it past that bound.
            let range = match path {
                PathTo::Spot => 2_000..15_000,
                PathTo::Postgres => 12_000..16_000,
            };
            let hold = Duration::from_millis(rand::rng().random_range(range));
            let noticed = net.wait_noticed(target, since, hold)?;
            std::thread::sleep(hold.saturating_sub(since.elapsed()));
            noticed
        }
        (Fault::DeadPeer, PathTo::Spot) => {
            cluster.kill_spot_then(index, || net.wait_noticed(target, since, NOTICE_MAX))??
        }
        (Fault::DeadPeer, PathTo::Postgres) => {
            for forwarder in &run.forwarders[index] {
                forwarder.kill();
            }
            net.wait_noticed(target, since, NOTICE_MAX)?
        }
        (Fault::DropAnswers | Fault::Reset, _) => {
            let noticed = net.wait_noticed(target, since, NOTICE_MAX)?;
            std::thread::sleep(Duration::from_millis(500));
            noticed
        }
    };
    let held = since.elapsed();
    let left = if noticed.is_none() && fault != Fault::Partition {
        net.established_detail(target)?
    } else {
        Vec::new()
    };
    net.heal(target)?;
    let committed_meanwhile = match cell {
        None => Vec::new(),
        Some(_) => progress
            .committed()
            .iter()
            .zip(committed_before)
            .map(|(after, before)| after - before)
            .collect(),
    };
    Ok(Detection {
        path,
        cell,
        fault,
        connections,
        noticed,
        held,
        left,
        committed_meanwhile,
    })
}

/// How long a fault waits for the ledgers to hold a connection on its path.
const CONNECTED_MAX: Duration = Duration::from_secs(5);

/// The connections the ledgers hold on `target`, waiting up to [`CONNECTED_MAX`] for one: a
/// fault on a path that holds none proves nothing, and a peer the killer just restarted (or a
/// ledger it just started) is connected to again within moments.
fn connected(net: &Net, target: Target) -> anyhow::Result<usize> {
    let since = Instant::now();
    loop {
        let n = net.established(target)?;
        if n > 0 || since.elapsed() > CONNECTED_MAX {
            return Ok(n);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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
