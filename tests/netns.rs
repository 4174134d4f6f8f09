//! Network namespaces and nftables faults for the network-fault tests and the chaos run's
//! `--net-faults`. The topology, made with `ip netns` and veth pairs (root, that is
//! `CAP_NET_ADMIN` and `CAP_SYS_ADMIN`, is needed; without it [`Net::create`] fails and says
//! why):
//!
//! ```text
//!   root namespace (test process, PostgreSQL on 127.0.0.1, the forwarder)
//!     │ veth a: 10.B.C.1 ── 10.B.C.2                │ veth b: 10.B.C.5 ── 10.B.C.6
//!     ▼                                              ▼
//!   ledger namespace (every `ledger serve`) ── veth c: 10.B.C.9 ── 10.B.C.10 ── spot namespace
//! ```
//!
//! The ledgers reach spot-core over veth c and PostgreSQL through a userspace forwarder on the
//! root end of veth a (`forward.rs`); the test process reaches the ledgers over veth a and
//! spot-core over veth b. Faults are nftables rules in the ledger namespace matching one path
//! (peer address and port), so the test's own traffic is never touched. With cells (the chaos
//! run's `--cells N`) every cell's spot-core listens in the one spot namespace on a port of its
//! own and every cell's database has a forwarder of its own, so each cell's two paths are
//! [`Target`]s of their own: a fault cuts one cell's path and no other.

pub mod forward;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A fault on one path between the ledgers and a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// The peer's packets are dropped: requests arrive and are applied, answers are lost.
    DropAnswers,
    /// Both ways dropped until healed.
    Partition,
    /// Every packet either way is refused with a TCP reset, which reaches its sender: both
    /// ends see their connection reset at their next segment.
    Reset,
    /// Both ways dropped and the peer killed behind the blackhole: the ledgers' sockets stay
    /// half-open until they notice by themselves.
    DeadPeer,
}

impl Fault {
    pub const ALL: [Fault; 4] = [
        Fault::DropAnswers,
        Fault::Partition,
        Fault::Reset,
        Fault::DeadPeer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::DropAnswers => "drop-answers",
            Fault::Partition => "partition",
            Fault::Reset => "reset",
            Fault::DeadPeer => "dead-peer",
        }
    }
}

/// The two paths a fault can cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathTo {
    Spot,
    Postgres,
}

impl PathTo {
    pub fn name(self) -> &'static str {
        match self {
            PathTo::Spot => "spot-core",
            PathTo::Postgres => "PostgreSQL",
        }
    }
}

/// One path of one cell: what a fault is put on. `cell` is `None` in a run without cells (no
/// map); a [`PathTo`] alone is that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    pub path: PathTo,
    pub cell: Option<u16>,
}

impl From<PathTo> for Target {
    fn from(path: PathTo) -> Self {
        Target { path, cell: None }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cell {
            None => f.write_str(self.path.name()),
            Some(c) => write!(f, "{} of cell {c}", self.path.name()),
        }
    }
}

/// The namespaces and links of one run; deleted when dropped.
pub struct Net {
    pub ledger_ns: String,
    pub spot_ns: String,
    /// The root end of veth a: the forwarder listens here; the ledgers' HTTP clients come from it.
    pub root_to_ledger: Ipv4Addr,
    /// The ledgers' address on veth a (they listen here for HTTP).
    pub ledger_ip: Ipv4Addr,
    /// spot-core's address as the test process reaches it (veth b).
    pub spot_ip_from_root: Ipv4Addr,
    /// spot-core's address as the ledgers reach it (veth c).
    pub spot_ip_from_ledger: Ipv4Addr,
    /// The peer addresses of each path (of each cell), as the ledgers see them; set once the
    /// peers listen. PostgreSQL has one per server of the database URL (a primary and its
    /// standby).
    peers: Mutex<BTreeMap<Target, Vec<SocketAddrV4>>>,
    /// The faults in force, by path (of a cell).
    active: Mutex<BTreeMap<Target, Fault>>,
}

/// Runs a command; its failure is an error that says what ran and what it printed.
fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("ip").args(args))
}

/// Why this process cannot build namespaces, if it cannot.
fn missing_capability() -> Option<String> {
    let uid = run(Command::new("id").arg("-u")).unwrap_or_default();
    if uid.trim() != "0" {
        return Some(format!(
            "the network-fault harness needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN: `ip netns`, \
             veth pairs into the root namespace, nftables); this process runs as uid {}",
            uid.trim()
        ));
    }
    for tool in ["ip", "nft", "ss"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!(
                "`{tool}` is not installed (apt-get install -y iproute2 nftables; scripts/test \
                 installs them)"
            ));
        }
    }
    None
}

