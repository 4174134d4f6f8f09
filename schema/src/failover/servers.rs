//! The servers a `DATABASE_URL` names (one per host, each with its Patroni when the URL names
//! them): finding the one to write to, connecting with this process's socket liveness, and
//! what the process's watchers observed of them, read by URL.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::sync::Notify;

use super::observed::{observe_primary, observed, PrimaryMove, MOVES_KEPT_MAX};
use super::probe::{is_writable, PROBE_INTERVAL, PROBE_TIMEOUT};
use super::urls::{patroni_urls, split_hosts, PatroniUrl};
use crate::net::DbLiveness;

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
    pub(super) wake: Notify,
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

    pub(super) fn mark_moved(&self) {
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
