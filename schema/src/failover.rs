//! Finding the writable server among several (`docs/adr/0009-postgres-failover.md`).
//!
//! `DATABASE_URL` may list several hosts the way libpq does
//! (`postgres://u@h1:5433,h2:5434/db?target_session_attrs=read-write`). sqlx 0.8 connects to one
//! host only, so the list is split here into one `PgConnectOptions` per host; the pool is
//! pointed at the first writable one, and a watcher (one task per pool with more than one host)
//! keeps a probe connection to it. When the probe fails, says the server is in recovery or
//! read-only, or a pooled connection was dropped for being read-only, the watcher tries every
//! host in order and points the pool at the writable one (`Pool::set_connect_options`): sqlx's
//! connect loop reads the options again at each attempt, so a caller already waiting for a
//! connection gets one to the new primary.
//!
//! Under a failover manager (Patroni), writable is not enough: a primary whose agent died, or
//! that lost the manager's leader key, stays writable while its commits wait for a synchronous
//! standby that now follows someone else, and a ledger left on it would wait with them. The
//! URL may then name each host's Patroni REST API in a `patroni` query parameter, in the same
//! order as the hosts (`postgres://u@h1:5432,h2:5432/db?patroni=http://h1:8008,http://h2:8008`).
//! A host is then the one to use only when it is writable and its Patroni answers 200 on
//! `/primary` (200 only on the leader running as primary, 503 elsewhere): see
//! [`Servers::find_writable`] and [`watch`].
//!
//! Why a query parameter of `DATABASE_URL` and not a variable of its own: each database has its
//! own manager (under a cell map every cell names its own `database_url`, and each cell's
//! PostgreSQL is its own Patroni cluster), the REST URLs go with the hosts in the same order,
//! and everything that carries a database to a process already carries that one string (the
//! cell map, `ledger up --cells`' per-cell URLs, which keep the query, the chaos and test
//! harnesses). It is taken out here, as `target_session_attrs` is, before sqlx sees the URL;
//! libpq's tools (`psql`) would refuse it, so hand them the URL without it.
//!
//! The parts: `urls.rs` (the hosts and Patroni URLs a `DATABASE_URL` names), `probe.rs` (whether
//! a session may write), `servers.rs` (`Servers`: finding and connecting to the one to use),
//! `watch.rs` (the pool's watcher), `observed.rs` (the moves and leaderless spells the watchers
//! saw, for the failover recorder and `/metrics`).

mod observed;
mod probe;
mod servers;
mod urls;
mod watch;

