//! The watcher of a pool over several servers: keeps a probe connection to the primary in use,
//! and when it stops being the one to write to, points the pool at the one that is (and under
//! Patroni ends this database's sessions on the old one).

use std::sync::Arc;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use super::observed::{observe_leaderless, observe_primary};
use super::probe::{is_writable, PROBE_INTERVAL, PROBE_TIMEOUT};
use super::servers::Servers;

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