/// A subnet 10.B.C.0/28 no interface of the machine uses.
fn free_subnet() -> anyhow::Result<(u8, u8)> {
    let used = ip(&["-4", "-o", "addr", "show"])?;
    for _ in 0..100 {
        let (b, c) = {
            use rand::Rng;
            let mut rng = rand::rng();
            (rng.random_range(64..=250u8), rng.random_range(0..16u8) * 16)
        };
        if !used.contains(&format!(" 10.{b}.{c}.")) {
            return Ok((b, c));
        }
    }
    bail!("no free 10.x.y.0/28 subnet found")
}

/// Namespaces left by runs whose process is gone (a killed test cannot clean up).
fn remove_leftovers() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix("nf")
            .and_then(|r| r.split('n').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Net {
    /// Builds the namespaces and links, with the ledger namespace's empty fault table.
    pub fn create() -> anyhow::Result<Net> {
        if let Some(why) = missing_capability() {
            bail!("cannot build the network namespaces: {why}");
        }
        remove_leftovers();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let (pid, k) = (std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let tag = format!("{:x}{k}", rand::random::<u16>());
        let (b, c) = free_subnet()?;
        let at = |last: u8| Ipv4Addr::new(10, b, c, last);
        let net = Net {
            ledger_ns: format!("nf{pid}n{k}l"),
            spot_ns: format!("nf{pid}n{k}s"),
            root_to_ledger: at(1),
            ledger_ip: at(2),
            spot_ip_from_root: at(6),
            spot_ip_from_ledger: at(10),
            peers: Mutex::default(),
            active: Mutex::default(),
        };
        net.build(&tag, at)
            .context("cannot build the network namespaces")?;
        Ok(net)
    }

    fn build(&self, tag: &str, at: impl Fn(u8) -> Ipv4Addr) -> anyhow::Result<()> {
        let (l, s) = (self.ledger_ns.as_str(), self.spot_ns.as_str());
        ip(&["netns", "add", l])?;
        ip(&["netns", "add", s])?;
        for ns in [l, s] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        // (namespace of end 0 or None for root, end 0's address, namespace of end 1, address)
        let links = [
            ("a", None, at(1), l, at(2)),
            ("b", None, at(5), s, at(6)),
            ("c", Some(l), at(9), s, at(10)),
        ];
        for (name, ns0, ip0, ns1, ip1) in links {
            let (if0, if1) = (format!("nf{tag}{name}0"), format!("nf{tag}{name}1"));
            let mut add = vec![];
            if let Some(ns0) = ns0 {
                add.extend(["-n", ns0]);
            }
            add.extend([
                "link",
                "add",
                if0.as_str(),
                "type",
                "veth",
                "peer",
                "name",
                if1.as_str(),
            ]);
            add.extend(["netns", ns1]);
            ip(&add)?;
            let (cidr0, cidr1) = (format!("{ip0}/30"), format!("{ip1}/30"));
            let ns0 = ns0.map_or(vec![], |n| vec!["-n", n]);
            ip(&[
                &ns0[..],
                &["addr", "add", cidr0.as_str(), "dev", if0.as_str()],
            ]
            .concat())?;
            ip(&[&ns0[..], &["link", "set", if0.as_str(), "up"]].concat())?;
            ip(&[
                "-n",
                ns1,
                "addr",
                "add",
                cidr1.as_str(),
                "dev",
                if1.as_str(),
            ])?;
            ip(&["-n", ns1, "link", "set", if1.as_str(), "up"])?;
        }
        self.nft(
            "table inet netfault {\n\
               chain input { type filter hook input priority 0; policy accept; }\n\
               chain output { type filter hook output priority 0; policy accept; }\n\
             }\n",
        )
    }

    /// A TCP connection to `to` made from inside the ledger namespace, as a ledger's would be
    /// (on a thread of its own that enters the namespace; the socket stays in it). For checking
    /// what a fault does to real sockets.
    pub fn connect_from_ledger_ns(&self, to: SocketAddr) -> anyhow::Result<std::net::TcpStream> {
        let ns = format!("/run/netns/{}", self.ledger_ns);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&ns).with_context(|| format!("open {ns}"))?;
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&file),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .with_context(|| format!("enter {ns}"))?;
            std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5))
                .with_context(|| format!("connect to {to} from {ns}"))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the connecting thread panicked"))?
    }

    /// Runs `program` inside namespace `ns`.
    pub fn command(&self, ns: &str, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }

    /// Loads an nftables script into the ledger namespace.
    fn nft(&self, script: &str) -> anyhow::Result<()> {
        let path = std::env::temp_dir().join(format!("{}.nft", self.ledger_ns));
        std::fs::write(&path, script)?;
        let loaded = run(Command::new("ip")
            .args(["netns", "exec", &self.ledger_ns, "nft", "-f"])
            .arg(&path));
        let _ = std::fs::remove_file(&path);
        loaded.map(drop)
    }

    /// Names the peer of a path (its address and port as the ledgers reach it).
    pub fn set_peer(&self, path: impl Into<Target>, peer: SocketAddrV4) {
        self.set_peers(path, vec![peer]);
    }

    /// Names every peer of a path: a fault on the path is put on each of them.
    pub fn set_peers(&self, path: impl Into<Target>, peers: Vec<SocketAddrV4>) {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.into(), peers);
    }

    pub fn peers(&self, path: impl Into<Target>) -> anyhow::Result<Vec<SocketAddrV4>> {
        let path = path.into();
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers
            .get(&path)
            .filter(|p| !p.is_empty())
            .cloned()
            .with_context(|| format!("no peer set for {path}"))
    }

    /// Puts `fault` on `path` (replacing any fault already there).
    pub fn inject(&self, path: impl Into<Target>, fault: Fault) -> anyhow::Result<()> {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        active.insert(path.into(), fault);
        self.load(&active)
    }

    /// Removes the fault on `path`.
    pub fn heal(&self, path: impl Into<Target>) -> anyhow::Result<()> {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        active.remove(&path.into());
        self.load(&active)
    }

    /// Replaces the rule set with one for `active`.
    fn load(&self, active: &BTreeMap<Target, Fault>) -> anyhow::Result<()> {
        let mut script =
            String::from("flush chain inet netfault input\nflush chain inet netfault output\n");
        for (&path, &fault) in active {
            for peer in self.peers(path)? {
                script.push_str(&Self::rules(peer, fault));
            }
        }
        self.nft(&script)
    }

    /// The rules that put `fault` on the connections with `peer`.
    fn rules(peer: SocketAddrV4, fault: Fault) -> String {
        let (addr, port) = (peer.ip(), peer.port());
        let to = format!("ip daddr {addr} tcp dport {port}");
        let from = format!("ip saddr {addr} tcp sport {port}");
        let (input, output) = match fault {
            Fault::DropAnswers => (Some("drop"), None),
            Fault::Partition | Fault::DeadPeer => (Some("drop"), Some("drop")),
            Fault::Reset => (Some("reject with tcp reset"), Some("reject with tcp reset")),
        };
        let mut script = String::new();
        if fault == Fault::Reset {
            // The reset a rejection sends back is itself a packet of the path: the one for the
            // ledger's segment comes from the peer's address and port, the one for the peer's
            // segment goes to it. Without these two rules the reject rules drop them too (no
            // reset answers a reset), and a "reset" is only a partition: neither end ever sees
            // one.
            script.push_str(&format!(
                "add rule inet netfault input {from} tcp flags rst accept\n\
                 add rule inet netfault output {to} tcp flags rst accept\n"
            ));
        }
        if let Some(verdict) = input {
            script.push_str(&format!("add rule inet netfault input {from} {verdict}\n"));
        }
        if let Some(verdict) = output {
            script.push_str(&format!("add rule inet netfault output {to} {verdict}\n"));
        }
        script
    }

    /// How many sockets in the ledger namespace are established with a peer of `path`.
    pub fn established(&self, path: impl Into<Target>) -> anyhow::Result<usize> {
        Ok(self.established_lines(path, "-Htn")?.len())
    }

    /// The sockets [`Net::established`] counts, one line each as `ss` describes them: the
    /// process holding it, its timers (a keepalive timer or none), and TCP's own figures (idle
    /// times `lastsnd`/`lastrcv`, retransmissions). What a report shows of a fault that was not
    /// noticed in time.
    pub fn established_detail(&self, path: impl Into<Target>) -> anyhow::Result<Vec<String>> {
        self.established_lines(path, "-HtnpoieO")
    }

    fn established_lines(
        &self,
        path: impl Into<Target>,
        flags: &str,
    ) -> anyhow::Result<Vec<String>> {
        let peers: Vec<String> = self
            .peers(path)?
            .into_iter()
            .map(|p| SocketAddr::V4(p).to_string())
            .collect();
        let out = run(Command::new("ip").args([
            "netns",
            "exec",
            &self.ledger_ns,
            "ss",
            flags,
            "state",
            "established",
        ]))?;
        Ok(out
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .any(|col| peers.iter().any(|p| p == col))
            })
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect())
    }

    /// Waits until no socket of the ledgers is established with the peer of `path` (each one
    /// was noticed dead and closed, or errored by the kernel); returns how long that took from
    /// `since`, or `None` when `max` passed first.
    pub fn wait_noticed(
        &self,
        path: impl Into<Target>,
        since: Instant,
        max: Duration,
    ) -> anyhow::Result<Option<Duration>> {
        let path = path.into();
        loop {
            if self.established(path)? == 0 {
                return Ok(Some(since.elapsed()));
            }
            if since.elapsed() > max {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // The veth pairs go with their namespaces.
        let _ = ip(&["netns", "del", &self.ledger_ns]);
        let _ = ip(&["netns", "del", &self.spot_ns]);
    }
}
