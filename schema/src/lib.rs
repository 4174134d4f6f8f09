//! The SQL schema: migrations live in `schema/migrations/` and are embedded here, so every binary
//! and test applies exactly the same ones. A landed migration is never edited.

use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

pub mod cell_identity;
pub mod failover;
pub mod net;
pub use net::DbLiveness;

/// Every migration of the project, in order.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a caller waits for a pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The database used when `DATABASE_URL` is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/ledger";

/// How long creating the database at startup may take, its connection included. Every step is
/// bounded: a connection the network left half-open (a forwarder or a server that vanished
/// without a word after accepting it) would otherwise hold a starting process forever, never
/// serving and never exiting so that its supervisor starts it again.
pub const ENSURE_DATABASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Creates the database named in `url` if it does not exist yet, by connecting to the server's
/// `postgres` database; an error after [`ENSURE_DATABASE_TIMEOUT`] (its connection after
/// `ACQUIRE_TIMEOUT`) instead of waiting on a server that does not answer.
pub async fn ensure_database(url: &str) -> anyhow::Result<()> {
    ensure_database_with(url, DbLiveness::DEFAULT).await
}

/// [`ensure_database`], its connections with `liveness` on this process's end (`net.rs`), as
/// the pool's are: a lost answer fails within the user timeout, not the whole bound.
pub async fn ensure_database_with(url: &str, liveness: DbLiveness) -> anyhow::Result<()> {
    tokio::time::timeout(
        ENSURE_DATABASE_TIMEOUT,
        ensure_database_unbounded(url, liveness),
    )
    .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the PostgreSQL server did not answer within {ENSURE_DATABASE_TIMEOUT:?} while the database was checked"
            )
        })?
}

async fn ensure_database_unbounded(url: &str, liveness: DbLiveness) -> anyhow::Result<()> {
    let servers =
        failover::Servers::parse(url)?.tuned(liveness, Arc::new(net::database_ports(url)));
    let name = servers.options[0]
        .get_database()
        .context("DATABASE_URL names no database")?
        .to_owned();
    // Asked on the server's own database: the one named may not exist yet. With several hosts,
    // the writable one's probe connection is that connection.
    let mut conn = if servers.options.len() > 1 {
        let (_, conn) = servers
            .on_database("postgres")
            .first_writable(ACQUIRE_TIMEOUT)
            .await?;
        conn
    } else {
        let admin = servers.options[0].clone().database("postgres");
        servers
            .connect(&admin, ACQUIRE_TIMEOUT)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "the PostgreSQL server did not answer a connection within {ACQUIRE_TIMEOUT:?}"
                )
            })?
            .context("connect to the PostgreSQL server (is it running?)")?
    };
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_optional(&mut conn)
        .await?;
    if exists.is_none() {
        let quoted = name.replace('"', "\"\"");
        let created = sqlx::query(&format!("CREATE DATABASE \"{quoted}\""))
            .execute(&mut conn)
            .await;
        // Another process may have created it between the check and here.
        if let Err(e) = created {
            let raced = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42P04" || c == "23505");
            if !raced {
                return Err(e).context("create database");
            }
        }
    }
    conn.close().await.ok();
    Ok(())
}

/// Connects a pool of at most `max_connections`, with bounded waits.
///
/// Every connection is checked before it is handed out: it must answer, and it must not be
/// inside a transaction block. sqlx 0.8 returns a connection to the pool still inside a
/// transaction when a `begin()` is cancelled while its BEGIN is in flight (a dropped request, an
/// aborted task; sqlx issue #4393, no 0.8 release has the fix). On such a connection every later
/// "autocommit" statement would run inside that transaction: it would answer OK, hold its locks,
/// and be discarded when the connection closes. Money recorded as moved would not be. The check
/// replaces sqlx's own liveness ping, one round trip either way, and a connection that fails it
/// is closed (which rolls the stale transaction back) and another one is taken.
pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    connect_with(url, max_connections, DbLiveness::DEFAULT).await
}

