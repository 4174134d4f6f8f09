//! How a PostgreSQL connection whose peer vanished is noticed within a bounded time, on both
//! ends of it.
//!
//! - The ledger's end: keepalive probes on an idle socket and `TCP_USER_TIMEOUT` on sent data.
//!   sqlx opens its sockets itself and exposes none, so after each new connection every socket of
//!   this process connected to a configured database port is tuned through a duplicate of its
//!   descriptor (`pidfd_getfd` on the process itself: the same open socket, no unsafe code).
//!   Without it, a query whose answer is lost waits out the kernel's retransmissions (about 15
//!   minutes) and an idle pooled connection to a vanished server lives for hours.
//! - The server's end, sent as connection options: the same keepalive and user timeout
//!   (`tcp_keepalives_*`, `tcp_user_timeout`, from the one `liveness::TcpLiveness`), and
//!   `idle_in_transaction_session_timeout`, so a session whose ledger vanished mid-transaction
//!   stops holding its locks (the feed's advisory lock, account rows) for the other ledgers.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use liveness::{TcpLiveness, KEEPALIVE_PROBES};
use rustix::process::{getpid, pidfd_getfd, pidfd_open, PidfdFlags, PidfdGetfdFlags};
use sqlx::postgres::PgConnectOptions;

/// The liveness settings of the pool's connections: the system's one TCP liveness type, set on
/// this process's sockets and sent to the server, and the server's bound on a session idle
/// inside a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbLiveness {
    /// Keepalive and `TCP_USER_TIMEOUT`, on both ends of every connection.
    pub tcp: TcpLiveness,
    /// The server ends a session idle inside a transaction this long (0: never).
    pub idle_in_transaction: Duration,
}

impl Default for DbLiveness {
    fn default() -> Self {
        DbLiveness::DEFAULT
    }
}

impl DbLiveness {
    /// The TCP defaults ([`TcpLiveness::DEFAULT`]: a vanished server noticed within about 11 s,
    /// idle or not), 60 s idle inside a transaction.
    pub const DEFAULT: DbLiveness = DbLiveness {
        tcp: TcpLiveness::DEFAULT,
        idle_in_transaction: Duration::from_secs(60),
    };

    /// The server-side half, as run-time parameters of every connection: the same keepalive
    /// and user timeout the kernel gets on this end.
    pub fn server_options(&self, options: PgConnectOptions) -> PgConnectOptions {
        let tcp = &self.tcp;
        let idle_tx = self.idle_in_transaction.as_millis().to_string();
        options.options([
            (
                "tcp_keepalives_idle",
                tcp.keepalive_idle().as_secs().to_string(),
            ),
            (
                "tcp_keepalives_interval",
                tcp.probe_interval().as_secs().to_string(),
            ),
            ("tcp_keepalives_count", KEEPALIVE_PROBES.to_string()),
            ("tcp_user_timeout", tcp.user_timeout_ms().to_string()),
            ("idle_in_transaction_session_timeout", idle_tx),
        ])
    }

    /// Sets keepalive and `TCP_USER_TIMEOUT` on one connected TCP socket.
    pub fn apply(&self, socket: impl AsFd) -> std::io::Result<()> {
        self.tcp.apply(socket)
    }

    /// Tunes every TCP socket of this process connected to one of `ports`; returns how many.
    /// Sockets already tuned are set again (the same values). A socket that cannot be tuned
    /// does not stop the others from being tuned; the first such error is returned after all
    /// were tried.
    pub fn tune_process_sockets(&self, ports: &BTreeSet<u16>) -> std::io::Result<usize> {
        let mut tuned = 0;
        let mut failed = None;
        for socket in process_sockets()? {
            if socket.peer.is_some_and(|p| ports.contains(&p.port())) {
                match self.apply(&socket.fd) {
                    Ok(()) => tuned += 1,
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        match failed {
            None => Ok(tuned),
            Some(e) => Err(e),
        }
    }
}

/// One socket of this process: a duplicate of its descriptor (the same open socket) and the
/// address it is connected to, if any.
pub struct ProcessSocket {
    pub fd: OwnedFd,
    pub peer: Option<SocketAddr>,
}

/// Every socket this process has open, one at a time, each through a duplicate of its descriptor
/// taken with `pidfd_getfd` on the process itself (no unsafe code) only when the iterator reaches
/// it; one closed since the listing began is left out.
///
/// Lazily, because this runs after every new database connection: a process with S sockets
/// that took all S duplicates at once held 2S descriptors for a moment, and a few connections
/// opened together multiplied that. A test process hosting many ledgers (S in the hundreds)
/// reached its 20,000-descriptor limit that way in a burst of under a second, and the tests
/// running then failed on "Too many open files". Dropping each item before taking the next
/// keeps this to one extra descriptor per caller, besides the directory and the pidfd.
pub fn process_sockets() -> std::io::Result<ProcessSockets> {
    Ok(ProcessSockets {
        me: pidfd_open(getpid(), PidfdFlags::empty())?,
        entries: std::fs::read_dir("/proc/self/fd")?,
    })
}

/// The iterator [`process_sockets`] returns.
pub struct ProcessSockets {
    me: OwnedFd,
    entries: std::fs::ReadDir,
}

impl Iterator for ProcessSockets {
    type Item = ProcessSocket;

    fn next(&mut self) -> Option<ProcessSocket> {
        for entry in self.entries.by_ref() {
            let Ok(entry) = entry else { continue };
            let is_socket = std::fs::read_link(entry.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
            let fd = entry.file_name().to_str().and_then(|n| n.parse().ok());
            let (true, Some(fd)) = (is_socket, fd) else {
                continue;
            };
            let Ok(dup) = pidfd_getfd(&self.me, fd, PidfdGetfdFlags::empty()) else {
                continue;
            };
            let peer = rustix::net::getpeername(&dup)
                .ok()
                .flatten()
                .and_then(|p| SocketAddr::try_from(p).ok());
            return Some(ProcessSocket { fd: dup, peer });
        }
        None
    }
}

/// Every port `url` names: one per host of a multi-host URL (`h1:5432,h2:5433`), 5432 where a
/// host gives none, and a `port=` query parameter's list.
pub fn database_ports(url: &str) -> BTreeSet<u16> {
    let mut ports = BTreeSet::new();
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    // The authority ends at the path or the query, whichever comes first (a query may hold
    // URLs of its own: `?patroni=http://...`).
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let query = tail.split_once('?').map_or("", |(_, q)| q);
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        // `[::1]:5432`, `host:5432`, `host`
        let port = match host.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') && !p.contains(']') => p.parse().ok(),
            _ => None,
        };
        ports.insert(port.unwrap_or(5432));
    }
    for pair in query.split('&') {
        if let Some(list) = pair.strip_prefix("port=") {
            ports.extend(list.split(',').filter_map(|p| p.parse::<u16>().ok()));
        }
    }
    if ports.is_empty() {
        ports.insert(5432);
    }
    ports
}

#[cfg(test)]
mod tests {
    use rustix::net::sockopt;

