//! The chaos run (FND-001..006, INV-004): N transfers in both directions through
//! several real `ledger serve` processes while those and spot-core are killed with SIGKILL at
//! random moments, again and again, and PostgreSQL is restarted with `-m immediate` (a power cut
//! for the database) a few times; spot-core takes snapshots every few hundred records, rotates
//! small WAL segments and archives the compacted ones, and the ledgers advance the idempotency
//! horizon every half second with a 5 s retention. Then every transfer must reach a terminal
//! state, every `req_id` must be applied at most once in each system and exactly as its final
//! state says, conservation must hold, spot-core's journal must still be readable from seq 1
//! (through the archive) and add up to its balances, and the ledger's own exact check, incremental
//! and full, must answer ok, and `ledger verify` must find the tamper-evident log, kept by every
//! ledger through it all, intact. Used by `cargo run -p tests --bin chaos` and by smaller tests.

mod cells;
mod check;
mod cluster;
mod failover;
pub mod ha;
pub mod log;
mod moves;
pub mod netfaults;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use rand::Rng;
use rust_decimal::Decimal;
use serde_json::json;
use spot_core::protocol::{CoreStatus, Request, Response};

use crate::netns::{Fault, PathTo};
use crate::pg_ctl::PgCluster;
use crate::pg_pair::{PgPair, Replication};
pub use check::spot_journal;
use cluster::{Cluster, Settings};
pub use failover::FailoverTimes;
pub use moves::MovesReport;

/// The shared secret of the chaos run's ledger processes.
const SECRET: &str = "chaos-run-secret-of-at-least-32-bytes-long";
/// What each user starts with in FUNDING.
const DEPOSIT_PER_USER: i64 = 1_000;

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub transfers: usize,
    pub crashes_min: usize,
    pub users: u64,
    pub clients: usize,
    pub ledgers: usize,
    pub kill_ledgers: bool,
    pub kill_spot: bool,
    /// PostgreSQL restarts (`pg_ctlcluster ... restart -m immediate` of the cluster serving
    /// `server_url`), spread evenly over the transfers. Holds [`crate::pg_ctl::lock`] for the run.
    pub pg_restarts: usize,
    /// Failovers: the run's database lives on a private primary and synchronous standby
    /// (`crate::pg_pair`) instead of `server_url`, whose primary is killed with `-m immediate`
    /// and the standby promoted this many times, spread over the transfers (and a new standby
    /// made each time). `pg_restarts` then restart the pair's primary. With cells the pair is
    /// the last cell's database, the others' as without failovers.
    pub pg_failovers: usize,
    /// spot-core's snapshot and WAL segment settings, compacted segments archived (`None`:
    /// spot-core's defaults, no archive).
    pub snapshots: Option<Snapshots>,
    /// The ledgers advance the idempotency horizon every 500 ms with a 5 s retention.
    pub horizon: bool,
    /// Seconds between the ledgers' periodic conservation checks (which let spot-core
    /// compact what they consumed); 0 leaves the ledger's default.
    pub audit_interval_secs: u64,
    /// Where `ledger` and `spot-core` are built.
    pub bin_dir: PathBuf,
    /// A PostgreSQL server; the run creates its own database there.
    pub server_url: String,
    /// How long everything may take to settle after the last crash.
    pub settle_max: Duration,
    /// Network faults spread over the transfers; any number runs every process in network
    /// namespaces of its own (root only, see `crate::netns`).
    pub net_faults: usize,
    /// The (path, fault) kinds drawn from; every one when empty.
    pub net_kinds: Vec<(PathTo, Fault)>,
    /// Transfers per request: above 1, every client sends batches of this many to
    /// `POST /api/v1/internal_transfers` (an admin's token naming each item's user).
    pub bulk: usize,
    /// Cells (ADR 0017): 1 is one database and one spot-core without a map. Above 1, each cell
    /// gets a database of its own and a spot-core started as that cell, the ledgers serve them
    /// all under a cell map, the crashes are drawn over the ledgers and every cell's spot-core,
    /// and the end check runs per cell and in total. With PostgreSQL restarts or network
    /// faults each cell's database is on a private cluster (`crate::pg_solo`): the restarts go
    /// round the cells, and so do the network faults, each on one cell's spot-core or database
    /// path (`chaos/netfaults.rs`). With failovers the last cell's database is a private
    /// synchronous pair instead, failed over (and, when a restart comes round to it, its
    /// primary restarted) while the other cells commit.
    pub cells: usize,
    /// Under HA (`--ha`, `chaos/ha.rs`): each cell an `ha::cell::HaCell` (etcd x3, a Patroni
    /// pair, three spot-core replicas), and this many of each new fault kind (a PostgreSQL
    /// machine lost, the spot-core leader's disk wiped, the spot-core leader cut off), spread
    /// over the transfers and round the cells; spot-core kills hit a random replica and
    /// `pg_restarts` become SIGKILLs of the Patroni leader's postmaster. `None`: no HA.
    pub ha: Option<usize>,
    /// Partition moves (ADR 0023) with cells, not under HA: this many started through the
    /// ledgers' admin route while the load and the faults run, back and forth between the
    /// cells, every third cancelled a moment after it starts (`chaos/moves.rs`); the end check
    /// then counts each cell's money by the final map. Ignored for one cell.
    pub moves: usize,
}

impl Config {
    /// The full run's settings for `transfers` and `crashes_min`: two ledgers and spot-core
    /// killed, snapshots ([`Snapshots::FULL_RUN`]) and the horizon on, no PostgreSQL restart.
    pub fn new(transfers: usize, crashes_min: usize, bin_dir: PathBuf, server_url: String) -> Self {
        Config {
            transfers,
            crashes_min,
            users: 20,
            clients: 16,
            ledgers: 2,
            kill_ledgers: true,
            kill_spot: true,
            pg_restarts: 0,
            pg_failovers: 0,
            snapshots: Some(Snapshots::FULL_RUN),
            horizon: true,
            audit_interval_secs: 2,
            bin_dir,
            server_url,
            settle_max: Duration::from_secs(300),
            net_faults: 0,
            net_kinds: Vec::new(),
            bulk: 1,
            cells: 1,
            ha: None,
            moves: 6,
        }
    }
}