pub use observed::PrimaryMove;
pub use probe::{is_writable, PROBE_INTERVAL, PROBE_TIMEOUT, WRITABLE_SQL};
pub use servers::{
    leaderless_since, observation_key, primary_in_use, take_moves, untake_moves, Servers,
};
pub use urls::{patroni_urls, split_hosts, PatroniUrl, PATRONI_PARAM};
pub use watch::watch;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::observed::observe_leaderless;
    use super::urls::status_of;
    use super::*;

    #[test]
    fn splits_hosts_and_drops_session_attrs() {
        let urls = split_hosts(
            "postgres://u:p@127.0.0.1:5433,127.0.0.1:5434/db?target_session_attrs=read-write&sslmode=disable",
        )
        .unwrap();
        assert_eq!(
            urls,
            [
                "postgres://u:p@127.0.0.1:5433/db?sslmode=disable",
                "postgres://u:p@127.0.0.1:5434/db?sslmode=disable"
            ]
        );
        let one = split_hosts("postgres://postgres@127.0.0.1:5432/ledger").unwrap();
        assert_eq!(one, ["postgres://postgres@127.0.0.1:5432/ledger"]);
        let servers =
            Servers::parse("postgres://u@a:1,b:2/x?target_session_attrs=primary").unwrap();
        assert_eq!(servers.options[1].get_host(), "b");
        assert_eq!(servers.options[1].get_port(), 2);
    }

    #[test]
    fn patroni_urls_are_read_in_host_order_and_kept_from_sqlx() {
        let url = "postgres://u@127.0.0.1:5433,127.0.0.1:5434/db?target_session_attrs=read-write\
                   &patroni=http://127.0.0.1:8008,http://127.0.0.1:8009/&sslmode=disable";
        let urls = split_hosts(url).unwrap();
        assert_eq!(
            urls,
            [
                "postgres://u@127.0.0.1:5433/db?sslmode=disable",
                "postgres://u@127.0.0.1:5434/db?sslmode=disable"
            ]
        );
        let servers = Servers::parse(url).unwrap();
        let patroni = servers.patroni.as_ref().unwrap();
        assert_eq!(
            patroni,
            &[
                PatroniUrl {
                    host: "127.0.0.1".into(),
                    port: 8008
                },
                PatroniUrl {
                    host: "127.0.0.1".into(),
                    port: 8009
                }
            ]
        );
        // Percent-encoded whole, a default port, an IPv6 host.
        let encoded = patroni_urls("postgres://u@a,b/db?patroni=http%3A%2F%2Fa%2Chttp://[::1]:9")
            .unwrap()
            .unwrap();
        assert_eq!(
            encoded[0],
            PatroniUrl {
                host: "a".into(),
                port: 8008
            }
        );
        assert_eq!(
            encoded[1],
            PatroniUrl {
                host: "::1".into(),
                port: 9
            }
        );
        assert!(patroni_urls("postgres://u@a/db").unwrap().is_none());
        assert!(Servers::parse("postgres://u@a,b/db")
            .unwrap()
            .patroni
            .is_none());
    }

    #[test]
    fn refuses_patroni_urls_that_do_not_match_the_hosts() {
        // One per host, in order.
        assert!(Servers::parse("postgres://u@a:1,b:2/db?patroni=http://a:8008").is_err());
        // Plain HTTP, no credentials, no path, a port that is a port.
        for bad in [
            "https://a:8008",
            "http://user:pw@a:8008",
            "http://a:8008/primary",
            "http://a:port",
            "http://",
            "a:8008",
        ] {
            assert!(PatroniUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(patroni_urls("postgres://u@a,b/db?patroni=http://a&patroni=http://b").is_err());
    }

    #[test]
    fn reads_the_status_line() {
        assert_eq!(status_of(b"HTTP/1.0 200 OK\r\nServer: x\r\n"), Some(200));
        assert_eq!(
            status_of(b"HTTP/1.1 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(status_of(b"garbage"), None);
        assert_eq!(status_of(b""), None);
    }

    /// A fake Patroni answers each connection with `status`; `leads` is true on 200 only, and
    /// false for a port nothing listens on.
    #[tokio::test]
    async fn leads_only_on_200() {
        async fn fake(status: &'static str) -> u16 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(async move {
                while let Ok((mut s, _)) = listener.accept().await {
                    let mut buf = [0u8; 512];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(
                            format!("HTTP/1.0 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
                        )
                        .await;
                }
            });
            port
        }
        let leader = PatroniUrl {
            host: "127.0.0.1".into(),
            port: fake("200 OK").await,
        };
        let other = PatroniUrl {
            host: "127.0.0.1".into(),
            port: fake("503 Service Unavailable").await,
        };
        let gone = PatroniUrl {
            host: "127.0.0.1".into(),
            port: std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port(),
        };
        assert!(leader.leads().await);
        assert!(!other.leads().await);
        assert!(!gone.leads().await);
    }

    #[test]
    fn a_connection_made_before_the_move_is_dropped() {
        let servers = Servers::parse("postgres://u@a:1,b:2/x").unwrap();
        assert!(!servers.made_before_move(Duration::from_secs(3600)));
        servers.mark_moved();
        std::thread::sleep(Duration::from_millis(20));
        assert!(servers.made_before_move(Duration::from_secs(1)));
        assert!(!servers.made_before_move(Duration::from_millis(1)));
    }

    #[test]
    fn one_move_is_recorded_however_many_pools_observe_it() {
        let url = "postgres://u@obs-a:1,obs-b:2/observed";
        let servers = Servers::parse(url).unwrap();
        assert_eq!(servers.key(), "obs-a:1,obs-b:2/observed");
        // The first sight is no move.
        servers.observe_using(0, "first");
        servers.observe_using(0, "again");
        assert!(take_moves(url).is_empty());
        assert_eq!(primary_in_use(url).as_deref(), Some("obs-a:1"));
        observe_leaderless(&servers.key());
        let since = leaderless_since(url).unwrap();
        observe_leaderless(&servers.key());
        assert_eq!(leaderless_since(url), Some(since));
        // Two pools move to b: one move, and the leaderless time ends.
        servers.observe_using(1, "the primary's Patroni no longer holds the leader key");
        servers.observe_using(1, "the primary's Patroni no longer holds the leader key");
        assert_eq!(leaderless_since(url), None);
        let moves = take_moves(url);
        assert_eq!(moves.len(), 1);
        assert_eq!(moves[0].from.as_deref(), Some("obs-a:1"));
        assert_eq!(moves[0].to, "obs-b:2");
        assert!(take_moves(url).is_empty());
        // Given back, taken again before a newer one.
        untake_moves(url, moves);
        servers.observe_using(0, "back");
        let again = take_moves(url);
        assert_eq!(again.len(), 2);
        assert_eq!(again[0].to, "obs-b:2");
        assert_eq!(again[1].to, "obs-a:1");
    }

    #[test]
    fn refuses_a_standby_target_and_empty_hosts() {
        assert!(split_hosts("postgres://u@a:1,b:2/x?target_session_attrs=read-only").is_err());
        assert!(split_hosts("postgres://u@a:1,,b:2/x").is_err());
        assert!(split_hosts("not a url").is_err());
    }
}
