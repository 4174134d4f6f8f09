//! A private PostgreSQL primary and streaming standby for the failover tests and the chaos run's
//! `--pg-failovers`: two clusters made by `initdb` and `pg_basebackup` in a directory of their
//! own, each on a free port of its own, run as the `postgres` user (`initdb` refuses root) with
//! the binaries of `PG_BIN` (default `/usr/lib/postgresql/15/bin`). It never touches the
//! machine's own cluster. Replication is synchronous (`synchronous_standby_names = '*'`,
//! `synchronous_commit = on`: no commit is acknowledged before the standby has flushed it) or
//! asynchronous. The pair can kill its primary (`pg_ctl -m immediate stop`), promote the
//! standby, make a new standby of the old primary's node from the new primary, restart the
//! primary, and cut the standby's WAL receipt (`primary_conninfo = ''`) so that commits
//! acknowledged afterwards are on the primary only. Both clusters are stopped and their
//! directory removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sqlx::{Connection, PgConnection};

/// How long a cluster may take to start, stop or be promoted.
const CTL_WAIT_SECS: &str = "120";

/// Replication mode of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit is acknowledged once the standby has flushed it.
    Synchronous,
    /// A commit is acknowledged once the primary has it; the standby follows when it can.
    Asynchronous,
}

/// One cluster of the pair.
#[derive(Debug, Clone)]
struct Node {
    data: PathBuf,
    port: u16,
}

/// The two clusters; which is the primary changes at each failover.
pub struct PgPair {
    dir: tempfile::TempDir,
    bin: PathBuf,
    nodes: [Node; 2],
    primary: Mutex<usize>,
    pub replication: Replication,
}