/// How often spot-core snapshots and how small its WAL segments are during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshots {
    pub every_records: u64,
    pub segment_bytes: u64,
}

impl Snapshots {
    /// The full run's: a snapshot every 300 records, 64 KiB segments.
    pub const FULL_RUN: Snapshots = Snapshots {
        every_records: 300,
        segment_bytes: 65_536,
    };
    /// For runs of a few hundred transfers (a few hundred records): a snapshot every 100
    /// records, 16 KiB segments, so compaction and the archive still run several times.
    pub const SMALL_RUN: Snapshots = Snapshots {
        every_records: 100,
        segment_bytes: 16_384,
    };
}

/// What the run found. Zeros where zeros are due: `created`, `lost`, `duplicates`, `mismatched`,
/// `stuck`, `unanswered`; and nothing in `exited` or `problems`.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub transfers: usize,
    pub crashes: usize,
    pub ledger_crashes: usize,
    pub spot_crashes: usize,
    pub pg_restarts: usize,
    /// Each failover's times.
    pub failovers: Vec<FailoverTimes>,
    /// Answered transfers missing after the run, or found in an earlier state than answered.
    pub answered_lost: usize,
    /// Every network fault injected, with the time the ledgers took to notice it.
    pub net_faults: Vec<netfaults::Detection>,
    pub states: BTreeMap<String, usize>,
    pub created: Decimal,
    pub lost: Decimal,
    pub duplicates: usize,
    pub mismatched: usize,
    pub stuck: usize,
    pub unanswered: usize,
    /// Transfers a recovery worker had to take up (left open by a crash or an unknown outcome).
    pub resumed: usize,
    /// Processes that exited by themselves (each was started again).
    pub exited: Vec<String>,
    /// spot-core journal records read from seq 1 at the end.
    pub journal_records: usize,
    /// Events in the log at the end, and whether their feed positions are exactly 1..=that
    /// (dense, each once), after every crash and restart.
    pub feed_events: i64,
    pub feed_dense: bool,
    /// spot-core's `status` at the end (`None` from a spot-core without the op).
    pub core: Option<CoreStatus>,
    /// WAL segments moved to the archive directory.
    pub archived_segments: usize,
    /// What else the end check found wrong: the journal, the ledger's own check, a feature the
    /// run should have exercised and did not.
    pub problems: Vec<String>,
    /// The processes' logs, kept when the run is not clean.
    pub logs: Option<PathBuf>,
    /// The run's database, kept when the run is not clean (dropped otherwise).
    pub database: Option<String>,
    pub elapsed: Duration,
    /// With several cells: each cell's own end check, by cell id (the figures above are their
    /// sums); empty for one cell.
    pub cells: Vec<(u16, Report)>,
    /// The external deposits counted by the conservation check (each cell's: those of the
    /// partitions it owns at the end).
    pub deposits: Decimal,
    /// With cells: the partition moves run among the faults, and how they ended.
    pub moves: Option<MovesReport>,
    /// Under HA: every fault of one machine injected, in order, with its times.
    pub ha_faults: Vec<ha::Injected>,
    /// Under HA: what the supervisor's pass started again (a leader that stepped down, a
    /// machine brought back), by cell and name; expected, so not a finding.
    pub supervisor_started: Vec<String>,
}

