//! TCP liveness for a connection whose peer may vanish without a word (a partition, a dead host,
//! a blackhole that leaves the socket half-open): keepalive probes on an idle socket, and a bound
//! on how long sent data may stay unacknowledged (`TCP_USER_TIMEOUT`). With both set, the kernel
//! errors such a socket within a bounded time whether it sits idle in a pool or waits for an
//! answer, instead of after the system's defaults (two hours of idleness; about 15 minutes of
//! retransmissions).
//!
//! One type, [`TcpLiveness`], for every connection of the system: spot-core's client and server
//! sockets, and the ledger's PostgreSQL connections (`schema`, which also sends the same values to
//! the server as connection options). A leaf crate, so that `spot-core` and `schema` share it
//! while staying free of each other.

use std::os::fd::AsFd;
use std::time::Duration;

use rustix::net::sockopt;

/// Keepalive probes sent before an idle connection is given up.
pub const KEEPALIVE_PROBES: u32 = 4;

/// When an idle connection starts being probed and how long sent data may go unacknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpLiveness {
    /// Idle time before the first keepalive probe (whole seconds, at least 1). Probes follow
    /// every quarter of it (at least 1 s). With `user_timeout` set, Linux ends a connection whose
    /// probes go unanswered once nothing was received for `user_timeout` (the probe count,
    /// [`KEEPALIVE_PROBES`], only applies without it).
    pub keepalive: Duration,
    /// `TCP_USER_TIMEOUT`: sent data unacknowledged this long ends the connection.
    pub user_timeout: Duration,
}

impl Default for TcpLiveness {
    fn default() -> Self {
        TcpLiveness::DEFAULT
    }
}

impl TcpLiveness {
    /// 4 s of idleness before probing, 10 s without an acknowledgement or an answered probe:
    /// a vanished peer is noticed within about 11 s, idle or not.
    pub const DEFAULT: TcpLiveness = TcpLiveness {
        keepalive: Duration::from_secs(4),
        user_timeout: Duration::from_secs(10),
    };

    /// The idle time before probing, as the kernel takes it (whole seconds, at least one).
    pub fn keepalive_idle(&self) -> Duration {
        Duration::from_secs(self.keepalive.as_secs().max(1))
    }

    /// The time between probes: a quarter of the idle time, at least one second.
    pub fn probe_interval(&self) -> Duration {
        Duration::from_secs((self.keepalive_idle().as_secs() / 4).max(1))
    }

    /// About the longest an idle connection to a vanished peer lives on: until the first probe
    /// timer after `user_timeout` (at least the first probe and one interval).
    pub fn idle_bound(&self) -> Duration {
        let (idle, step) = (self.keepalive_idle(), self.probe_interval());
        let after_idle = self.user_timeout.saturating_sub(idle).max(step);
        let steps = after_idle.as_millis().div_ceil(step.as_millis());
        idle + step * u32::try_from(steps).unwrap_or(u32::MAX)
    }

    /// `TCP_USER_TIMEOUT` as the kernel takes it: milliseconds, at least one.
    pub fn user_timeout_ms(&self) -> u32 {
        u32::try_from(self.user_timeout.as_millis())
            .unwrap_or(u32::MAX)
            .max(1)
    }

    /// Sets keepalive and `TCP_USER_TIMEOUT` on a connected TCP socket.
    pub fn apply(&self, socket: impl AsFd) -> std::io::Result<()> {
        let fd = socket.as_fd();
        sockopt::set_socket_keepalive(fd, true)?;
        sockopt::set_tcp_keepidle(fd, self.keepalive_idle())?;
        sockopt::set_tcp_keepintvl(fd, self.probe_interval())?;
        sockopt::set_tcp_keepcnt(fd, KEEPALIVE_PROBES)?;
        sockopt::set_tcp_user_timeout(fd, self.user_timeout_ms())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_options_are_read_back() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let liveness = TcpLiveness {
            keepalive: Duration::from_millis(8_500),
            user_timeout: Duration::from_millis(2_500),
        };
        liveness.apply(&stream).unwrap();
        assert!(sockopt::socket_keepalive(&stream).unwrap());
        assert_eq!(
            sockopt::tcp_keepidle(&stream).unwrap(),
            Duration::from_secs(8)
        );
        assert_eq!(
            sockopt::tcp_keepintvl(&stream).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(sockopt::tcp_keepcnt(&stream).unwrap(), KEEPALIVE_PROBES);
        assert_eq!(sockopt::tcp_user_timeout(&stream).unwrap(), 2_500);
        assert_eq!(liveness.idle_bound(), Duration::from_secs(10));
        assert_eq!(TcpLiveness::DEFAULT.idle_bound(), Duration::from_secs(10));
    }
}