/// [`connect`], with the keepalive, `TCP_USER_TIMEOUT` and idle-in-transaction bound of
/// `liveness` on both ends of every connection (`net.rs`). A query whose answer never comes and a
/// pooled connection whose server vanished then fail within a bound, as I/O errors: outcome
/// unknown. With several hosts, the pool connects to the writable one and a watcher follows a
/// promotion (`failover.rs`).
pub async fn connect_with(
    url: &str,
    max_connections: u32,
    liveness: DbLiveness,
) -> anyhow::Result<PgPool> {
    let ports = Arc::new(net::database_ports(url));
    let servers = failover::Servers::parse(url)?.tuned(liveness, ports);
    let (first, probe) = if servers.options.len() > 1 {
        let (found, conn) = servers.first_writable(ACQUIRE_TIMEOUT).await?;
        (found, Some(conn))
    } else {
        (0, None)
    };
    let pool = pool_options(max_connections, &servers)
        .connect_with(servers.options[first].clone())
        .await
        .context("connect to PostgreSQL")?;
    if let Some(probe) = probe {
        servers.observe_using(first, "a new pool found the primary elsewhere");
        tokio::spawn(failover::watch(pool.clone(), servers, first, probe));
    }
    Ok(pool)
}

/// The pool's settings and checks. Every new connection's socket gets the liveness settings
/// (found by the database ports, `net.rs`). A connection to a server that cannot write (in
/// recovery: a standby, or an old primary come back as one; or read-only by setting) is refused
/// when it is made and dropped when it is handed out, and the failover watcher is told
/// (`failover::Servers::suspect`). A connection made before the watcher last moved the pool to
/// another server is dropped when handed out, without a round trip.
fn pool_options(max_connections: u32, servers: &Arc<failover::Servers>) -> PgPoolOptions {
    let on_connect = Arc::clone(servers);
    let on_acquire = Arc::clone(servers);
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .after_connect(move |conn, _meta| {
            let servers = Arc::clone(&on_connect);
            Box::pin(async move {
                // sqlx keeps one `after_connect`: the socket tuning and the writable check share it.
                servers.tune_sockets();
                let writable: bool = sqlx::query_scalar(failover::WRITABLE_SQL)
                    .fetch_one(&mut *conn)
                    .await?;
                if writable {
                    return Ok(());
                }
                servers.suspect();
                Err(sqlx::Error::Protocol(
                    "the PostgreSQL server is in recovery or read-only".into(),
                ))
            })
        })
        .before_acquire(move |conn, meta| {
            let servers = Arc::clone(&on_acquire);
            let before_move = servers.made_before_move(meta.age);
            Box::pin(async move {
                // Made before the pool moved to another server (under Patroni the old one may
                // still be writable, its commits waiting on a standby that follows another).
                if before_move {
                    return Ok(false);
                }
                // A simple query's own implicit transaction starts with the statement; inside
                // an open block it started earlier. A query without arguments goes as a simple
                // query, on purpose: with the extended protocol, Bind starts the transaction and
                // Execute restarts the statement clock, so the two differ even on a clean
                // connection.
                let row = sqlx::Executor::fetch_one(
                    &mut *conn,
                    "SELECT now() = statement_timestamp(), NOT pg_is_in_recovery() \
                     AND current_setting('transaction_read_only') = 'off'",
                )
                .await?;
                let clean: bool = sqlx::Row::try_get(&row, 0)?;
                let writable: bool = sqlx::Row::try_get(&row, 1)?;
                if !clean {
                    tracing::warn!(
                        "a pooled connection was inside a transaction block; closing it"
                    );
                } else if !writable {
                    tracing::warn!("a pooled connection's server cannot write; closing it");
                    servers.suspect();
                }
                Ok(clean && writable)
            })
        })
}

/// Creates the database if needed, connects, and applies every migration.
pub async fn prepare(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    prepare_with(url, max_connections, DbLiveness::DEFAULT).await
}

/// [`prepare`] with [`connect_with`]'s liveness settings.
pub async fn prepare_with(
    url: &str,
    max_connections: u32,
    liveness: DbLiveness,
) -> anyhow::Result<PgPool> {
    ensure_database_with(url, liveness).await?;
    let pool = connect_with(url, max_connections, liveness).await?;
    MIGRATOR.run(&pool).await.context("apply migrations")?;
    Ok(pool)
}
