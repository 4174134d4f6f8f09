//! One private PostgreSQL cluster, for a test that stops a database for real without touching
//! the machine's own server (which every other test uses): a cell of the cells tests. Made by
//! `initdb` in a directory of its own, on a free port of its own, run as the `postgres` user
//! when the test runs as root (`initdb` refuses root), with the binaries of `PG_BIN` (default
//! `/usr/lib/postgresql/15/bin`), as `pg_pair.rs` makes its two. It can be stopped with
//! `-m immediate` (a power cut: no checkpoint, every client cut off) and started again on the
//! same port and data. Stopped and removed on drop.

use std::path::PathBuf;

use anyhow::Context;

use crate::pg_pair::{as_postgres_owner, free_port, run_as_postgres};

/// How long the cluster may take to start or stop.
const CTL_WAIT_SECS: &str = "120";

/// The cluster.
pub struct PgSolo {
    dir: tempfile::TempDir,
    bin: PathBuf,
    data: PathBuf,
    pub port: u16,
}

impl PgSolo {
    /// Initializes the cluster and starts it.
    pub fn start() -> anyhow::Result<PgSolo> {
        let bin = PathBuf::from(
            std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into()),
        );
        anyhow::ensure!(
            bin.join("initdb").exists(),
            "no PostgreSQL binaries in {} (set PG_BIN)",
            bin.display()
        );
        let dir = tempfile::Builder::new().prefix("pgsolo-").tempdir()?;
        let solo = PgSolo {
            data: dir.path().join("data"),
            port: free_port()?,
            dir,
            bin,
        };
        as_postgres_owner(solo.dir.path())?;
        let data = solo.data_str();
        solo.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             max_connections = 200\nshared_buffers = 32MB\nfsync = off\n",
            solo.port,
            solo.dir.path().display()
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(solo.data.join("postgresql.conf"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, conf.as_bytes()))
            .context("append to postgresql.conf")?;
        solo.start_again()?;
        Ok(solo)
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Stops it with `-m immediate`: no checkpoint, every connection cut.
    pub fn stop_immediate(&self) -> anyhow::Result<()> {
        let data = self.data_str();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-m",
                "immediate",
                "-w",
                "-t",
                CTL_WAIT_SECS,
                "stop",
            ],
        )
    }

    /// Starts it (again), on the same port and data, and waits until it accepts connections.
    pub fn start_again(&self) -> anyhow::Result<()> {
        let data = self.data_str();
        let log = self.dir.path().join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-t", CTL_WAIT_SECS, "start"],
        )
    }

    /// Its server log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn data_str(&self) -> String {
        self.data.display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        run_as_postgres(&self.bin, self.dir.path(), program, args)
    }
}

impl Drop for PgSolo {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let data = self.data_str();
            let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        }
    }
}