impl Report {
    /// True when every figure that must be zero is, and nothing else was found wrong.
    pub fn clean(&self) -> bool {
        self.created.is_zero()
            && self.lost.is_zero()
            && self.duplicates == 0
            && self.mismatched == 0
            && self.stuck == 0
            && self.unanswered == 0
            && self.answered_lost == 0
            && self.exited.is_empty()
            && self.problems.is_empty()
            && self.cells.iter().all(|(_, r)| r.clean())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos run finished in {:.1} s",
            self.elapsed.as_secs_f64()
        )?;
        writeln!(f, "transfers:            {}", self.transfers)?;
        if !self.cells.is_empty() {
            writeln!(
                f,
                "cells:                {} (each checked on its own below; the figures here are \
                 their sums)",
                self.cells.len()
            )?;
        }
        writeln!(
            f,
            "crashes injected:     {} (ledger {}, spot-core {})",
            self.crashes, self.ledger_crashes, self.spot_crashes
        )?;
        writeln!(f, "PostgreSQL restarts:  {}", self.pg_restarts)?;
        writeln!(f, "PostgreSQL failovers: {}", self.failovers.len())?;
        // With cells, the pair is one cell's database.
        let of_cell = self
            .cells
            .iter()
            .find(|(_, r)| !r.failovers.is_empty())
            .map_or_else(String::new, |(c, _)| format!(" (cell {c})"));
        for (i, t) in self.failovers.iter().enumerate() {
            writeln!(f, "  failover {}{of_cell}: {t}", i + 1)?;
        }
        if !self.ha_faults.is_empty() || !self.supervisor_started.is_empty() {
            writeln!(f, "HA faults:            {}", self.ha_faults.len())?;
            write!(f, "{}", ha::Summary(&self.ha_faults))?;
            for i in &self.ha_faults {
                writeln!(f, "    {i}")?;
            }
            writeln!(
                f,
                "supervisor restarts:  {} ({})",
                self.supervisor_started.len(),
                self.supervisor_started.join(", ")
            )?;
        }
        if let Some(m) = &self.moves {
            writeln!(
                f,
                "partition moves:      {} started ({} cancels accepted): {} DONE, {} CANCELLED; \
                 map version {} at the end",
                m.started, m.cancels, m.done, m.cancelled, m.map_version
            )?;
        }
        writeln!(f, "answers lost:         {}", self.answered_lost)?;
        writeln!(f, "network faults:       {}", self.net_faults.len())?;
        for d in &self.net_faults {
            writeln!(f, "  {d}")?;
        }
        for (state, n) in &self.states {
            writeln!(f, "  {state:<20}{n}")?;
        }
        writeln!(f, "money created:        {}", self.created)?;
        writeln!(f, "money lost:           {}", self.lost)?;
        writeln!(f, "duplicates applied:   {}", self.duplicates)?;
        writeln!(f, "records disagreeing:  {}", self.mismatched)?;
        writeln!(f, "transfers stuck:      {}", self.stuck)?;
        writeln!(f, "requests unanswered:  {}", self.unanswered)?;
        writeln!(f, "resumed by recovery:  {}", self.resumed)?;
        writeln!(f, "exited by themselves: {}", self.exited.len())?;
        for name in &self.exited {
            writeln!(f, "  {name}")?;
        }
        writeln!(
            f,
            "feed positions:       {} events, {}",
            self.feed_events,
            if self.feed_dense {
                "exactly 1..=N, each once"
            } else {
                "NOT dense (a gap or a repeat)"
            }
        )?;
        writeln!(
            f,
            "spot-core journal:    {} records read from seq 1, {} segments archived",
            self.journal_records, self.archived_segments
        )?;
        match &self.core {
            _ if !self.cells.is_empty() => write!(f, "{}", cells::PerCell(&self.cells))?,
            Some(c) => writeln!(
                f,
                "spot-core status:     last_seq {}, snapshot_seq {} ({} bytes), wal_segments {} \
                 ({} bytes), first_seq {}, retain_after {}, remembered {}, horizon_ms {}",
                c.last_seq,
                c.snapshot_seq,
                c.snapshot_bytes,
                c.wal_segments,
                c.wal_bytes,
                c.first_seq,
                c.retain_after,
                c.remembered,
                c.horizon_ms
            )?,
            None => writeln!(f, "spot-core status:     not available")?,
        }
        for p in &self.problems {
            writeln!(f, "problem: {p}")?;
        }
        if let Some(logs) = &self.logs {
            writeln!(f, "process logs kept in {}", logs.display())?;
        }
        if let Some(database) = &self.database {
            writeln!(f, "database kept:        {database}")?;
        }
        write!(
            f,
            "verdict:              {}",
            if self.clean() { "clean" } else { "NOT CLEAN" }
        )
    }
}

/// One submitted transfer: what the client asked for.
#[derive(Debug, Clone)]
struct Sent {
    from_funding: bool,
    /// The state the client was answered with.
    state: String,
    user: u64,
}

/// One transfer a client will send: the `i`-th of the run, with its own cid.
struct Planned {
    i: usize,
    user: u64,
    from_funding: bool,
    amount: u32,
}

impl Planned {
    fn draw(i: usize, users: u64) -> Self {
        let mut rng = rand::rng();
        Planned {
            i,
            user: 1 + (i as u64) % users,
            from_funding: rng.random_bool(0.6),
            amount: rng.random_range(1..=40u32),
        }
    }

    fn body(&self) -> serde_json::Value {
        let (from, to) = if self.from_funding {
            ("FUNDING", "SPOT")
        } else {
            ("SPOT", "FUNDING")
        };
        json!({"from": from, "to": to, "asset": "USDT",
               "amount": format!("{}.5", self.amount), "cid": format!("chaos-{}", self.i)})
    }
}

/// How long a client keeps sending one transfer (or what is left of a batch) before it counts
/// as unanswered.
const ANSWER_WITHIN: Duration = Duration::from_secs(120);

