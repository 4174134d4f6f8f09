//! The SQL schema: migrations live in `schema/migrations/` and are embedded here, so every binary
//! and test applies exactly the same ones. A landed migration is never edited.

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;

pub mod net;
pub use net::DbLiveness;

/// Every migration of the project, in order.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The database used when `DATABASE_URL` is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/ledger";

/// Creates the database named in `url` if it does not exist yet, by connecting to the server's
/// `postgres` database.
pub async fn ensure_database(url: &str) -> anyhow::Result<()> {
    let options = PgConnectOptions::from_str(url).context("parse DATABASE_URL")?;
    let name = options
        .get_database()
        .context("DATABASE_URL names no database")?
        .to_owned();
    let admin = options.clone().database("postgres");
    let mut conn = admin
        .connect()
        .await
        .context("connect to the PostgreSQL server (is it running?)")?;
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
/// unknown.
pub async fn connect_with(
    url: &str,
    max_connections: u32,
    liveness: DbLiveness,
) -> anyhow::Result<PgPool> {
    let options =
        liveness.server_options(PgConnectOptions::from_str(url).context("parse DATABASE_URL")?);
    let ports = std::sync::Arc::new(net::database_ports(url));
    PgPoolOptions::new()
        .after_connect(move |_conn, _meta| {
            let ports = ports.clone();
            Box::pin(async move {
                match liveness.tune_process_sockets(&ports) {
                    Ok(0) => tracing::warn!(?ports, "no database socket found to tune"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "database sockets not tuned"),
                }
                Ok(())
            })
        })
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
        .before_acquire(|conn, _meta| {
            Box::pin(async move {
                // A simple query's own implicit transaction starts with the statement; inside
                // an open block it started earlier. A query without arguments goes as a simple
                // query, on purpose: with the extended protocol, Bind starts the transaction and
                // Execute restarts the statement clock, so the two differ even on a clean
                // connection.
                let row =
                    sqlx::Executor::fetch_one(&mut *conn, "SELECT now() = statement_timestamp()")
                        .await?;
                let clean: bool = sqlx::Row::try_get(&row, 0)?;
                if !clean {
                    tracing::warn!(
                        "a pooled connection was inside a transaction block; closing it"
                    );
                }
                Ok(clean)
            })
        })
        .connect_with(options)
        .await
        .context("connect to PostgreSQL")
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
    ensure_database(url).await?;
    let pool = connect_with(url, max_connections, liveness).await?;
    MIGRATOR.run(&pool).await.context("apply migrations")?;
    Ok(pool)
}
