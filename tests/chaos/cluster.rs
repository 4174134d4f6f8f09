//! The processes of the chaos run: one spot-core and several `ledger serve`, started with the
//! run's settings, killed with SIGKILL and started again on the same data (spot-core on the same
//! address), and noticed when one exits on its own (a process must ride through a PostgreSQL
//! restart, not die of it). Every process's stderr is appended to a log file of its own.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{Config, Snapshots, SECRET};
use crate::netns::{Net, PathTo, Target};

/// spot-core's token in a network-fault run (it listens beyond loopback there).
pub(super) const SPOT_TOKEN: &str = "chaos-run-spot-core-token-of-some-length";

/// Where the processes run in a network-fault run: the namespaces, and the database URLs the
/// ledgers use (through the forwarders), one per cell in cell order (one for a run without
/// cells). With cells these are what the map names, so every cell's database path can be cut.
pub(super) struct NetPlace {
    pub net: Arc<Net>,
    pub ledger_db_urls: Vec<String>,
}

/// How long a process may take to print its ready line, retries included (a ledger started
/// while PostgreSQL restarts waits for it).
const READY_MAX: Duration = Duration::from_secs(60);

/// A child process killed when dropped.
pub(super) struct Proc(Child);

impl Proc {
    /// True when it has exited by itself.
    fn exited(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(Some(_)) | Err(_))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// Spawns and returns once it printed a line starting with `ready`; retries while the port of a
/// killed predecessor is not free yet, or while what it needs at start is not up yet.
fn spawn_ready(
    mut make: impl FnMut() -> Command,
    ready: &str,
    log: &Path,
) -> anyhow::Result<(Proc, String)> {
    let deadline = Instant::now() + READY_MAX;
    loop {
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        let mut child = make()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .context("spawn")?;
        let stdout = child.stdout.take().context("stdout")?;
        // The lines are read on their own thread, so a process that hangs silently (it once
        // waited forever on a half-open database connection at startup) is given up at the
        // deadline instead of holding the run.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    // Nobody waits any more: the rest is drained unread.
                    continue;
                }
            }
        });
        // Other lines may come first (`ledger metrics on ...`); the ready line ends the wait.
        while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if let Some(rest) = line.strip_prefix(ready) {
                let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                return Ok((Proc(child), addr));
            }
        }
        child.kill().ok();
        child.wait().ok();
        if Instant::now() > deadline {
            bail!(
                "process did not become ready within {READY_MAX:?} (log: {})",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What every (re)start needs.
pub(super) struct Settings {
    pub bin_dir: PathBuf,
    pub db_url: String,
    /// The run's directory: spot-core's data and archive (one of each per cell) live there.
    pub dir: PathBuf,
    pub logs: PathBuf,
    /// With several cells: each cell's database URL, in cell order (cell 1 first); empty for one
    /// cell (`db_url`, no map).
    pub cell_dbs: Vec<String>,
    /// The cell map the ledgers are started with (written once every cell's spot-core listens).
    pub map: Option<PathBuf>,
    pub snapshots: Option<Snapshots>,
    pub horizon: bool,
    /// The idempotency retention with the horizon on.
    pub retention_secs: u64,
    pub audit_interval_secs: u64,
    /// Set in a network-fault run.
    pub net: Option<NetPlace>,
    /// The tamper-evident log's signing key, the same for every ledger of the run.
    pub log_key: PathBuf,
    /// Under HA: every cell's processes (its spot-core is three replicas, started there).
    pub ha: Option<Arc<super::ha::Cells>>,
}

impl Settings {
    pub fn new(cfg: &Config, db_url: String, dir: &Path) -> anyhow::Result<Settings> {
        let settings = Settings {
            bin_dir: cfg.bin_dir.clone(),
            db_url,
            dir: dir.to_path_buf(),
            logs: dir.join("logs"),
            cell_dbs: Vec::new(),
            map: None,
            snapshots: cfg.snapshots,
            horizon: cfg.horizon,
            // A cid claim is re-keyed once half a retention plus a grace old, which assumes a
            // creation commits within that; after a failover, commits wait seconds for the new
            // synchronous standby, and a network fault delays them up to the TCP user timeout
            // (10 s), so runs with either keep 30 s (production: 7 days). A creation delayed past
            // the re-key is a known open bug (docs/adr/0010-network-faults.md, chaos end check).
            retention_secs: if cfg.pg_failovers > 0 || cfg.net_faults > 0 || cfg.ha.is_some() {
                30
            } else {
                5
            },
            audit_interval_secs: cfg.audit_interval_secs,
            net: None,
            log_key: super::log::make_key(dir)?,
            ha: None,
        };
        std::fs::create_dir_all(&settings.logs)?;
        Ok(settings)
    }

    /// The cells' ids: `[None]` for one cell without a map, else `Some(1..=N)`.
    pub fn cells(&self) -> Vec<Option<u16>> {
        match self.cell_dbs.len() {
            0 => vec![None],
            n => (1..=n).map(|c| u16::try_from(c).ok()).collect(),
        }
    }

    /// spot-core's data directory, archive and log file for `cell` (`None`: the one cell).
    pub fn spot_paths(&self, cell: Option<u16>) -> (PathBuf, PathBuf, PathBuf) {
        match cell {
            None => (
                self.dir.join("spot"),
                self.dir.join("archive"),
                self.logs.join("spot-core.log"),
            ),
            Some(c) => (
                self.dir.join(format!("spot-{c}")),
                self.dir.join(format!("archive-{c}")),
                self.logs.join(format!("spot-core-{c}.log")),
            ),
        }
    }

    pub fn spawn_spot(&self, cell: Option<u16>, listen: &str) -> anyhow::Result<(Proc, String)> {
        let exe = self.bin_dir.join("spot-core");
        let (data, archive, log) = self.spot_paths(cell);
        std::fs::create_dir_all(&archive)?;
        spawn_ready(
            || {
                let mut c = match &self.net {
                    Some(place) => {
                        let mut c = place.net.command(&place.net.spot_ns, &exe);
                        c.env(spot_core::TOKEN_ENV, SPOT_TOKEN);
                        c
                    }
                    None => Command::new(&exe),
                };
                c.arg("--listen")
                    .arg(listen)
                    .arg("--data-dir")
                    .arg(&data)
                    .env_remove(spot_core::CELL_ID_ENV);
                if let Some(cell) = cell {
                    // It knows its cell: a ledger's `hello` naming another cell is refused.
                    c.env(spot_core::CELL_ID_ENV, cell.to_string());
                }
                if let Some(s) = self.snapshots {
                    // Frequent snapshots and small segments, so compaction and the archive
                    // run many times during the run.
                    c.arg("--snapshot-every-records")
                        .arg(s.every_records.to_string())
                        .arg("--segment-bytes")
                        .arg(s.segment_bytes.to_string())
                        .arg("--archive-dir")
                        .arg(&archive);
                }
                c
            },
            "spot-core listening on ",
            &log,
        )
    }

    pub fn spawn_ledger(&self, i: usize, spot: &str) -> anyhow::Result<(Proc, String)> {
        let exe = self.bin_dir.join("ledger");
        spawn_ready(
            || {
                let (mut c, listen, db_url) = match &self.net {
                    Some(place) => {
                        let mut c = place.net.command(&place.net.ledger_ns, &exe);
                        c.env(spot_core::TOKEN_ENV, SPOT_TOKEN);
                        let listen = format!("{}:0", place.net.ledger_ip);
                        (c, listen, place.ledger_db_urls[0].as_str())
                    }
                    None => (
                        Command::new(&exe),
                        "127.0.0.1:0".into(),
                        self.db_url.as_str(),
                    ),
                };
                c.args(["serve", "--listen", &listen]);
                match &self.map {
                    // Every cell's database and spot-core are in the map.
                    Some(map) => c.env("LEDGER_CELL_MAP", map).env_remove("DATABASE_URL"),
                    None => c
                        .args(["--spot-url", spot])
                        .env("DATABASE_URL", db_url)
                        .env_remove("LEDGER_CELL_MAP"),
                };
                c.args(["--spot-timeout-ms", "1000"])
                    .env("LEDGER_JWT_SECRET", SECRET)
                    .env("RUST_LOG", "warn")
                    .env("LEDGER_RATE_PER_SECOND", "off")
                    .env("LEDGER_DAILY_COUNT_MAX", "off")
                    .env("LEDGER_RECOVERY_STALE_MS", "1000")
                    .env("LEDGER_RECOVERY_INTERVAL_MS", "200")
                    .env("LEDGER_RETRY_BACKOFF_MS_BASE", "50")
                    .env("LEDGER_RETRY_BACKOFF_MS_MAX", "1000")
                    .env("LEDGER_RECOVERY_LEASE_MS", "15000")
                    .env("LEDGER_LOG_SIGNING_KEY_FILE", &self.log_key)
                    .env("LEDGER_LOG_CHECKPOINT_EVENTS", "500")
                    .env_remove("LEDGER_FAILPOINT")
                    .env_remove("LEDGER_ALLOW_FAILPOINTS");
                if self.horizon {
                    // Remembered keys older than the retention (5 s) are forgotten, the horizon moved twice a
                    // second: it passes most of the run's transfers while others still retry.
                    c.env(
                        "LEDGER_IDEMPOTENCY_RETENTION_SECS",
                        self.retention_secs.to_string(),
                    )
                    .env("LEDGER_HORIZON_INTERVAL_MS", "500");
                }
                if self.audit_interval_secs > 0 {
                    c.env(
                        "LEDGER_INVARIANT_INTERVAL_SECS",
                        self.audit_interval_secs.to_string(),
                    );
                }
                c
            },
            "ledger serving on ",
            &self.logs.join(format!("ledger-{i}.log")),
        )
    }
}

/// One cell's spot-core (the only one without a map).
pub(super) struct Spot {
    /// Its cell (`None`: the one cell, started without `--cell-id`).
    pub cell: Option<u16>,
    /// Its address as the run's own checks reach it.
    pub addr: String,
    /// What it listens on, again at every restart.
    listen: String,
    /// Its address as the ledgers reach it.
    for_ledgers: String,
    /// Held across a kill and the start after it, so two of them never overlap.
    life: Mutex<()>,
    proc: Mutex<Option<Proc>>,
}

/// The running processes.
pub(super) struct Cluster {
    pub settings: Settings,
    /// One spot-core per cell, in cell order.
    pub spots: Vec<Spot>,
    ledgers: Mutex<Vec<(Option<Proc>, String)>>,
}

impl Cluster {
    /// Starts a spot-core per cell on a free port (with several cells, writes the map naming
    /// them and each cell's database) and `ledgers` ledger processes against them.
    pub fn start(mut settings: Settings, ledgers: usize) -> anyhow::Result<Cluster> {
        let any = if settings.net.is_some() {
            "0.0.0.0:0"
        } else {
            "127.0.0.1:0"
        };
        let mut spots = Vec::new();
        if let Some(ha) = &settings.ha {
            // Under HA each cell's spot-core is its three replicas, already running: the ledgers
            // and the run's checks are given every replica's address (the client finds the
            // leader).
            for (cell, place) in settings.cells().into_iter().zip(&ha.places) {
                let addrs = place.cell.blocking_lock().spot_addrs();
                spots.push(Spot {
                    cell,
                    addr: addrs.clone(),
                    listen: addrs.clone(),
                    for_ledgers: addrs,
                    life: Mutex::new(()),
                    proc: Mutex::new(None),
                });
            }
        }
        for cell in settings.cells().into_iter().skip(spots.len()) {
            let (spot, listen) = settings.spawn_spot(cell, any)?;
            let (addr, for_ledgers) = match &settings.net {
                Some(place) => {
                    let port: u16 = listen
                        .rsplit_once(':')
                        .and_then(|(_, p)| p.parse().ok())
                        .with_context(|| format!("spot-core's address {listen}"))?;
                    let for_ledgers =
                        std::net::SocketAddrV4::new(place.net.spot_ip_from_ledger, port);
                    let path = Target {
                        path: PathTo::Spot,
                        cell,
                    };
                    place.net.set_peer(path, for_ledgers);
                    (
                        format!("{}:{port}", place.net.spot_ip_from_root),
                        for_ledgers.to_string(),
                    )
                }
                None => (listen.clone(), listen.clone()),
            };
            spots.push(Spot {
                cell,
                addr,
                listen,
                for_ledgers,
                life: Mutex::new(()),
                proc: Mutex::new(Some(spot)),
            });
        }
        if !settings.cell_dbs.is_empty() {
            let addrs: Vec<&str> = spots.iter().map(|s| s.for_ledgers.as_str()).collect();
            // In a network-fault run the ledgers reach each cell's database through its
            // forwarder (the run's own checks go straight to it).
            let dbs = match &settings.net {
                Some(place) => &place.ledger_db_urls,
                None => &settings.cell_dbs,
            };
            let path = settings.dir.join("cells.json");
            std::fs::write(&path, super::cells::map_json(dbs, &addrs))?;
            settings.map = Some(path);
        }
        let mut procs = Vec::new();
        for i in 0..ledgers.max(1) {
            let (p, base) = settings.spawn_ledger(i, &spots[0].for_ledgers)?;
            procs.push((Some(p), base));
        }
        Ok(Cluster {
            settings,
            spots,
            ledgers: Mutex::new(procs),
        })
    }

    pub fn ledger_count(&self) -> usize {
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The base URLs of the ledgers that are up.
    pub fn bases(&self) -> Vec<String> {
        let ledgers = self.ledgers.lock().unwrap_or_else(|e| e.into_inner());
        ledgers
            .iter()
            .filter(|(p, _)| p.is_some())
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// SIGKILLs the spot-core of the cell at `index` (0: the first), waits `pause`, and starts
    /// it again on the same address and data.
    pub fn kill_spot_and_restart(&self, index: usize, pause: Duration) -> anyhow::Result<()> {
        self.kill_spot_then(index, || std::thread::sleep(pause))
    }

    /// SIGKILLs the spot-core at `index`, runs `meanwhile`, and starts it again on the same
    /// address.
    pub fn kill_spot_then<T>(
        &self,
        index: usize,
        meanwhile: impl FnOnce() -> T,
    ) -> anyhow::Result<T> {
        if let Some(ha) = &self.settings.ha {
            // Under HA: a random replica of the cell.
            return ha.places[index].kill_random_replica(meanwhile);
        }
        let spot = &self.spots[index];
        let _life = spot.life.lock().unwrap_or_else(|e| e.into_inner());
        drop(spot.proc.lock().unwrap_or_else(|e| e.into_inner()).take());
        let out = meanwhile();
        let (p, addr) = self.settings.spawn_spot(spot.cell, &spot.listen)?;
        anyhow::ensure!(addr == spot.listen, "spot-core moved to {addr}");
        *spot.proc.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        Ok(out)
    }

    /// A client of the spot-core at `index` for the run's own requests (with the token where
    /// one is set).
    pub fn spot_client(&self, index: usize, timeout: Duration) -> spot_core::client::SpotClient {
        let token = self.settings.net.as_ref().map(|_| SPOT_TOKEN.to_owned());
        spot_core::client::SpotClient::with_token(self.spots[index].addr.clone(), timeout, token)
    }

    /// Where the spot-core at `index` moves its compacted segments.
    pub fn archive(&self, index: usize) -> PathBuf {
        if let Some(ha) = &self.settings.ha {
            return ha.places[index].archive.clone();
        }
        self.settings.spot_paths(self.spots[index].cell).1
    }

    pub fn kill_ledger_and_restart(&self, i: usize, pause: Duration) -> anyhow::Result<()> {
        drop(
            self.ledgers.lock().unwrap_or_else(|e| e.into_inner())[i]
                .0
                .take(),
        );
        std::thread::sleep(pause);
        let (p, base) = self.settings.spawn_ledger(i, &self.spots[0].for_ledgers)?;
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner())[i] = (Some(p), base);
        Ok(())
    }

    /// Processes that exited by themselves since the last look: each is named, and started
    /// again so the run goes on.
    pub fn restart_exited(&self) -> anyhow::Result<Vec<String>> {
        let mut exited = Vec::new();
        for (index, spot) in self.spots.iter().enumerate() {
            let dead = spot
                .proc
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .is_some_and(Proc::exited);
            if dead {
                exited.push(match spot.cell {
                    None => "spot-core".to_owned(),
                    Some(c) => format!("spot-core of cell {c}"),
                });
                self.kill_spot_and_restart(index, Duration::ZERO)?;
            }
        }
        for i in 0..self.ledger_count() {
            let dead = self.ledgers.lock().unwrap_or_else(|e| e.into_inner())[i]
                .0
                .as_mut()
                .is_some_and(Proc::exited);
            if dead {
                exited.push(format!("ledger {i}"));
                self.kill_ledger_and_restart(i, Duration::ZERO)?;
            }
        }
        Ok(exited)
    }
}
