//! The processes of the cell benchmarks (`cells.rs`): a `ledger serve` with or without a cell
//! map, a spot-core per cell (started as that cell, `SPOT_CORE_CELL_ID`), each cell's own fresh
//! database, on the shared server or on a private PostgreSQL cluster the benchmark makes (so
//! that one cell's PostgreSQL can be stopped for real).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use crate::transfers::{bin, spawn_ready, Proc, SECRET};

/// One cell's spot-core: the process, its address (kept across a restart) and its data.
pub struct Spot {
    pub proc: Option<Proc>,
    pub addr: String,
    data: PathBuf,
    cell: Option<u16>,
}

impl Spot {
    pub(crate) fn start(data: &Path, listen: &str, cell: Option<u16>) -> anyhow::Result<Self> {
        let (proc, addr) = start_spot(data, listen, cell)?;
        Ok(Self {
            proc: Some(proc),
            addr,
            data: data.to_owned(),
            cell,
        })
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        self.proc.take();
    }

    /// Starts it again on the same address and data (retrying while the old port is taken).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match start_spot(&self.data, &self.addr, self.cell) {
                Ok((proc, _)) => {
                    self.proc = Some(proc);
                    return Ok(());
                }
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }
}

fn start_spot(data: &Path, listen: &str, cell: Option<u16>) -> anyhow::Result<(Proc, String)> {
    let mut cmd = Command::new(bin("spot-core")?);
    cmd.args(["--listen", listen, "--data-dir"])
        .arg(data)
        .env_remove(spot_core::TOKEN_ENV)
        .env_remove(spot_core::CELL_ID_ENV);
    if let Some(cell) = cell {
        cmd.env(spot_core::CELL_ID_ENV, cell.to_string());
    }
    spawn_ready(cmd, "spot-core listening on ")
}

/// A ledger and its cells.
pub struct Stack {
    pub base: String,
    pub ledger: Proc,
    pub spots: Vec<Spot>,
    /// Each cell's database URL, in cell order.
    pub databases: Vec<String>,
    /// The map, when the ledger runs under one.
    pub map: Option<cells::CellMap>,
    dir: PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.spots.clear();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// How a stack is laid out.
pub struct Layout<'a> {
    /// A short name (the databases are `ledger_bench_<name>_<cell>`).
    pub name: &'a str,
    /// `None`: today's one cell, no map; `Some(n)`: a map of n cells.
    pub cells: Option<u16>,
    /// Server URL (no database) for every cell, except those given in `private`.
    pub server: &'a str,
    /// Cells whose database lives on another server (a private cluster): (cell, server URL).
    pub private: &'a [(u16, String)],
    pub sslmode: &'a str,
}

impl Stack {
    /// Fresh databases (dropped first), a spot-core per cell, and the ledger.
    pub async fn start(layout: &Layout<'_>) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "ledger-bench-{}-{}",
            layout.name,
            ulid::Ulid::new()
        ));
        std::fs::create_dir_all(&dir)?;
        let count = layout.cells.unwrap_or(1);
        let mut databases = Vec::new();
        let mut spots = Vec::new();
        for cell in 1..=count {
            let server = layout
                .private
                .iter()
                .find(|(c, _)| *c == cell)
                .map_or(layout.server, |(_, s)| s.as_str());
            let db = format!("ledger_bench_{}_{cell}", layout.name);
            let url = format!("{server}/{db}?sslmode={}", layout.sslmode);
            fresh_database(server, &db, layout.sslmode).await?;
            databases.push(url);
            let spot_cell = layout.cells.map(|_| cell);
            spots.push(Spot::start(
                &dir.join(format!("spot{cell}")),
                "127.0.0.1:0",
                spot_cell,
            )?);
        }
        let mut cmd = Command::new(bin("ledger")?);
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("DATABASE_URL")
            .env_remove("LEDGER_CELL_MAP")
            .env_remove(spot_core::TOKEN_ENV)
            .env("LEDGER_JWT_SECRET", SECRET)
            .env("LEDGER_RATE_PER_SECOND", "off")
            .env("LEDGER_DAILY_COUNT_MAX", "off")
            .env("LEDGER_METRICS_LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "warn");
        let map = match layout.cells {
            None => {
                cmd.args(["--spot-url", &spots[0].addr])
                    .env("DATABASE_URL", &databases[0]);
                None
            }
            Some(n) => {
                let text = map_json(&databases, &spots, n);
                let path = dir.join("cells.json");
                std::fs::write(&path, &text)?;
                cmd.env("LEDGER_CELL_MAP", &path);
                Some(cells::CellMap::parse(&text, cells::MapFormat::Json)?)
            }
        };
        let (ledger, serving) = spawn_ready(cmd, "ledger serving on ")?;
        let base = serving
            .split_whitespace()
            .next()
            .context("address")?
            .to_owned();
        Ok(Self {
            base,
            ledger,
            spots,
            databases,
            map,
            dir,
        })
    }

    /// The cell of `user` (1 without a map).
    pub fn cell_of(&self, user: u64) -> u16 {
        let Some(map) = &self.map else { return 1 };
        let user = domain::UserId::new(user).expect("a user id");
        cells::Placement::of_map(map).cell_of(user).get()
    }
}

