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

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// The query parameter naming each host's Patroni REST API, in the hosts' order.
pub const PATRONI_PARAM: &str = "patroni";

/// One host's Patroni REST API: `http://host:port` (plain HTTP; `GET /primary` needs no
/// credentials, so none are taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatroniUrl {
    pub host: String,
    pub port: u16,
}

impl PatroniUrl {
    /// `http://host[:port][/]`, port 8008 (Patroni's default) when none is given.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let Some(rest) = text.strip_prefix("http://") else {
            bail!("patroni URL {text:?} in DATABASE_URL: only http://host:port is supported");
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['@', '/', '?', '#']) || rest.is_empty() {
            bail!(
                "patroni URL {text:?} in DATABASE_URL: expected http://host:port and nothing more"
            );
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') => (
                h,
                p.parse::<u16>()
                    .with_context(|| format!("patroni URL {text:?}: bad port"))?,
            ),
            _ => (rest, 8008),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            bail!("patroni URL {text:?} in DATABASE_URL names no host");
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    /// Whether this Patroni answers 200 on `/primary` within [`PROBE_TIMEOUT`]: it holds the
    /// leader key and its PostgreSQL runs as primary. No answer, another status or a slow
    /// answer count as "no". One HTTP/1.0 `HEAD` on a fresh connection (the status alone, no
    /// body; Patroni's REST server answers and closes), read to its end so that Patroni is not
    /// left writing to a closed socket.
    pub async fn leads(&self) -> bool {
        matches!(
            tokio::time::timeout(PROBE_TIMEOUT, self.primary_status()).await,
            Ok(Ok(200))
        )
    }

    async fn primary_status(&self) -> std::io::Result<u16> {
        let mut stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
        let host = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        stream
            .write_all(
                format!("HEAD /primary HTTP/1.0\r\nHost: {host}\r\nUser-Agent: ledger\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut head = Vec::with_capacity(256);
        let mut buf = [0u8; 256];
        // Headers only; a server that keeps sending is cut off at 4 KiB.
        while head.len() < 4096 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(status_of(&head).unwrap_or(0))
    }
}

/// The status code of an HTTP status line (`HTTP/1.0 200 OK`).
fn status_of(head: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(head).ok()?.lines().next()?;
    let mut words = line.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

/// The servers a `DATABASE_URL` names, in the order it names them.
#[derive(Debug)]
pub struct Servers {
    pub options: Vec<PgConnectOptions>,
    /// Each host's Patroni, same order, when the URL names them.
    pub patroni: Option<Vec<PatroniUrl>>,
    /// When the pool was last pointed at another server: a pooled connection older than that
    /// may be to the old one, which may still be writable (a primary no longer leader), and is
    /// dropped when handed out ([`Servers::made_before_move`]).
    moved_at: Mutex<Option<Instant>>,
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
        let patroni = patroni_urls(url)?;
        if let Some(list) = &patroni {
            if list.len() != options.len() {
                bail!(
                    "DATABASE_URL names {} hosts and {} patroni URLs: give one per host, in the same order",
                    options.len(),
                    list.len()
                );
            }
        }
        Ok(Arc::new(Self {
            options,
            patroni,
            moved_at: Mutex::new(None),
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
            patroni: self.patroni.clone(),
            moved_at: Mutex::new(None),
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
            patroni: self.patroni.clone(),
            moved_at: Mutex::new(None),
            wake: Notify::new(),
            liveness: self.liveness.clone(),
        }
    }

    /// `host:port` of server `i`.
    pub fn host(&self, i: usize) -> String {
        let o = &self.options[i];
        format!("{}:{}", o.get_host(), o.get_port())
    }

    /// What identifies these servers' database in this process's observations: every
    /// `host:port`, in order, and the database name.
    pub fn key(&self) -> String {
        let hosts: Vec<String> = (0..self.options.len()).map(|i| self.host(i)).collect();
        format!(
            "{}/{}",
            hosts.join(","),
            self.options[0].get_database().unwrap_or_default()
        )
    }

    /// Records that a pool over these servers uses server `i` (a first connection, or the
    /// watcher's), `cause` saying why a different one was left if it was.
    pub fn observe_using(&self, i: usize, cause: &str) {
        observe_primary(&self.key(), self.host(i), cause);
    }

    /// Asks the watcher to look for the writable server now.
    pub fn suspect(&self) {
        self.wake.notify_one();
    }

    /// Whether host `i` leads by its Patroni; true when the URL names no Patroni (writable is
    /// then the whole test).
    pub async fn leads(&self, i: usize) -> bool {
        match &self.patroni {
            Some(list) => list[i].leads().await,
            None => true,
        }
    }

    fn mark_moved(&self) {
        *self.moved_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether a pooled connection of age `age` was made before the pool last moved to
    /// another server (it may be to the old one: drop it).
    pub fn made_before_move(&self, age: Duration) -> bool {
        self.moved_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| age >= at.elapsed())
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
    /// connection to it. With Patroni URLs, a server whose Patroni does not answer 200 on
    /// `/primary` is passed over (asked first: no connection is made to it).
    pub async fn find_writable(&self, first: usize) -> Option<(usize, PgConnection)> {
        let n = self.options.len();
        for i in (0..n).map(|k| (first + k) % n) {
            if !self.leads(i).await {
                continue;
            }
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

/// A change of primary this process's pool watchers observed, for the ledger to record in the
/// database's `failovers` once it can write there again (the database is failing over when it
/// happens): when, from which server to which (`host:port`), and why the old one was left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryMove {
    pub at: SystemTime,
    /// `None`: no primary had been seen by this process before.
    pub from: Option<String>,
    pub to: String,
    pub cause: String,
}

/// What this process's watchers of one database (every pool over the same servers: the
/// server's, the log follower's, a cell's probe) observed together: the primary they use, the
/// moves not yet taken, and since when none of them finds a primary. Shared so that one
/// failover seen by three pools is one move.
#[derive(Debug, Default)]
struct Observed {
    primary: Option<String>,
    moves: Vec<PrimaryMove>,
    leaderless_since: Option<SystemTime>,
}

/// The observations, by [`Servers::key`]. Process-wide: the pools are made deep inside
/// start-up, and what reads the observations (the failover recorder, `/metrics`, the cells
/// view) knows the database by its URL only.
static OBSERVED: Mutex<BTreeMap<String, Observed>> = Mutex::new(BTreeMap::new());

/// Most moves kept for one database while nobody takes them (a process that never records).
const MOVES_KEPT_MAX: usize = 256;

fn observed<T>(key: &str, f: impl FnOnce(&mut Observed) -> T) -> T {
    let mut all = OBSERVED.lock().unwrap_or_else(|e| e.into_inner());
    f(all.entry(key.to_owned()).or_default())
}

/// A watcher (or a new pool) uses `host` now: a move when another primary was in use.
fn observe_primary(key: &str, host: String, cause: &str) {
    observed(key, |o| {
        o.leaderless_since = None;
        if o.primary.as_deref() == Some(host.as_str()) {
            return;
        }
        if let Some(from) = o.primary.replace(host.clone()) {
            if o.moves.len() >= MOVES_KEPT_MAX {
                o.moves.remove(0);
            }
            o.moves.push(PrimaryMove {
                at: SystemTime::now(),
                from: Some(from),
                to: host,
                cause: cause.to_owned(),
            });
        }
    });
}

/// A watcher found no server to use: leaderless from now, unless already.
fn observe_leaderless(key: &str) {
    observed(key, |o| {
        o.leaderless_since.get_or_insert_with(SystemTime::now);
    });
}

/// The key under which the watchers of `url`'s servers record what they observe; `None` for a
/// URL that does not parse.
pub fn observation_key(url: &str) -> Option<String> {
    Servers::parse(url).ok().map(|s| s.key())
}

/// Takes the primary moves observed on `url`'s servers since the last call (oldest first).
pub fn take_moves(url: &str) -> Vec<PrimaryMove> {
    let Some(key) = observation_key(url) else {
        return Vec::new();
    };
    observed(&key, |o| std::mem::take(&mut o.moves))
}

/// Gives back moves a caller took and could not record (the database did not answer yet):
/// they are taken again, before any newer, at the next call.
pub fn untake_moves(url: &str, mut moves: Vec<PrimaryMove>) {
    let Some(key) = observation_key(url) else {
        return;
    };
    observed(&key, |o| {
        moves.append(&mut o.moves);
        moves.truncate(MOVES_KEPT_MAX);
        o.moves = moves;
    });
}

/// Since when this process's watchers of `url`'s servers have found no server to use (none
/// writable, or under Patroni none whose Patroni leads); `None` while one is in use.
pub fn leaderless_since(url: &str) -> Option<SystemTime> {
    let key = observation_key(url)?;
    observed(&key, |o| o.leaderless_since)
}

/// The primary this process's pools over `url`'s servers use now (`host:port`), if known.
pub fn primary_in_use(url: &str) -> Option<String> {
    let key = observation_key(url)?;
    observed(&key, |o| o.primary.clone())
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
/// the pool does with or without it), and `patroni` taken out ([`patroni_urls`] reads it).
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

/// The `patroni` query parameter's URLs, in order (`None`: the URL names none). Commas
/// separate them; `%2C`, `%3A` and `%2F` are read as `,`, `:` and `/` for a URL encoded
/// whole.
pub fn patroni_urls(url: &str) -> anyhow::Result<Option<Vec<PatroniUrl>>> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(None);
    };
    let mut found = None;
    for pair in query.split('&') {
        if let Some(value) = pair
            .strip_prefix(PATRONI_PARAM)
            .and_then(|v| v.strip_prefix('='))
        {
            if found.is_some() {
                bail!("DATABASE_URL names patroni= twice");
            }
            let value = value
                .replace("%2C", ",")
                .replace("%2c", ",")
                .replace("%3A", ":")
                .replace("%3a", ":")
                .replace("%2F", "/")
                .replace("%2f", "/");
            let list = value
                .split(',')
                .map(PatroniUrl::parse)
                .collect::<anyhow::Result<Vec<_>>>()?;
            found = Some(list);
        }
    }
    Ok(found)
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
            Some((PATRONI_PARAM, _)) => {}
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
///
/// Each [`PROBE_INTERVAL`] (or at once when a hook suspects the server), the kept probe
/// connection asks the current server whether it may write, and with Patroni URLs its Patroni
/// whether it leads. Either answer no (or late): the hosts are tried in order from the current
/// one ([`Servers::find_writable`]), and when another is the one to use the pool is pointed at
/// it. None is: the pool stays where it is and the hosts are tried again. Under Patroni, moving
/// also drops every pooled connection made before the move ([`Servers::made_before_move`]:
/// the old server may still be writable) and ends this database user's sessions on the old
/// server ([`fence`]), so that nothing of this process stays waiting on commits the old primary
/// can no longer replicate.
pub async fn watch(pool: PgPool, servers: Arc<Servers>, mut current: usize, probe: PgConnection) {
    let mut probe = Some(probe);
    let key = servers.key();
    // Why the server in use was left, for the move's record; a pooled connection found on a
    // server that cannot write wakes the watcher without a probe of its own failing.
    let mut cause = "a pooled connection found the primary read-only or in recovery";
    loop {
        tokio::select! {
            () = servers.wake.notified() => {}
            () = tokio::time::sleep(PROBE_INTERVAL) => {}
        }
        if pool.is_closed() {
            return;
        }
        if let Some(conn) = probe.as_mut() {
            if !is_writable(conn).await {
                cause =
                    "the primary stopped accepting writes (no answer, in recovery or read-only)";
            } else if !servers.leads(current).await {
                cause = "the primary's Patroni no longer holds the leader key";
            } else {
                continue;
            }
        }
        probe = None;
        let Some((found, conn)) = servers.find_writable(current).await else {
            observe_leaderless(&key);
            tracing::warn!(
                "no PostgreSQL server in DATABASE_URL accepts writes{}; looking again",
                if servers.patroni.is_some() {
                    " and leads by its Patroni"
                } else {
                    ""
                }
            );
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
            servers.mark_moved();
            if servers.patroni.is_some() {
                let old = servers.options[current].clone();
                let s = Arc::clone(&servers);
                tokio::spawn(async move { fence(&s, &old).await });
            }
            current = found;
        }
        observe_primary(&key, servers.host(found), cause);
        cause = "a pooled connection found the primary read-only or in recovery";
        probe = Some(conn);
    }
}

/// Ends, on a server the pool has left under Patroni, the sessions of this database's user on
/// this database (its own and other ledgers': none should write there any more). A session
/// waiting for its commit to reach a synchronous standby that now follows another primary would
/// otherwise wait for ever; ended, its caller sees a broken connection, an unknown outcome the
/// coordinator looks up and retries on the new primary, never a success (PostgreSQL does not
/// report a commit whose synchronous wait was ended by a termination). A server that does not
/// answer within [`PROBE_TIMEOUT`], or is in recovery already, is left alone.
async fn fence(servers: &Servers, old: &PgConnectOptions) {
    let Ok(Ok(mut conn)) = servers.connect(old, PROBE_TIMEOUT).await else {
        return;
    };
    let ended = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND usename = current_user \
         AND pid <> pg_backend_pid() AND backend_type = 'client backend' \
         AND NOT pg_is_in_recovery()",
    )
    .fetch_one(&mut conn);
    match tokio::time::timeout(PROBE_TIMEOUT, ended).await {
        Ok(Ok(n)) if n > 0 => tracing::warn!(
            host = old.get_host(),
            port = old.get_port(),
            sessions = n,
            "ended this database's sessions on the PostgreSQL server that no longer leads"
        ),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not end the sessions on the old primary"),
        Err(_) => tracing::warn!("the old primary did not answer while its sessions were ended"),
    }
    conn.close().await.ok();
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
