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

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::sync::Notify;

use crate::net::DbLiveness;

/// How often the watcher asks the current server whether it is still writable.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long one probe (connect, or the question on a kept connection) may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One statement answers whether a session may write: not in recovery (a standby, or a
/// promotion still under way) and not read-only by setting (libpq's `read-write` test).
pub const WRITABLE_SQL: &str =
    "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'";

/// The servers a `DATABASE_URL` names, in the order it names them.
#[derive(Debug)]
pub struct Servers {
    pub options: Vec<PgConnectOptions>,
    /// Woken when a pooled connection was found on a server that cannot write.
    wake: Notify,
    /// The liveness settings every connection made to these servers gets, pooled or not.
    liveness: Option<SocketLiveness>,
}

/// The liveness of this process's sockets to the database ports (`net.rs`).
#[derive(Debug, Clone)]
struct SocketLiveness {
    settings: DbLiveness,
    ports: Arc<BTreeSet<u16>>,
}

impl Servers {
    /// Splits a libpq-style URL with one or more `host[:port]` entries.
    pub fn parse(url: &str) -> anyhow::Result<Arc<Self>> {
        let options = split_hosts(url)?
            .iter()
            .map(|one| PgConnectOptions::from_str(one).context("parse DATABASE_URL"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Arc::new(Self {
            options,
            wake: Notify::new(),
            liveness: None,
        }))
    }

    /// The same servers with `liveness` on both ends of every connection: sent to the server as
    /// options, and set on this process's sockets to `ports` after each connection is made
    /// ([`Servers::tune_sockets`]).
    pub fn tuned(&self, liveness: DbLiveness, ports: Arc<BTreeSet<u16>>) -> Arc<Self> {
        Arc::new(Self {
            options: self
                .options
                .iter()
                .map(|o| liveness.server_options(o.clone()))
                .collect(),
            wake: Notify::new(),
            liveness: Some(SocketLiveness {
                settings: liveness,
                ports,
            }),
        })
    }

    /// Sets the liveness settings on every socket of this process connected to a database port;
    /// called after each new connection, pooled or not ([`Servers::connect`]). A connection left with the system's
    /// defaults would outlive a vanished server by hours when idle, and by about 15 minutes
    /// when waiting on an answer.
    pub fn tune_sockets(&self) {
        let Some(l) = &self.liveness else { return };
        match l.settings.tune_process_sockets(&l.ports) {
            Ok(0) => tracing::warn!(ports = ?l.ports, "no database socket found to tune"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "database sockets not tuned"),
        }
    }

    /// The same servers, each with `database` instead of the URL's.
    pub fn on_database(&self, database: &str) -> Self {
        Self {
            options: self
                .options
                .iter()
                .map(|o| o.clone().database(database))
                .collect(),
            wake: Notify::new(),
            liveness: self.liveness.clone(),
        }
    }

    /// Asks the watcher to look for the writable server now.
    pub fn suspect(&self) {
        self.wake.notify_one();
    }

    /// A connection outside the pool, made within `within` and tuned before it is handed out
    /// (the pool's own are tuned in its `after_connect`). `Err` when the time ran out.
    pub async fn connect(
        &self,
        options: &PgConnectOptions,
        within: Duration,
    ) -> Result<Result<PgConnection, sqlx::Error>, tokio::time::error::Elapsed> {
        let conn = tokio::time::timeout(within, options.connect()).await?;
        if conn.is_ok() {
            self.tune_sockets();
        }
        Ok(conn)
    }

    /// The first writable server, trying `first` before the others in order, with a kept
    /// connection to it.
    pub async fn find_writable(&self, first: usize) -> Option<(usize, PgConnection)> {
        let n = self.options.len();
        for i in (0..n).map(|k| (first + k) % n) {
            let Ok(Ok(mut conn)) = self.connect(&self.options[i], PROBE_TIMEOUT).await else {
                continue;
            };
            if is_writable(&mut conn).await {
                return Some((i, conn));
            }
            conn.close().await.ok();
        }
        None
    }

    /// The writable server, waiting up to `wait` for one to appear.
    pub async fn first_writable(&self, wait: Duration) -> anyhow::Result<(usize, PgConnection)> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(found) = self.find_writable(0).await {
                return Ok(found);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "none of the {} PostgreSQL servers in DATABASE_URL accepts writes (is the primary up?)",
                    self.options.len()
                );
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }
}

/// Whether the session may write; a failed or slow question counts as "no".
pub async fn is_writable(conn: &mut PgConnection) -> bool {
    let asked = sqlx::query_scalar::<_, bool>(WRITABLE_SQL).fetch_one(&mut *conn);
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, asked).await,
        Ok(Ok(true))
    )
}

/// One URL per host of a libpq-style multi-host URL, `target_session_attrs` taken out (every
/// pool of the ledger writes, so only `read-write` or `primary` is accepted, and it is what
/// the pool does with or without it).
pub fn split_hosts(url: &str) -> anyhow::Result<Vec<String>> {
    let (scheme, rest) = url
        .split_once("://")
        .context("DATABASE_URL is not a URL (postgres://...)")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let tail = without_session_attrs(tail)?;
    let urls: Vec<String> = hosts
        .split(',')
        .map(|host| format!("{scheme}://{user}{host}{tail}"))
        .collect();
    if hosts.split(',').any(str::is_empty) {
        bail!("DATABASE_URL lists an empty host");
    }
    Ok(urls)
}

/// The path and query without `target_session_attrs`, refusing values that would let the
/// ledger write to a standby.
fn without_session_attrs(tail: &str) -> anyhow::Result<String> {
    let Some((path, query)) = tail.split_once('?') else {
        return Ok(tail.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("target_session_attrs", "read-write" | "primary")) => {}
            Some(("target_session_attrs", other)) => bail!(
                "target_session_attrs={other} in DATABASE_URL: the ledger writes, only read-write or primary is accepted"
            ),
            _ => kept.push(pair),
        }
    }
    Ok(if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    })
}

/// The watcher of a pool over several servers: ends when the pool is closed.
pub async fn watch(pool: PgPool, servers: Arc<Servers>, mut current: usize, probe: PgConnection) {
    let mut probe = Some(probe);
    loop {
        tokio::select! {
            () = servers.wake.notified() => {}
            () = tokio::time::sleep(PROBE_INTERVAL) => {}
        }
        if pool.is_closed() {
            return;
        }
        if let Some(conn) = probe.as_mut() {
            if is_writable(conn).await {
                continue;
            }
        }
        probe = None;
        let Some((found, conn)) = servers.find_writable(current).await else {
            tracing::warn!("no PostgreSQL server in DATABASE_URL accepts writes; looking again");
            continue;
        };
        if found != current {
            let target = &servers.options[found];
            tracing::warn!(
                host = target.get_host(),
                port = target.get_port(),
                "PostgreSQL primary changed; new connections go to the writable server"
            );
            pool.set_connect_options(target.clone());
            current = found;
        }
        probe = Some(conn);
    }
}

#[cfg(test)]
mod tests {
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
    fn refuses_a_standby_target_and_empty_hosts() {
        assert!(split_hosts("postgres://u@a:1,b:2/x?target_session_attrs=read-only").is_err());
        assert!(split_hosts("postgres://u@a:1,,b:2/x").is_err());
        assert!(split_hosts("not a url").is_err());
    }
}