/// Sends one transfer with its cid to a random live ledger until one answers with its req_id:
/// (req_id, state, when the answered attempt was sent), or `None` past [`ANSWER_WITHIN`].
async fn send_one(
    http: &reqwest::Client,
    cluster: &Cluster,
    planned: &Planned,
) -> Option<(String, String, Instant)> {
    let token = edge::mint(
        SECRET.as_bytes(),
        domain::UserId::new(planned.user).expect("user id"),
        false,
        Duration::from_secs(3600),
    );
    let body = planned.body();
    let deadline = Instant::now() + ANSWER_WITHIN;
    while Instant::now() <= deadline {
        let Some(base) = any_base(cluster).await else {
            continue;
        };
        let attempt = Instant::now();
        let resp = http
            .post(format!("{base}/api/v1/internal_transfer"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await;
        if let Ok(resp) = resp {
            if let Ok(v) = resp.json::<serde_json::Value>().await {
                if let Some(id) = v["req_id"].as_str() {
                    let state = v["state"].as_str().unwrap_or("").to_owned();
                    return Some((id.to_owned(), state, attempt));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Sends the transfers as one batch to `POST /api/v1/internal_transfers` (an admin's token
/// naming each item's user), the items not yet answered with a req_id again until each is or
/// [`ANSWER_WITHIN`] passes: one answer per transfer, in order.
async fn send_batch(
    http: &reqwest::Client,
    cluster: &Cluster,
    planned: &[Planned],
) -> Vec<Option<(String, String, Instant)>> {
    let token = edge::mint(
        SECRET.as_bytes(),
        domain::UserId::new(1).expect("user id"),
        true,
        Duration::from_secs(3600),
    );
    let mut answers: Vec<Option<(String, String, Instant)>> =
        planned.iter().map(|_| None).collect();
    let deadline = Instant::now() + ANSWER_WITHIN;
    while Instant::now() <= deadline {
        let pending: Vec<usize> = (0..planned.len())
            .filter(|&k| answers[k].is_none())
            .collect();
        if pending.is_empty() {
            break;
        }
        let Some(base) = any_base(cluster).await else {
            continue;
        };
        let items: Vec<serde_json::Value> = pending
            .iter()
            .map(|&k| {
                let mut item = planned[k].body();
                item["user_id"] = json!(planned[k].user);
                item
            })
            .collect();
        let attempt = Instant::now();
        let resp = http
            .post(format!("{base}/api/v1/internal_transfers"))
            .bearer_auth(&token)
            .json(&json!({ "transfers": items }))
            .send()
            .await;
        if let Ok(resp) = resp {
            if let Ok(v) = resp.json::<serde_json::Value>().await {
                let results = v["results"].as_array().cloned().unwrap_or_default();
                for (&k, r) in pending.iter().zip(&results) {
                    if let Some(id) = r["req_id"].as_str() {
                        let state = r["state"].as_str().unwrap_or("").to_owned();
                        answers[k] = Some((id.to_owned(), state, attempt));
                    }
                }
            }
        }
        if answers.iter().any(Option::is_none) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    answers
}

/// A live ledger's base URL, or `None` after a short wait when none is up.
async fn any_base(cluster: &Cluster) -> Option<String> {
    let bases = cluster.bases();
    if bases.is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
        return None;
    }
    Some(bases[rand::rng().random_range(0..bases.len())].clone())
}

/// Runs the whole chaos scenario and reports what it found.
/// The processes' logs (and spot-core's data and archive) are kept when the run is not clean or
/// fails.
pub async fn run(cfg: Config) -> anyhow::Result<Report> {
    let started = Instant::now();
    let tmp = tempfile::Builder::new().prefix("chaos-").tempdir()?;
    match run_in(cfg, tmp.path()).await {
        Ok(mut report) => {
            if !report.clean() {
                report.logs = Some(tmp.keep());
            }
            report.elapsed = started.elapsed();
            Ok(report)
        }
        Err(e) => {
            let kept = tmp.keep();
            Err(e.context(format!(
                "the chaos run failed (process logs kept in {})",
                kept.display()
            )))
        }
    }
}

async fn run_in(cfg: Config, dir: &Path) -> anyhow::Result<Report> {
    let n_cells = cfg.cells.max(1);
    if cfg.ha.is_some() && (cfg.pg_failovers > 0 || cfg.net_faults > 0) {
        bail!(
            "--ha runs its own failovers and network cuts: not with --pg-failovers or --net-faults"
        );
    }
    // Under HA every cell's processes first: its database is on its Patroni pair.
    let ha_cells = match cfg.ha {
        Some(_) => {
            let spot = ha::SpotSettings {
                bin: cfg.bin_dir.join("spot-core"),
                snapshots: cfg.snapshots,
            };
            Some(Arc::new(ha::Cells::start(n_cells, &spot).await?))
        }
        None => None,
    };
    let report = run_cells(cfg, dir, ha_cells.clone()).await;
    if let Some(cells) = &ha_cells {
        match &report {
            Ok(r) if r.clean() => {}
            _ => {
                if let Some(kept) = cells.keep() {
                    eprintln!(
                        "chaos --ha: the cells' processes and logs kept in {}",
                        kept.display()
                    );
                }
            }
        }
    }
    report
}

async fn run_cells(
    cfg: Config,
    dir: &Path,
    ha_cells: Option<Arc<ha::Cells>>,
) -> anyhow::Result<Report> {
    let n_cells = cfg.cells.max(1);
    // Failovers: a private pair (with cells, the last cell's database); otherwise restarting
    // PostgreSQL: one such run at a time on this machine, held to the end.
    let pair = if cfg.pg_failovers > 0 {
        Some(Arc::new(PgPair::start(Replication::Synchronous).await?))
    } else {
        None
    };
    // The cell index of the pair's database (0 without cells), if any.
    let pair_cell = pair.as_ref().map(|_| n_cells - 1);
    // Cells with PostgreSQL restarts or network faults: each cell's database (but the pair's)
    // on a private cluster of its own (`crate::pg_solo`), restarted in turn; the machine's
    // server is never touched. With network faults the ledgers reach each cell through a
    // forwarder of its own, which the ledger counts as a server of its own (a full pool each,
    // ADR 0017 §7): more than the machine's server, shared with other tests, should be asked
    // to hold.
    let mut solos = Vec::new();
    if n_cells > 1 && (cfg.pg_restarts > 0 || cfg.net_faults > 0) && ha_cells.is_none() {
        for _ in 0..n_cells - usize::from(pair.is_some()) {
            solos.push(Arc::new(
                tokio::task::spawn_blocking(crate::pg_solo::PgSolo::start).await??,
            ));
        }
    }
    let pg = if cfg.pg_restarts > 0 && pair.is_none() && n_cells == 1 && ha_cells.is_none() {
        let pg = PgCluster::serving(&cfg.server_url)?;
        let lock = tokio::task::spawn_blocking(crate::pg_ctl::lock).await??;
        pg.settle(&cfg.server_url).await?;
        Some((pg, Arc::new(lock)))
    } else {
        None
    };
    let database = format!("chaos_{}", ulid::Ulid::new().to_string().to_lowercase());
    // Under HA a cell's URL names its Patroni nodes and their REST APIs.
    let ha_url = |index: usize, name: &str| -> Option<String> {
        let cells = ha_cells.as_ref()?;
        Some(cells.places[index].cell.try_lock().ok()?.database_url(name))
    };
    let db_url = match (&pair, ha_url(0, &database)) {
        (_, Some(url)) => url,
        (Some(pair), None) => pair.url(&database),
        (None, None) => format!("{}/{database}", cfg.server_url),
    };
    // With cells, a database per cell beside the first's name: `<database>_c1`, `_c2`, ...
    let databases: Vec<String> = match n_cells {
        1 => vec![database.clone()],
        n => (1..=n).map(|c| format!("{database}_c{c}")).collect(),
    };
    let urls: Vec<String> = match n_cells {
        1 => vec![db_url.clone()],
        _ => databases
            .iter()
            .enumerate()
            .map(|(i, name)| match (&pair, solos.get(i)) {
                _ if ha_cells.is_some() => ha_url(i, name).unwrap_or_default(),
                (Some(pair), _) if pair_cell == Some(i) => pair.url(name),
                (_, Some(solo)) => solo.url(name),
                _ => format!("{}/{name}", cfg.server_url),
            })
            .collect(),
    };
    // The databases on the machine's server, dropped after a clean run (a private cluster's go
    // with it).
    let on_server: Vec<String> = databases
        .iter()
        .zip(&urls)
        .filter(|(_, url)| url.starts_with(&format!("{}/", cfg.server_url)))
        .map(|(name, _)| name.clone())
        .collect();
    let mut pools = Vec::new();
    for url in &urls {
        pools.push(schema::prepare(url, if n_cells == 1 { 8 } else { 4 }).await?);
    }
    let mut settings = Settings::new(&cfg, db_url.clone(), dir)?;
    settings.ha = ha_cells.clone();
    if n_cells > 1 {
        settings.cell_dbs = urls.clone();
    }
    let net = if cfg.net_faults > 0 {
        // The ledgers reach the database (the machine's server, or the failover pair's two;
        // with cells each cell's) through forwarders in the root namespace, where the faults
        // are put.
        let dbs: Vec<(Option<u16>, String)> = match n_cells {
            1 => vec![(None, db_url.clone())],
            _ => settings.cells().into_iter().zip(urls.clone()).collect(),
        };
        let (net, place) = netfaults::start(&dbs).await?;
        settings.net = Some(place);
        Some(Arc::new(net))
    } else {
        None
    };
    let ledgers = cfg.ledgers;
    let cluster =
        Arc::new(tokio::task::spawn_blocking(move || Cluster::start(settings, ledgers)).await??);

    // Each user's deposit in its own cell's database (the one cell's without a map).
    let usdt = domain::AssetSymbol::parse("USDT").map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for user in 1..=cfg.users {
        let funding = adapters::FundingLedger::new(pools[cells::cell_index(user, n_cells)].clone());
        funding
            .external_deposit(
                &format!("chaos-seed-{user}"),
                domain::UserId::new(user).map_err(|e| anyhow::anyhow!("{e:?}"))?,
                &usdt,
                domain::Amount::parse(&DEPOSIT_PER_USER.to_string())
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?,
            )
            .await?;
    }

    // Every seventh user's SPOT account refuses deposits, so transfers into it are refused at
    // the target and must be compensated (COMPENSATING → ROLLED_BACK) under the same chaos.
    for user in (7..=cfg.users).step_by(7) {
        let spot_admin =
            cluster.spot_client(cells::cell_index(user, n_cells), Duration::from_secs(5));
        let req = Request::SetStatus {
            user_id: user,
            asset: "USDT".into(),
            status: spot_core::protocol::AccountStatus::Disabled,
        };
        match spot_admin.call(&req).await? {
            Response::Ok { .. } => {}
            other => bail!("set_status answered {other:?}"),
        }
    }

    // Clients: each transfer is sent with its own cid until some process answers, so a request
    // lost in a crash is retried without ever creating a second transfer.
    let next = Arc::new(AtomicUsize::new(0));
    // Under HA the faults of one machine, when each is due (by transfers handed out) and where;
    // the clients wait at the next one's due point until it is injected (the gate), so each
    // fault meets the transfers after it however long the cell took to settle before it.
    let ha_schedule = cfg.ha.map(|n| {
        let mut counts = vec![(ha::Kind::Postmaster, cfg.pg_restarts)];
        counts.extend(ha::Kind::NEW.map(|k| (k, n)));
        ha::schedule(&counts, cfg.transfers, n_cells)
    });
    let gate = Arc::new(AtomicUsize::new(
        ha_schedule
            .as_ref()
            .and_then(|s| s.first())
            .map_or(usize::MAX, |(due, _, _)| *due),
    ));
    // Each cell's transfers answered so far (a failover's first answer is its cell's), and
    // answered COMMITTED: what the network faults record of the other cells while one cell's
    // path is cut.
    let per_cell = || {
        Arc::new(
            (0..n_cells)
                .map(|_| AtomicUsize::new(0))
                .collect::<Vec<_>>(),
        )
    };
    let (answers, committed) = (per_cell(), per_cell());
    let unanswered = Arc::new(AtomicUsize::new(0));
    let sent: Arc<Mutex<HashMap<String, Sent>>> = Arc::default();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..cfg.clients.max(1) {
        let (ha_cells, gate) = (ha_cells.clone(), gate.clone());
        let (cluster, next, unanswered, sent, cfg, answers, committed) = (
            cluster.clone(),
            next.clone(),
            unanswered.clone(),
            sent.clone(),
            cfg.clone(),
            answers.clone(),
            committed.clone(),
        );
        clients.spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client");
            let batch = cfg.bulk.max(1);
            loop {
                let first = next.fetch_add(batch, Ordering::SeqCst);
                if first >= cfg.transfers {
                    return;
                }
                while first >= gate.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let planned: Vec<Planned> = (first..(first + batch).min(cfg.transfers))
                    .map(|i| Planned::draw(i, cfg.users))
                    .collect();
                let answered = match batch {
                    1 => vec![send_one(&http, &cluster, &planned[0]).await],
                    _ => send_batch(&http, &cluster, &planned).await,
                };
                for (p, answer) in planned.iter().zip(answered) {
                    match answer {
                        Some((id, state, attempt)) => {
                            let index = cells::cell_index(p.user, n_cells);
                            if state == "COMMITTED" {
                                committed[index].fetch_add(1, Ordering::SeqCst);
                            }
                            if let Some(ha) = &ha_cells {
                                ha.places[index].answered(attempt, state == "COMMITTED");
                            }
                            sent.lock().unwrap_or_else(|e| e.into_inner()).insert(
                                id,
                                Sent {
                                    from_funding: p.from_funding,
                                    state,
                                    user: p.user,
                                },
                            );
                            answers[cells::cell_index(p.user, n_cells)]
                                .fetch_add(1, Ordering::SeqCst);
                        }
                        None => {
                            unanswered.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        });
    }

    // The killer: SIGKILL a random process, restart it after a random pause, until the clients
    // are done and enough crashes were injected. It also notices a process that died by itself
    // (none may: a PostgreSQL restart is not a reason to exit) and starts it again.
    let clients_done = Arc::new(AtomicBool::new(false));
    // Partition moves back and forth among the faults (with cells, not under HA).
    let n_moves = if n_cells > 1 && ha_cells.is_none() {
        cfg.moves
    } else {
        0
    };
    let mover = (n_moves > 0).then(|| {
        let progress = moves::Progress {
            next: next.clone(),
            done: clients_done.clone(),
            transfers: cfg.transfers,
        };
        tokio::spawn(moves::run(
            cluster.clone(),
            pools.clone(),
            cfg.users,
            n_moves,
            progress,
        ))
    });

    let exited: Arc<Mutex<Vec<String>>> = Arc::default();
    let killer = {
        let (cluster, done, cfg, exited) = (
            cluster.clone(),
            clients_done.clone(),
            cfg.clone(),
            exited.clone(),
        );
        tokio::task::spawn_blocking(move || -> anyhow::Result<(usize, Vec<usize>)> {
            // spot-core kills per cell (one entry without cells).
            let (mut ledger_kills, mut spot_kills) = (0, vec![0; n_cells]);
            // With cells, until every cell's spot-core was killed at least once too.
            let enough = |ledger_kills: usize, spot_kills: &[usize]| {
                ledger_kills + spot_kills.iter().sum::<usize>() >= cfg.crashes_min
                    && (!cfg.kill_spot || spot_kills.iter().all(|n| *n > 0))
            };
            while !(done.load(Ordering::SeqCst) && enough(ledger_kills, &spot_kills)) {
                let (wait, pause, pick_spot, which, cell) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(150..900u64),
                        rng.random_range(0..300u64),
                        rng.random_bool(0.4),
                        rng.random_range(0..cfg.ledgers.max(1)),
                        rng.random_range(0..n_cells),
                    )
                };
                std::thread::sleep(Duration::from_millis(wait));
                let died = cluster.restart_exited()?;
                exited
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(died);
                let spot = cfg.kill_spot && (pick_spot || !cfg.kill_ledgers);
                if spot {
                    cluster.kill_spot_and_restart(cell, Duration::from_millis(pause))?;
                    spot_kills[cell] += 1;
                } else if cfg.kill_ledgers {
                    cluster.kill_ledger_and_restart(which, Duration::from_millis(pause))?;
                    ledger_kills += 1;
                } else {
                    break;
                }
            }
            Ok((ledger_kills, spot_kills))
        })
    };

    // PostgreSQL restarts, spread evenly over the transfers: the k-th once k/(n+1) of them have
    // started (any left when the clients are done happen then). With cells the k-th is cell
    // ((k - 1) mod N) + 1's; the pair's cell's are the pair's own (below).
    let restarter = {
        let (pg, solos, next, done, n, transfers) = (
            pg.clone(),
            solos.clone(),
            next.clone(),
            clients_done.clone(),
            cfg.pg_restarts,
            cfg.transfers,
        );
        tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
            if pg.is_none() && solos.is_empty() {
                return Ok(0);
            }
            let mut done_here = 0;
            for k in 1..=n {
                let index = (k - 1) % n_cells;
                if pair_cell == Some(index) {
                    continue;
                }
                let due = transfers * k / (n + 1);
                while next.load(Ordering::SeqCst) < due && !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                match &pg {
                    Some((pg, _lock)) => pg.restart_immediate()?,
                    // With cells: a power cut of that cell's database alone, the others
                    // committing meanwhile.
                    None => {
                        let solo = &solos[index];
                        solo.stop_immediate()?;
                        std::thread::sleep(Duration::from_millis(
                            rand::rng().random_range(0..1_000),
                        ));
                        solo.start_again()?;
                    }
                }
                done_here += 1;
            }
            Ok(done_here)
        })
    };
    let pair_faults = pair.clone().zip(pair_cell).map(|(pair, cell)| {
        let progress = failover::Progress {
            next: next.clone(),
            answered: answers.clone(),
            cell,
            clients_done: clients_done.clone(),
        };
        // The restarts that come round to the pair's cell (every one without cells).
        let restarts = (0..cfg.pg_restarts).filter(|k| k % n_cells == cell).count();
        let failovers = cfg.pg_failovers;
        tokio::spawn(failover::run_faults(
            pair,
            progress,
            restarts,
            failovers,
            cfg.transfers,
        ))
    });
    let faulter = {
        let (net, cluster, next, done, cfg, committed) = (
            net.clone(),
            cluster.clone(),
            next.clone(),
            clients_done.clone(),
            cfg.clone(),
            committed.clone(),
        );
        tokio::task::spawn_blocking(move || match net {
            Some(net) => netfaults::inject(
                &net,
                &cluster,
                &cfg.net_kinds,
                cfg.net_faults,
                &netfaults::Progress {
                    next: &next,
                    done: &done,
                    transfers: cfg.transfers,
                    committed: &committed,
                },
            ),
            None => Ok(Vec::new()),
        })
    };
    // Under HA: the faults of one machine, and the supervisor's pass every second.
    let supervisor_stop = Arc::new(AtomicBool::new(false));
    let ha_tasks = ha_cells.clone().zip(ha_schedule).map(|(cells, schedule)| {
        let progress = ha::Progress {
            next: next.clone(),
            clients_done: clients_done.clone(),
            gate: gate.clone(),
        };
        let faults = tokio::spawn(ha::run_faults(cells.clone(), progress, schedule));
        let stop = supervisor_stop.clone();
        let supervisor =
            tokio::task::spawn_blocking(move || ha::supervise_every_second(&cells, &stop));
        (faults, supervisor)
    });
    while clients.join_next().await.is_some() {}
    clients_done.store(true, Ordering::SeqCst);
    let (mut ha_faults, mut supervisor_started) = (Vec::new(), Vec::new());
    if let Some((faults, supervisor)) = ha_tasks {
        ha_faults = faults.await??;
        supervisor_stop.store(true, Ordering::SeqCst);
        supervisor_started = supervisor.await??;
    }
    let (ledger_crashes, spot_crashes) = killer.await??;
    let mut pg_restarts = restarter.await??;
    let net_faults = faulter.await??;
    let mut moves_report = None;
    let mut move_problems = Vec::new();
    if let Some(mover) = mover {
        let (started, cancels) = mover.await?;
        moves_report = Some(MovesReport {
            started,
            cancels,
            ..MovesReport::default()
        });
    }
    let mut failovers = Vec::new();
    if let Some(faults) = pair_faults {
        let pair_restarts;
        (pair_restarts, failovers) = faults.await??;
        pg_restarts += pair_restarts;
    }
    if let Some((pg, _)) = &pg {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || pg.wait_ready(crate::pg_ctl::RECOVERY_MAX)).await??;
    }
    let c = cluster.clone();
    let died = tokio::task::spawn_blocking(move || c.restart_exited()).await??;
    exited
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(died);
    // Under HA: a last supervisor's pass, then every cell whole (a Patroni leader with its
    // synchronous standby, a spot-core leader with three replicas acknowledging) before the end
    // check, which reads spot-core through the leader.
    let mut problems = Vec::new();
    if let Some(cells) = &ha_cells {
        let c = cells.clone();
        let started = tokio::task::spawn_blocking(move || {
            let mut started = Vec::new();
            for place in &c.places {
                started.extend(
                    place
                        .supervise()?
                        .into_iter()
                        .map(|s| format!("cell {}: {s}", place.id)),
                );
            }
            anyhow::Ok(started)
        })
        .await??;
        supervisor_started.extend(started);
        for place in &cells.places {
            if !place.settled(Duration::from_secs(120)).await {
                problems.push(format!(
                    "cell {} under HA did not become whole again (a synchronous standby, three \
                     spot-core replicas acknowledging) within 120 s of the end",
                    place.id
                ));
            }
        }
    }

    // Every move the ledgers recorded ends, DONE or CANCELLED, before the end check.
    if let Some(m) = moves_report.as_mut() {
        let (done, cancelled, open) = moves::all_ended(&pools, cfg.settle_max).await?;
        (m.done, m.cancelled) = (done, cancelled);
        move_problems.extend(open.into_iter().map(|o| format!("move {o} never ended")));
        if m.started == 0 || done == 0 {
            move_problems.push(format!(
                "the run's moves did not happen: {} started, {done} DONE",
                m.started
            ));
        }
    }

    // Settle: every transfer must reach a terminal state on its own (the recovery workers), in
    // every cell. The database may still be coming back from its last restart: an error is
    // retried.
    let settle_deadline = Instant::now() + cfg.settle_max;
    let stuck = loop {
        let mut open = Vec::new();
        let mut failed = None;
        for pool in &pools {
            match check::open_transfers(pool).await {
                Ok(n) => open.push(n),
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            None if open.iter().all(|n| *n == 0) => break open,
            None if Instant::now() > settle_deadline => break open,
            Some(e) if Instant::now() > settle_deadline => return Err(e),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };

    // The ledger's own exact check first (it lets spot-core compact what it consumed; under a
    // map it is every cell's and the total), then each cell's end check: its database, its
    // spot-core's journal from seq 1 through whatever was archived, its users' transfers.
    let base = cluster
        .bases()
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no ledger is up"))?;
    for full in [false, true] {
        problems.extend(check::ledger_invariant(&base, full).await?);
    }
    let all_sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Where each partition lives at the end (after the moves), and where each answered transfer
    // was created (its cell then): each cell's check counts the money of what it owns and the
    // transfers created in it.
    let (owned, home) = placed(&pools, &all_sent, &mut problems).await?;
    if let (Some(m), Some(map)) = (moves_report.as_mut(), &owned) {
        m.map_version = map.version;
    }
    problems.extend(move_problems);
    let mut per_cell = Vec::new();
    for (index, pool) in pools.iter().enumerate() {
        let mine: HashMap<String, Sent> = all_sent
            .iter()
            .filter(|(k, _)| home.get(k.as_str()) == Some(&index))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let spot_client = cluster.spot_client(index, Duration::from_secs(30));
        let partitions: Vec<i32> = match &owned {
            Some(map) => map.owned(u16::try_from(index + 1)?),
            None => (0..i32::from(::cells::PARTITIONS)).collect(),
        };
        let mut r = check::check(pool, &spot_client, &Mutex::new(mine), &partitions).await?;
        let settings = &cluster.settings;
        let (db_url, cell) = match n_cells {
            1 => (settings.db_url.clone(), None),
            _ => (
                settings.cell_dbs[index].clone(),
                settings
                    .map
                    .as_deref()
                    .map(|m| (m, u16::try_from(index + 1))),
            ),
        };
        let cell = match cell {
            Some((map, id)) => Some((map, id?)),
            None => None,
        };
        r.problems.extend(
            log::log_problems(pool, &settings.bin_dir, &db_url, &settings.log_key, cell).await?,
        );
        r.problems.extend(core_problems(&cfg, r.core.as_ref()));
        r.archived_segments = std::fs::read_dir(cluster.archive(index))?.count();
        if let Some(cells) = &ha_cells {
            // The leader answered the end check: say which replica it was.
            let leader = cells.places[index].cell.lock().await.spot.leader().await;
            if leader.is_none() {
                r.problems
                    .push("no spot-core replica answers as the leader after the end check".into());
            }
        }
        r.stuck = stuck[index];
        r.spot_crashes = spot_crashes[index];
        let cell = u16::try_from(index + 1)?;
        if n_cells > 1 {
            // The k-th restart was cell ((k - 1) mod N) + 1's; each network fault names its cell.
            r.pg_restarts = (0..pg_restarts).filter(|k| k % n_cells == index).count();
            r.net_faults = net_faults
                .iter()
                .filter(|d| d.cell == Some(cell))
                .cloned()
                .collect();
            // A fault not noticed in time is its cell's finding (the total names the cell).
            r.problems.extend(netfaults::problems(&r.net_faults));
            if pair_cell == Some(index) {
                r.failovers = failovers.clone();
            }
        }
        per_cell.push((cell, r));
    }
    let mut report = match n_cells {
        1 => per_cell.pop().map(|(_, r)| r).unwrap_or_default(),
        _ => cells::total(per_cell),
    };
    report.problems.extend(problems);
    let seeded = Decimal::from(DEPOSIT_PER_USER) * Decimal::from(cfg.users);
    if report.deposits != seeded {
        report.problems.push(format!(
            "the cells count {} of deposits by the partitions they own, {seeded} were made: a \
             partition owned twice or by none",
            report.deposits
        ));
    }
    report.moves = moves_report;
    let spot_crashes: usize = spot_crashes.iter().sum();
    report.crashes = ledger_crashes + spot_crashes;
    report.ledger_crashes = ledger_crashes;
    report.spot_crashes = spot_crashes;
    report.pg_restarts = pg_restarts;
    report.failovers = failovers;
    if n_cells == 1 {
        report.problems.extend(netfaults::problems(&net_faults));
    }
    report.net_faults = net_faults;
    report.unanswered = unanswered.load(Ordering::SeqCst);
    report.problems.extend(ha::problems(&ha_faults));
    report.ha_faults = ha_faults;
    report.supervisor_started = supervisor_started;
    report.exited = exited.lock().unwrap_or_else(|e| e.into_inner()).clone();
    drop(cluster);
    drop(net);
    for pool in &pools {
        pool.close().await;
    }
    // A clean run's databases on the machine's server go (every run makes one, and a server's
    // crash recovery after an immediate stop syncs every file of every database); a run with
    // findings keeps them. The pair's and the cells' private clusters go with the run.
    if report.clean() {
        for name in &on_server {
            crate::pg_ctl::drop_database(&cfg.server_url, name).await?;
        }
    } else if !on_server.is_empty() {
        report.database = Some(on_server.join(", "));
    }
    Ok(report)
}

/// With cells, the map every cell holds at the end (`None` without cells) and the cell index each
/// answered transfer was created in (the one holding its own events; a transfer created in none
/// is put in its user's cell under that map, whose check then counts it lost). A transfer
/// created in two cells, a client key that created two transfers, or a map the cells disagree
/// on, is a problem.
async fn placed(
    pools: &[sqlx::PgPool],
    sent: &HashMap<String, Sent>,
    problems: &mut Vec<String>,
) -> anyhow::Result<(Option<moves::StoredMap>, HashMap<String, usize>)> {
    let map = match pools.len() {
        1 => None,
        _ => Some(moves::stored_map(pools).await?),
    };
    let mut home = HashMap::new();
    let mut cids: HashMap<(String, String), usize> = HashMap::new();
    for (index, pool) in pools.iter().enumerate() {
        for id in check::own_transfers(pool).await? {
            if let Some(other) = home.insert(id.clone(), index) {
                problems.push(format!(
                    "transfer {id} was created in cell {} and in cell {}",
                    other + 1,
                    index + 1
                ));
            }
        }
        for key in check::own_cids(pool).await? {
            *cids.entry(key).or_insert(0) += 1;
        }
    }
    for (id, s) in sent {
        home.entry(id.clone())
            .or_insert_with(|| map.as_ref().map_or(0, |m| m.index_of(s.user)));
    }
    if let Some(map) = &map {
        problems.extend(map.problems.iter().cloned());
        let twice = cids.values().filter(|n| **n > 1).count();
        if twice > 0 {
            problems.push(format!(
                "{twice} client keys (cid) created more than one transfer across the cells"
            ));
        }
    }
    Ok((map, home))
}

/// What spot-core's `status` at the end says the run did not exercise: no snapshot taken, the
/// idempotency horizon never advanced, or no `status` at all.
fn core_problems(cfg: &Config, core: Option<&CoreStatus>) -> Vec<String> {
    let mut problems = Vec::new();
    match core {
        Some(core) => {
            if cfg.snapshots.is_some() && core.snapshot_seq == 0 {
                problems.push("spot-core never took a snapshot".into());
            }
            if cfg.horizon && core.horizon_ms == 0 {
                problems.push("the idempotency horizon never advanced".into());
            }
        }
        None if cfg.snapshots.is_some() || cfg.horizon => {
            problems.push("spot-core does not answer `status`".into());
        }
        None => {}
    }
    problems
}