    use super::*;

    #[test]
    fn every_host_of_a_url_gives_its_port() {
        let ports = |u| database_ports(u).into_iter().collect::<Vec<_>>();
        assert_eq!(ports("postgres://postgres@127.0.0.1:5432/ledger"), [5432]);
        assert_eq!(
            ports("postgres://u:p@h1:6000,h2:6001,h3/db?x=1"),
            [5432, 6000, 6001]
        );
        assert_eq!(ports("postgres://[::1]:6432/db"), [6432]);
        assert_eq!(ports("postgres://localhost/db?port=7000"), [5432, 7000]);
        assert_eq!(
            ports("postgres://u@h1:6000,h2:6001?patroni=http://h1:8008,http://h2:8008"),
            [6000, 6001]
        );
    }

    #[test]
    fn the_server_gets_the_same_tcp_liveness_and_the_idle_transaction_bound() {
        let options = DbLiveness::DEFAULT.server_options(PgConnectOptions::new());
        assert_eq!(
            options.get_options(),
            Some(
                "-c tcp_keepalives_idle=4 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=4 \
                 -c tcp_user_timeout=10000 -c idle_in_transaction_session_timeout=60000"
            )
        );
    }

    /// The sockets are duplicated one at a time: while the listing is walked, at most one of
    /// this test's twenty connections has a second descriptor (two if another test of this
    /// binary lists the sockets at the same moment), never all of them at once.
    #[test]
    fn the_process_sockets_are_duplicated_one_at_a_time() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let streams: Vec<_> = (0..20)
            .map(|_| std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap())
            .collect();
        let mine: BTreeSet<String> = streams
            .iter()
            .map(|s| {
                let fd = std::os::fd::AsRawFd::as_raw_fd(s);
                std::fs::read_link(format!("/proc/self/fd/{fd}"))
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        let duplicated_now = || {
            let mut seen = std::collections::BTreeMap::<String, usize>::new();
            for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
                if let Ok(t) = std::fs::read_link(entry.path()) {
                    *seen.entry(t.display().to_string()).or_default() += 1;
                }
            }
            mine.iter()
                .filter(|m| seen.get(*m).copied().unwrap_or(0) > 1)
                .count()
        };
        let (mut walked, mut most) = (0, 0);
        for _socket in process_sockets().unwrap() {
            walked += 1;
            most = most.max(duplicated_now());
        }
        assert!(walked >= 20, "{walked}");
        assert!(
            (1..=2).contains(&most),
            "{most} of the 20 held twice at once"
        );
    }

    #[test]
    fn a_connected_socket_of_this_process_is_found_and_tuned() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let liveness = DbLiveness {
            tcp: TcpLiveness {
                keepalive: Duration::from_secs(8),
                user_timeout: Duration::from_millis(2_500),
            },
            idle_in_transaction: Duration::from_secs(1),
        };
        let tuned = liveness
            .tune_process_sockets(&BTreeSet::from([port]))
            .unwrap();
        assert!(tuned >= 1, "{tuned}");
        assert!(sockopt::socket_keepalive(&stream).unwrap());
        assert_eq!(
            sockopt::tcp_keepidle(&stream).unwrap(),
            Duration::from_secs(8)
        );
        assert_eq!(
            sockopt::tcp_keepintvl(&stream).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(sockopt::tcp_user_timeout(&stream).unwrap(), 2_500);
    }
}
