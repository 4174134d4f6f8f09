//! The PostgreSQL cluster behind a test server URL, for the tests that stop or restart it for real
//! (the `pg_restart` test binary and the chaos run): which local cluster serves the URL's port
//! (`pg_lsclusters`), an immediate stop or restart through `pg_ctlcluster` (no checkpoint, like a
//! power cut), a guard that always starts it again, and the file lock that keeps two such runs on
//! one machine apart. Whoever restarts the server must hold the lock, and must never do it under
//! the main test catalogue (cargo runs test binaries one after another, so a binary of its own).

use std::fs::File;
use std::process::Command;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sqlx::Connection;

/// How long a stopped or restarted server may take to accept connections again. Crash recovery
/// replays the WAL since the last checkpoint and then fsyncs every file it touched: on a busy
/// shared disk, with everything the test suite wrote before still in that WAL, this once took
/// 31 s of data-directory sync plus an 89 s end-of-recovery checkpoint (35,706 files).
/// [`PgCluster::settle`] keeps the redo small; this keeps a slow disk from failing a test.
pub const RECOVERY_MAX: Duration = Duration::from_secs(180);

/// The file every PostgreSQL-restarting run on this machine locks first.
pub const LOCK_PATH: &str = "/tmp/ledger-pg-restart.lock";

/// Holds the machine-wide lock until dropped; blocks while another run holds it.
pub fn lock() -> anyhow::Result<File> {
    let f = File::create(LOCK_PATH).with_context(|| format!("create {LOCK_PATH}"))?;
    f.lock().with_context(|| format!("flock {LOCK_PATH}"))?;
    Ok(f)
}

/// One local cluster as `pg_ctlcluster` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgCluster {
    pub version: String,
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl PgCluster {
    /// The local cluster listening on the port of `server_url`
    /// (`postgres://user@host:port[/db]`), from `pg_lsclusters`.
    pub fn serving(server_url: &str) -> anyhow::Result<PgCluster> {
        let options = sqlx::postgres::PgConnectOptions::from_str(server_url)
            .with_context(|| format!("parse {server_url}"))?;
        let (host, port) = (options.get_host().to_owned(), options.get_port());
        let out = Command::new("pg_lsclusters")
            .arg("-h")
            .output()
            .context("run pg_lsclusters")?;
        anyhow::ensure!(out.status.success(), "pg_lsclusters: {}", out.status);
        let listing = String::from_utf8_lossy(&out.stdout);
        cluster_on_port(&listing, port)
            .map(|(version, name)| PgCluster {
                version,
                name,
                host,
                port,
            })
            .with_context(|| format!("no local PostgreSQL cluster on port {port}:\n{listing}"))
    }

    fn ctl(&self, action: &str, immediate: bool) -> anyhow::Result<()> {
        let mut cmd = Command::new("pg_ctlcluster");
        cmd.args([
            "--skip-systemctl-redirect",
            &self.version,
            &self.name,
            action,
        ]);
        if immediate {
            cmd.args(["-m", "immediate"]);
        }
        let status = cmd.status().context("run pg_ctlcluster")?;
        if !status.success() {
            bail!(
                "pg_ctlcluster {} {} {action}: {status}",
                self.version,
                self.name
            );
        }
        Ok(())
    }

    /// For the holder of [`lock`], before it stops the server: waits until it accepts connections
    /// (the previous holder's restart may still be recovering), then takes a checkpoint, so that
    /// the crash recovery of the stop to come replays only what this run writes after it, not
    /// everything the test suite wrote since the last timed checkpoint (hundreds of MB of
    /// `CREATE DATABASE`s). The stop itself stays a power cut: what is committed after the
    /// checkpoint survives only through WAL replay, and that is what the tests check.
    pub async fn settle(&self, server_url: &str) -> anyhow::Result<()> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.wait_ready(RECOVERY_MAX)).await??;
        let mut admin = admin(server_url).await?;
        sqlx::query("CHECKPOINT")
            .execute(&mut admin)
            .await
            .context("CHECKPOINT")?;
        admin.close().await.ok();
        Ok(())
    }

    /// Stops it without a checkpoint (`-m immediate`). Hold a [`StartOnDrop`] first.
    pub fn stop_immediate(&self) -> anyhow::Result<()> {
        self.ctl("stop", true)
    }

    /// Restarts it with an immediate stop and waits until it accepts connections again.
    pub fn restart_immediate(&self) -> anyhow::Result<()> {
        let _start = self.start_on_drop();
        self.ctl("restart", true)?;
        self.wait_ready(RECOVERY_MAX)
    }

    /// True when the server accepts connections (`pg_isready`).
    pub fn ready(&self) -> bool {
        Command::new("pg_isready")
            .args(["-q", "-h", &self.host, "-p", &self.port.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Waits up to `max` for the server to accept connections.
    pub fn wait_ready(&self, max: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + max;
        while !self.ready() {
            if Instant::now() > deadline {
                bail!(
                    "PostgreSQL {} {} not ready after {max:?}",
                    self.version,
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Starts it (again) until it accepts connections, for up to [`RECOVERY_MAX`]; never fails,
    /// for guards: a start of a running cluster fails harmlessly and `pg_isready` decides.
    pub fn ensure_started(&self) {
        let deadline = Instant::now() + RECOVERY_MAX;
        while !self.ready() && Instant::now() < deadline {
            let _ = self.ctl("start", false);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A guard that starts the cluster again when dropped, whatever happened in between.
    pub fn start_on_drop(&self) -> StartOnDrop {
        StartOnDrop(self.clone())
    }
}

/// Starts its cluster again when dropped (also on panic) and waits until it accepts.
pub struct StartOnDrop(PgCluster);

impl Drop for StartOnDrop {
    fn drop(&mut self) {
        self.0.ensure_started();
    }
}

/// A connection to the server's `postgres` database, for statements about the server itself.
async fn admin(server_url: &str) -> anyhow::Result<sqlx::PgConnection> {
    sqlx::PgConnection::connect(&format!("{server_url}/postgres"))
        .await
        .with_context(|| format!("connect to {server_url}/postgres"))
}

/// Drops a test's or a run's database, ending its connections. Done for every one that passed:
/// a server's crash recovery syncs every file of every database before it accepts connections,
/// so leftovers make each restart of the tests that stop it slower.
pub async fn drop_database(server_url: &str, database: &str) -> anyhow::Result<()> {
    let mut admin = admin(server_url).await?;
    sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    ))
    .execute(&mut admin)
    .await
    .with_context(|| format!("drop {database}"))?;
    admin.close().await.ok();
    Ok(())
}

/// `(version, cluster)` of the row of `pg_lsclusters -h` whose port is `port`.
fn cluster_on_port(listing: &str, port: u16) -> Option<(String, String)> {
    listing.lines().find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        match cols.as_slice() {
            [version, name, p, ..] if p.parse() == Ok(port) => {
                Some(((*version).to_owned(), (*name).to_owned()))
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::cluster_on_port;

    #[test]
    fn the_cluster_is_found_by_its_port() {
        let listing = "15 main     5432 online postgres /var/lib/postgresql/15/main /var/log/x.log\n\
                       16 other    5499 down   postgres /var/lib/postgresql/16/other /var/log/y.log\n";
        assert_eq!(
            cluster_on_port(listing, 5499),
            Some(("16".into(), "other".into()))
        );
        assert_eq!(
            cluster_on_port(listing, 5432),
            Some(("15".into(), "main".into()))
        );
        assert_eq!(cluster_on_port(listing, 5433), None);
    }
}