/// The map of `n` cells over `databases` and `spots`, the partitions split evenly in order.
fn map_json(databases: &[String], spots: &[Spot], n: u16) -> String {
    let n = usize::from(n);
    let cells: Vec<_> = (0..n)
        .map(|i| {
            let (from, to) = (i * 256 / n, (i + 1) * 256 / n - 1);
            json!({"id": i + 1, "database_url": databases[i], "spot": spots[i].addr,
                   "partitions": [format!("{from}-{to}")]})
        })
        .collect();
    json!({"partitions": 256, "cells": cells}).to_string()
}

/// Drops `db` on `server` if it exists and makes it again, migrated.
pub(crate) async fn fresh_database(server: &str, db: &str, sslmode: &str) -> anyhow::Result<()> {
    use sqlx::ConnectOptions;
    let admin = format!("{server}/postgres?sslmode={sslmode}")
        .parse::<sqlx::postgres::PgConnectOptions>()
        .context("parse server URL")?;
    let mut conn = admin.connect().await.context("connect to PostgreSQL")?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    let pool = schema::prepare(&format!("{server}/{db}?sslmode={sslmode}"), 2).await?;
    pool.close().await;
    Ok(())
}

/// A private PostgreSQL cluster on a free loopback port, its data in a temporary directory; as
/// root every command runs as the `postgres` user. Stopped (immediate) when dropped.
pub struct PrivateCluster {
    bindir: PathBuf,
    data: PathBuf,
    pub port: u16,
    dir: PathBuf,
}

impl PrivateCluster {
    pub fn start() -> anyhow::Result<Self> {
        let bindir = pg_bindir()?;
        let dir = std::env::temp_dir().join(format!("ledger-bench-pg-{}", ulid::Ulid::new()));
        std::fs::create_dir_all(&dir)?;
        let data = dir.join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir))?;
        }
        let initdb = bindir.join("initdb");
        run(as_postgres(&initdb)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data))?;
        let cluster = Self {
            bindir,
            data,
            port,
            dir,
        };
        cluster.pg_ctl_start()?;
        Ok(cluster)
    }

    pub fn server_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// `pg_ctl start`, waiting until it accepts connections.
    pub fn pg_ctl_start(&self) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=60",
            self.port,
            self.dir.display()
        );
        run(as_postgres(&self.bindir.join("pg_ctl"))
            .args(["start", "-w", "-t", "30", "-D"])
            .arg(&self.data)
            .args(["-l"])
            .arg(self.dir.join("server.log"))
            .args(["-o", &options]))
    }

    /// `pg_ctl stop -m immediate`: the server is gone at once, as a crash leaves it.
    pub fn stop_immediate(&self) -> anyhow::Result<()> {
        run(as_postgres(&self.bindir.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(&self.data))
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        self.stop_immediate().ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The newest installed PostgreSQL's binaries (`pg_config --bindir`, else /usr/lib/postgresql).
fn pg_bindir() -> anyhow::Result<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() && !dir.is_empty() {
            dirs.push(PathBuf::from(dir));
        }
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((version, e.path().join("bin")))
        })
        .collect();
    debian.sort_by_key(|d| std::cmp::Reverse(d.0));
    dirs.extend(debian.into_iter().map(|(_, d)| d));
    dirs.into_iter()
        .find(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        .context("no PostgreSQL binaries (initdb, pg_ctl) found")
}