impl PgPair {
    /// Builds the primary, starts it, makes the standby from it with `pg_basebackup`, starts
    /// that, and waits until it streams (and, synchronous, is the synchronous standby).
    pub async fn start(replication: Replication) -> anyhow::Result<PgPair> {
        let bin = PathBuf::from(
            std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into()),
        );
        anyhow::ensure!(
            bin.join("initdb").exists(),
            "no PostgreSQL binaries in {} (set PG_BIN): the failover tests need initdb, pg_ctl \
             and pg_basebackup",
            bin.display()
        );
        let dir = tempfile::Builder::new().prefix("pgpair-").tempdir()?;
        let mut pair = PgPair {
            nodes: [0, 1].map(|i| Node {
                data: dir.path().join(format!("node{i}")),
                port: 0,
            }),
            dir,
            bin,
            primary: Mutex::new(0),
            replication,
        };
        for node in &mut pair.nodes {
            node.port = free_port()?;
        }
        as_postgres_owner(pair.dir.path())?;
        pair.init_primary()?;
        pair.make_standby(1)?;
        pair.wait_streaming(Duration::from_secs(60)).await?;
        Ok(pair)
    }

    /// The index of the current primary.
    pub fn primary(&self) -> usize {
        *self.primary.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn standby(&self) -> usize {
        1 - self.primary()
    }

    /// `postgres://postgres@127.0.0.1:<port>` of node `i`.
    pub fn node_url(&self, i: usize) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.nodes[i].port)
    }

    /// A libpq-style URL naming both nodes, for `database`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// Runs a PostgreSQL program as the `postgres` user.
    fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        run_as_postgres(&self.bin, self.dir.path(), program, args)
    }

    fn data(&self, i: usize) -> &str {
        self.nodes[i].data.to_str().unwrap_or_default()
    }

    fn log_path(&self, i: usize) -> String {
        self.dir
            .path()
            .join(format!("node{i}.log"))
            .display()
            .to_string()
    }

    /// Settings both nodes share (the standby's come from the primary's files by the base
    /// backup; its port is appended after).
    fn conf(&self, i: usize) -> String {
        let sync = match self.replication {
            Replication::Synchronous => {
                "synchronous_standby_names = '*'\nsynchronous_commit = on\n"
            }
            Replication::Asynchronous => "synchronous_standby_names = ''\n",
        };
        format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             max_connections = 300\nshared_buffers = 32MB\nwal_level = replica\n\
             max_wal_senders = 5\nwal_keep_size = 512MB\nhot_standby = on\n\
             fsync = off\nwal_receiver_status_interval = 1s\n{sync}",
            self.nodes[i].port,
            self.dir.path().display()
        )
    }

    fn append_conf(&self, i: usize, text: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let path = self.nodes[i].data.join("postgresql.conf");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        f.write_all(text.as_bytes())?;
        Ok(())
    }

    fn init_primary(&self) -> anyhow::Result<()> {
        self.run(
            "initdb",
            &[
                "-D",
                self.data(0),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        self.append_conf(0, &self.conf(0))?;
        self.start_node(0)
    }

    fn start_node(&self, i: usize) -> anyhow::Result<()> {
        let log = self.log_path(i);
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data(i),
                "-l",
                &log,
                "-w",
                "-t",
                CTL_WAIT_SECS,
                "start",
            ],
        )
    }

    /// Makes node `i` a standby of the current primary: a fresh base backup (its old data
    /// goes), its own port, then started.
    fn make_standby(&self, i: usize) -> anyhow::Result<()> {
        let data = &self.nodes[i].data;
        if data.exists() {
            std::fs::remove_dir_all(data).with_context(|| format!("remove {}", data.display()))?;
        }
        let port = self.nodes[self.primary()].port.to_string();
        let name = format!("application_name=node{i}");
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                self.data(i),
                "-X",
                "stream",
                "-R",
                "-c",
                "fast",
                "-d",
                &name,
            ],
        )?;
        self.append_conf(i, &self.conf(i))?;
        self.start_node(i)
    }

    /// Waits until the standby streams from the primary (synchronous: as its synchronous
    /// standby).
    pub async fn wait_streaming(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let wanted = match self.replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        loop {
            let state: Option<String> = match self.admin(self.primary()).await {
                Ok(mut c) => sqlx::query_scalar(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'",
                )
                .fetch_optional(&mut c)
                .await
                .ok()
                .flatten(),
                Err(_) => None,
            };
            if state.as_deref() == Some(wanted) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the standby does not stream ({wanted}) after {within:?}: {state:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A connection to node `i`'s `postgres` database.
    pub async fn admin(&self, i: usize) -> anyhow::Result<PgConnection> {
        let url = format!("{}/postgres", self.node_url(i));
        PgConnection::connect(&url)
            .await
            .with_context(|| format!("connect to {url}"))
    }

    /// Stops the primary with `-m immediate` (no checkpoint, no goodbye to the clients).
    pub fn kill_primary(&self) -> anyhow::Result<()> {
        let p = self.primary();
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data(p),
                "-m",
                "immediate",
                "-w",
                "-t",
                CTL_WAIT_SECS,
                "stop",
            ],
        )
    }

    /// Promotes the standby and waits until it accepts writes; it is the primary from now on.
    pub fn promote(&self) -> anyhow::Result<()> {
        let s = self.standby();
        self.run(
            "pg_ctl",
            &["-D", self.data(s), "-w", "-t", CTL_WAIT_SECS, "promote"],
        )?;
        *self.primary.lock().unwrap_or_else(|e| e.into_inner()) = s;
        Ok(())
    }

    /// A failover: the primary killed, the standby promoted. Returns how long the promotion
    /// took after the kill.
    pub fn fail_over(&self) -> anyhow::Result<Duration> {
        self.kill_primary()?;
        let killed = Instant::now();
        self.promote()?;
        Ok(killed.elapsed())
    }

    /// After a failover: the old primary's node becomes a standby of the new primary (a new
    /// base backup), so that the pair can fail over again; waits until it streams.
    pub async fn rebuild_standby(&self) -> anyhow::Result<()> {
        let s = self.standby();
        tokio::task::block_in_place(|| self.make_standby(s))?;
        self.wait_streaming(Duration::from_secs(120)).await
    }

    /// Restarts the primary with an immediate stop (a crash of the database, no failover).
    pub fn restart_primary(&self) -> anyhow::Result<()> {
        let p = self.primary();
        let log = self.log_path(p);
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data(p),
                "-l",
                &log,
                "-m",
                "immediate",
                "-w",
                "-t",
                CTL_WAIT_SECS,
                "restart",
            ],
        )
    }

    /// Stops the standby's WAL receipt (`primary_conninfo = ''`, reloaded): from now on what
    /// the primary commits is on the primary only. Waits until the receiver is gone and
    /// returns the standby's last received position.
    pub async fn cut_replication(&self) -> anyhow::Result<String> {
        let mut standby = self.admin(self.standby()).await?;
        sqlx::query("ALTER SYSTEM SET primary_conninfo = ''")
            .execute(&mut standby)
            .await?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut standby)
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let receiving: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_wal_receiver")
                .fetch_one(&mut standby)
                .await?;
            if receiving == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!("the standby's WAL receiver did not stop");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lsn: String = sqlx::query_scalar("SELECT pg_last_wal_receive_lsn()::text")
            .fetch_one(&mut standby)
            .await?;
        Ok(lsn)
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn wait_caught_up(&self, within: Duration) -> anyhow::Result<()> {
        let mut primary = self.admin(self.primary()).await?;
        let target: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
            .fetch_one(&mut primary)
            .await?;
        let mut standby = self.admin(self.standby()).await?;
        let deadline = Instant::now() + within;
        loop {
            let behind: bool = sqlx::query_scalar(
                "SELECT pg_last_wal_replay_lsn() IS NULL OR pg_last_wal_replay_lsn() < $1::pg_lsn",
            )
            .bind(&target)
            .fetch_one(&mut standby)
            .await?;
            if !behind {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the standby did not replay up to {target} within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Both logs, for a failing test's message.
    pub fn logs(&self) -> String {
        (0..2)
            .map(|i| {
                format!(
                    "--- node{i} ---\n{}",
                    std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
                )
            })
            .collect()
    }

    fn stop_all(&self) {
        for i in 0..2 {
            if self.nodes[i].data.join("postmaster.pid").exists() {
                let _ = self.run(
                    "pg_ctl",
                    &["-D", self.data(i), "-m", "immediate", "-w", "stop"],
                );
            }
        }
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Runs `program` of the PostgreSQL binaries in `bin` with `args`, in `dir`, as the `postgres`
/// user when this process is root (initdb and pg_ctl refuse root); its output in the error.
pub(crate) fn run_as_postgres(
    bin: &Path,
    dir: &Path,
    program: &str,
    args: &[&str],
) -> anyhow::Result<()> {
    let exe = bin.join(program);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = cmd
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Gives the pair's directory to the `postgres` user when running as root (initdb refuses
/// root); otherwise the current user must be able to run PostgreSQL itself.
pub(crate) fn as_postgres_owner(dir: &Path) -> anyhow::Result<()> {
    if !is_root() {
        return Ok(());
    }
    let status = Command::new("chown")
        .args(["postgres:postgres"])
        .arg(dir)
        .status()
        .context("run chown")?;
    anyhow::ensure!(
        status.success(),
        "chown postgres {}: {status} (is there a postgres user?)",
        dir.display()
    );
    Ok(())
}

/// A port nothing listens on now.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
