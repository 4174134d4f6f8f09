//! The chaos run under HA (`--ha`, docs/adr/0020-high-availability.md): each cell is an
//! `ha::cell::HaCell` (etcd x3, a Patroni pair, three spot-core replicas on loopback addresses
//! of their own, 127.0.0.<10c+1..10c+3> for cell c, so that nftables can cut one replica off),
//! everything on tmpfs (`/dev/shm`) with PostgreSQL's `fsync` off: a test's speed, not a
//! durability claim (a machine kill here kills processes, the files stay).
//!
//! On top of the run's faults (ledger kills; spot-core kills, here of a random replica),
//! the faults of one machine, spread over the transfers and round the cells:
//! - `postmaster`: the Patroni leader's postmaster SIGKILLed (what `--pg-restarts` become);
//! - `pg-machine`: the Patroni leader's machine lost (agent, postmaster, backends), held down
//!   until the standby leads, then its agent started again by the supervisor's pass;
//! - `spot-wipe`: the spot-core leader killed and its data dir deleted, held down until another
//!   replica leads, then started again by the supervisor's pass: it must rebuild;
//! - `spot-partition`: the spot-core leader cut off from the other replicas by nftables for a
//!   few seconds, then healed (the old leader steps down and aborts; the supervisor's pass
//!   starts it again).
//!
//! A supervisor's pass (`HaCell::restart_exited`, minus what a fault holds down) runs every
//! second. Each fault records how long until a transfer of its cell, whose request was sent
//! after the fault, was answered COMMITTED.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use ha::cell::HaCell;
use rand::Rng;
use spot_core::protocol::{Request, Response};

/// A member a fault or a kill keeps down: the supervisor's pass leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Member {
    Pg(usize),
    Spot(usize),
}

/// One cell under HA and what is kept down in it.
pub(super) struct Place {
    pub id: u16,
    pub cell: tokio::sync::Mutex<HaCell>,
    /// Each replica's loopback address (what a partition cuts).
    pub hosts: [String; 3],
    /// An empty directory: under HA nothing is archived (see `start_cell`).
    pub archive: PathBuf,
    held: Mutex<HashMap<Member, &'static str>>,
    /// The newest starts of a request attempt of this cell's answered (any state) and
    /// answered COMMITTED.
    served: Mutex<(Option<Instant>, Option<Instant>)>,
}

/// Every cell of the run under HA.
pub(super) struct Cells {
    pub places: Vec<Place>,
    /// The directory on tmpfs they run in (kept when the run is not clean).
    pub dir: Mutex<Option<tempfile::TempDir>>,
}

/// The spot-core settings the replicas start with (as `Settings::spawn_spot` gives the single
/// spot-core).
pub(super) struct SpotSettings {
    pub bin: PathBuf,
    pub snapshots: Option<super::Snapshots>,
}

/// A working directory on tmpfs when there is one, reachable by the `postgres` user (Patroni
/// runs as it when the run is root).
fn workdir() -> anyhow::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let dir = tempfile::Builder::new()
        .prefix("chaos-ha-")
        .tempdir_in(if shm.is_dir() { shm } else { Path::new("/tmp") })?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

impl Cells {
    /// Starts `n` cells (ids 1..=n), one after the other.
    pub async fn start(n: usize, spot: &SpotSettings) -> anyhow::Result<Cells> {
        let dir = workdir()?;
        let mut places = Vec::new();
        for c in 1..=n {
            let id = u16::try_from(c)?;
            places.push(
                start_cell(id, &dir.path().join(format!("cell{c}")), spot)
                    .await
                    .with_context(|| {
                        format!("starting cell {c} under HA in {}", dir.path().display())
                    })?,
            );
        }
        Ok(Cells {
            places,
            dir: Mutex::new(Some(dir)),
        })
    }

    /// Keeps the processes' directory (a run that is not clean); where.
    pub fn keep(&self) -> Option<PathBuf> {
        let dir = self.dir.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        Some(dir.keep())
    }
}

async fn start_cell(id: u16, dir: &Path, spot: &SpotSettings) -> anyhow::Result<Place> {
    std::fs::create_dir_all(dir)?;
    let etcd = ha::etcd::EtcdCluster::start(&dir.join("etcd"), 3).await?;
    let pg = ha::patroni::PatroniCluster::start(
        &etcd.endpoints(),
        &format!("ledger-cell{id}"),
        &dir.join("pg"),
        ha::patroni::Options {
            // tmpfs: a test's speed (see the module's comment).
            fsync: false,
            ..ha::patroni::Options::default()
        },
    )
    .await?;
    let archive = dir.join("archive");
    std::fs::create_dir_all(&archive)?;
    let mut args = Vec::new();
    if let Some(s) = spot.snapshots {
        // Snapshots (a rebuild ships the newest one), but spot-core's default segments and
        // no archive: every replica gets the same arguments (`SpotReplicas`), and one archive
        // shared by the replicas breaks the journal (each cuts its segments at its own seqs,
        // same names, other extents: "segment wal-..1.seg ends before seq 228 but the next
        // starts at 119"); a rebuilt replica gets only the leader's live segments. So nothing
        // is compacted and every replica serves the journal from seq 1.
        args.extend([
            "--snapshot-every-records".to_owned(),
            s.every_records.to_string(),
        ]);
    }
    let hosts: [String; 3] = std::array::from_fn(|i| format!("127.0.0.{}", 10 * id + 1 + i as u16));
    let spot = ha::spot::SpotReplicas::start_on(
        &spot.bin,
        &dir.join("spot"),
        &etcd.endpoints(),
        id,
        &[("RUST_LOG", "warn")],
        &args,
        [&hosts[0], &hosts[1], &hosts[2]].map(String::as_str),
    )?;
    let cell = HaCell {
        cell: id,
        dir: dir.to_path_buf(),
        etcd,
        pg,
        spot,
    };
    let place = Place {
        id,
        cell: tokio::sync::Mutex::new(cell),
        hosts,
        archive,
        held: Mutex::default(),
        served: Mutex::default(),
    };
    place.wait_spot_leader(Duration::from_secs(60)).await?;
    Ok(place)
}

impl Place {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Member, &'static str>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request attempt started at `at` was answered (COMMITTED when `committed`).
    pub fn answered(&self, at: Instant, committed: bool) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        if served.0.is_none_or(|s| s < at) {
            served.0 = Some(at);
        }
        if committed && served.1.is_none_or(|s| s < at) {
            served.1 = Some(at);
        }
    }

    /// (answered, committed) for a request attempt started after `at`.
    fn served_after(&self, at: Instant) -> (bool, bool) {
        let served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        (
            served.0.is_some_and(|s| s > at),
            served.1.is_some_and(|s| s > at),
        )
    }

    /// Waits until a replica answers as the spot-core leader; which.
    async fn wait_spot_leader(&self, within: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.cell.lock().await.spot.leader().await {
                return Ok(i);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "cell {}: no spot-core leader within {within:?}",
                self.id
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The supervisor's pass: `HaCell::restart_exited`, but what is held down stays down.
    /// Blocking (it waits for a restarted replica's port).
    pub fn supervise(&self) -> anyhow::Result<Vec<String>> {
        let held: Vec<Member> = self.held().keys().copied().collect();
        let mut cell = self.cell.blocking_lock();
        if held.is_empty() {
            return cell.restart_exited();
        }
        let mut started = Vec::new();
        for i in 0..cell.etcd.members.len() {
            if !cell.etcd.members[i].kid.running() {
                cell.etcd.restart(i)?;
                started.push(cell.etcd.members[i].name.clone());
            }
        }
        for i in 0..cell.pg.nodes.len() {
            if !held.contains(&Member::Pg(i)) && !cell.pg.agent_running(i) {
                cell.pg.restart_agent(i)?;
                started.push(format!("patroni {}", cell.pg.nodes[i].name));
            }
        }
        for i in 0..cell.spot.replicas.len() {
            if !held.contains(&Member::Spot(i)) && !cell.spot.replicas[i].kid.running() {
                cell.spot.restart(i)?;
                started.push(format!("spot-core {}", cell.spot.replicas[i].name));
            }
        }
        Ok(started)
    }

    /// The run's spot-core kill under HA: a random replica not held down, SIGKILLed, `meanwhile`
    /// run, then started again (unless the supervisor's pass did). Blocking.
    pub fn kill_random_replica<T>(&self, meanwhile: impl FnOnce() -> T) -> anyhow::Result<T> {
        let picked = {
            let mut cell = self.cell.blocking_lock();
            let mut held = self.held();
            let free: Vec<usize> = (0..cell.spot.replicas.len())
                .filter(|i| !held.contains_key(&Member::Spot(*i)))
                .collect();
            let picked = (!free.is_empty()).then(|| free[rand::rng().random_range(0..free.len())]);
            if let Some(i) = picked {
                held.insert(Member::Spot(i), "killed");
                cell.spot.kill(i);
            }
            picked
        };
        let out = meanwhile();
        if let Some(i) = picked {
            let mut cell = self.cell.blocking_lock();
            self.held().remove(&Member::Spot(i));
            if !cell.spot.replicas[i].kid.running() {
                cell.spot.restart(i)?;
            }
        }
        Ok(out)
    }

    /// Waits until the cell is whole: a Patroni leader with a synchronous standby and a
    /// spot-core leader with three replicas acknowledging; false past `within`.
    pub async fn settled(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let (pg, addrs) = {
                let cell = self.cell.lock().await;
                let pg = cell
                    .pg
                    .wait_sync_standby(Duration::from_millis(500))
                    .await
                    .is_ok();
                (pg, cell.spot_addrs())
            };
            if pg && acknowledging(&addrs).await >= 3 {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// The spot-core leader's count of replicas acknowledging (its `status`, through every
/// replica's address: the client finds the leader).
async fn acknowledging(addrs: &str) -> u32 {
    let client = spot_core::SpotClient::new(addrs.to_owned(), Duration::from_secs(2));
    match client.call(&Request::Status {}).await {
        Ok(Response::Ok {
            core: Some(core), ..
        }) => core.replication.map_or(0, |r| r.acknowledging),
        _ => 0,
    }
}

/// A kind of fault of one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Postmaster,
    PgMachine,
    SpotWipe,
    SpotPartition,
}

impl Kind {
    pub const NEW: [Kind; 3] = [Kind::PgMachine, Kind::SpotWipe, Kind::SpotPartition];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Postmaster => "postmaster killed",
            Kind::PgMachine => "PostgreSQL machine",
            Kind::SpotWipe => "spot-core leader wiped",
            Kind::SpotPartition => "spot-core leader cut off",
        }
    }
}

/// One fault injected: where, and how long until its cell served again.
#[derive(Debug, Clone)]
pub struct Injected {
    pub kind: Kind,
    pub cell: u16,
    /// The member hit (`node0`, `r2`).
    pub member: String,
    /// Until another member answered as the leader (a machine lost, a wipe, a cut).
    pub other_leads: Option<Duration>,
    /// Transfers handed to the clients when it was injected.
    pub at_transfer: usize,
    /// Until a transfer of the cell whose request was sent after the fault was answered, in
    /// any state (`None`: none within the bound, or no transfer was due any more).
    pub answered_again: Option<Duration>,
    /// Until one was answered COMMITTED (both systems served it).
    pub served_again: Option<Duration>,
    /// Until the hit member was back in step (a synchronous standby again; a replica rebuilt
    /// and acknowledging), from the fault; `None` when it was not within the bound.
    pub back: Option<Duration>,
    /// The cell had not settled (standby and three replicas) before the fault.
    pub unsettled_before: bool,
    /// Transfers were still due and none committed within [`SERVED_WITHIN`].
    pub not_served: bool,
}

/// What the faults say is wrong: a cell that did not commit again while transfers were due,
/// or a member that did not come back in step.
pub(super) fn problems(faults: &[Injected]) -> Vec<String> {
    let mut out = Vec::new();
    for i in faults {
        if i.not_served {
            out.push(format!(
                "no transfer committed within {SERVED_WITHIN:?}: {i}"
            ));
        }
        if i.back.is_none() {
            out.push(format!("not back in step within 120 s: {i}"));
        }
    }
    out
}

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |d: Option<Duration>| {
            d.map_or_else(|| "-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
        };
        write!(
            f,
            "{} (cell {}, {}, at transfer {}): another leader after {}, answered again after {}, \
             committed again after {}, back in step after {}{}",
            self.kind.name(),
            self.cell,
            self.member,
            self.at_transfer,
            secs(self.other_leads),
            secs(self.answered_again),
            secs(self.served_again),
            secs(self.back),
            if self.unsettled_before {
                " (the cell was not whole before it)"
            } else {
                ""
            }
        )
    }
}

/// The faults per kind, with the longest and median time to commit again.
pub struct Summary<'a>(pub &'a [Injected]);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kinds: Vec<Kind> = self.0.iter().map(|i| i.kind).collect();
        kinds.sort();
        kinds.dedup();
        for kind in kinds {
            let of: Vec<&Injected> = self.0.iter().filter(|i| i.kind == kind).collect();
            let mut times: Vec<f64> = of
                .iter()
                .filter_map(|i| i.answered_again.map(|d| d.as_secs_f64()))
                .collect();
            let mut committed: Vec<f64> = of
                .iter()
                .filter_map(|i| i.served_again.map(|d| d.as_secs_f64()))
                .collect();
            let stats = |times: &mut Vec<f64>| {
                times.sort_by(f64::total_cmp);
                match times.len() {
                    0 => "- (none measured)".to_owned(),
                    n => format!("median {:.1} s, max {:.1} s", times[n / 2], times[n - 1]),
                }
            };
            writeln!(
                f,
                "  {:<26}{} injected; answered again after {}; committed again after {}",
                kind.name(),
                of.len(),
                stats(&mut times),
                stats(&mut committed)
            )?;
        }
        Ok(())
    }
}

/// What the fault task needs to know of the run.
pub(super) struct Progress {
    pub next: Arc<AtomicUsize>,
    pub clients_done: Arc<AtomicBool>,
    /// The clients hand out no transfer at or past this until the fault due there is
    /// injected.
    pub gate: Arc<AtomicUsize>,
}

/// Opens the gate for good when the fault task ends, however it ends (the clients never wait
/// for a fault that will not come).
struct OpenOnDrop(Arc<AtomicUsize>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.store(usize::MAX, Ordering::SeqCst);
    }
}

/// The faults of every kind spread evenly over the transfers, in the order they come due; the
/// k-th of a kind goes to cell (k mod N) + 1 (kinds interleaved so each cell gets a mix).
pub(super) fn schedule(
    counts: &[(Kind, usize)],
    transfers: usize,
    cells: usize,
) -> Vec<(usize, Kind, usize)> {
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    let mut kinds = Vec::new();
    let max = counts.iter().map(|(_, n)| *n).max().unwrap_or(0);
    for round in 0..max {
        for (kind, n) in counts {
            if round < *n {
                kinds.push(*kind);
            }
        }
    }
    kinds
        .into_iter()
        .enumerate()
        .map(|(k, kind)| (transfers * (k + 1) / (total + 1), kind, k % cells.max(1)))
        .collect()
}

/// Runs the HA faults as the transfers progress.
pub(super) async fn run_faults(
    cells: Arc<Cells>,
    progress: Progress,
    schedule: Vec<(usize, Kind, usize)>,
) -> anyhow::Result<Vec<Injected>> {
    let _open = OpenOnDrop(progress.gate.clone());
    let mut out = Vec::new();
    for (k, &(due, kind, index)) in schedule.iter().enumerate() {
        let next_due = schedule.get(k + 1).map_or(usize::MAX, |(d, _, _)| *d);
        while progress.next.load(Ordering::SeqCst) < due
            && !progress.clients_done.load(Ordering::SeqCst)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let place = &cells.places[index];
        // One machine at a time: the cell whole again before the next loss.
        let unsettled_before = !place.settled(Duration::from_secs(90)).await;
        let injected = inject(place, kind, &progress, next_due)
            .await
            .with_context(|| format!("{} in cell {}", kind.name(), place.id))?;
        out.push(Injected {
            unsettled_before,
            ..injected
        });
        println!(
            "chaos --ha: {}",
            out.last().map(ToString::to_string).unwrap_or_default()
        );
    }
    Ok(out)
}

/// How long a fault's cell may take to commit again before it counts as not served.
const SERVED_WITHIN: Duration = Duration::from_secs(90);

/// Injects `kind` in `place` and measures. The gate opens once the fault is in place and
/// stays open while it is measured (its transfers must not run out before its cell answers
/// again), then closes at `next_due` (or where the clients are by then).
async fn inject(
    place: &Place,
    kind: Kind,
    progress: &Progress,
    next_due: usize,
) -> anyhow::Result<Injected> {
    let open = || progress.gate.store(usize::MAX, Ordering::SeqCst);
    let at;
    let member;
    let mut cut = None;
    match kind {
        Kind::Postmaster | Kind::PgMachine => {
            let mut cell = place.cell.lock().await;
            let leader = cell.pg.wait_leader(Duration::from_secs(60)).await?;
            member = cell.pg.nodes[leader].name.clone();
            at = Instant::now();
            if kind == Kind::Postmaster {
                cell.pg.kill_postmaster(leader);
            } else {
                place.held().insert(Member::Pg(leader), "machine lost");
                cell.pg.kill_machine(leader);
            }
            open();
        }
        Kind::SpotWipe | Kind::SpotPartition => {
            let leader = place.wait_spot_leader(Duration::from_secs(60)).await?;
            let mut cell = place.cell.lock().await;
            member = cell.spot.replicas[leader].name.clone();
            at = Instant::now();
            if kind == Kind::SpotWipe {
                place.held().insert(Member::Spot(leader), "disk lost");
                cell.spot.kill(leader);
                cell.spot.wipe(leader)?;
                open();
            } else {
                drop(cell);
                let others: Vec<&str> = (0..3)
                    .filter(|i| *i != leader)
                    .map(|i| place.hosts[i].as_str())
                    .collect();
                cut = Some(Cut::new(&place.hosts[leader], &others, place.id)?);
                open();
            }
        }
    }
    let at_transfer = progress.next.load(Ordering::SeqCst);
    let measured = async {
        let times = measure(place, at, progress).await;
        let handed = progress.next.load(Ordering::SeqCst);
        progress.gate.store(next_due.max(handed), Ordering::SeqCst);
        times
    };
    // Held down until another member leads, a few seconds more, then the supervisor's pass
    // starts it again (a machine coming back).
    // Returns when another member led (`None`: not seen, or not asked).
    let hold = async {
        let mut other_leads = None;
        match kind {
            Kind::PgMachine => {
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    let cell = place.cell.lock().await;
                    let leads = cell.pg.leader().await;
                    if leads.is_some_and(|l| cell.pg.nodes[l].name != member) {
                        other_leads = Some(at.elapsed());
                        break;
                    }
                    drop(cell);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                place.held().retain(|m, _| !matches!(m, Member::Pg(_)));
            }
            Kind::SpotWipe => {
                // The wiped replica is down: whoever answers as the leader is another.
                if place
                    .wait_spot_leader(Duration::from_secs(60))
                    .await
                    .is_ok()
                {
                    other_leads = Some(at.elapsed());
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                place
                    .held()
                    .retain(|m, why| !(matches!(m, Member::Spot(_)) && *why == "disk lost"));
            }
            Kind::SpotPartition => {
                // Longer than the leader's acknowledgement timeout (3 s) and a new leader's
                // take-over: it must step down, another lead. Then healed.
                let until = Instant::now() + Duration::from_secs(rand::rng().random_range(6..=9));
                while Instant::now() < until {
                    if other_leads.is_none() {
                        let cell = place.cell.lock().await;
                        let leads = cell.spot.leader().await;
                        if leads.is_some_and(|l| cell.spot.replicas[l].name != member) {
                            other_leads = Some(at.elapsed());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                drop(cut);
            }
            Kind::Postmaster => {}
        }
        other_leads
    };
    let ((answered_again, served_again), other_leads) = tokio::join!(measured, hold);
    let not_served = served_again.is_none()
        && answered_again.is_none_or(|d| d >= SERVED_WITHIN)
        && !progress.clients_done.load(Ordering::SeqCst);
    let back = place
        .settled(Duration::from_secs(120))
        .await
        .then(|| at.elapsed());
    Ok(Injected {
        kind,
        cell: place.id,
        member,
        at_transfer,
        other_leads,
        answered_again,
        served_again,
        back,
        unsettled_before: false,
        not_served,
    })
}

/// Waits until a request of the cell sent after `at` was answered, and one answered
/// COMMITTED; how long after `at` each (`None` past the bound, or when the clients are done).
async fn measure(
    place: &Place,
    at: Instant,
    progress: &Progress,
) -> (Option<Duration>, Option<Duration>) {
    let deadline = at + SERVED_WITHIN;
    let (mut answered, mut committed) = (None, None);
    while Instant::now() < deadline && committed.is_none() {
        let (a, c) = place.served_after(at);
        if a && answered.is_none() {
            answered = Some(at.elapsed());
        }
        if c {
            committed = Some(at.elapsed());
        }
        if progress.clients_done.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (answered, committed)
}

/// An nftables table dropping traffic between one loopback address and others (both ways),
/// deleted on drop.
struct Cut {
    table: String,
}

impl Cut {
    fn new(from: &str, others: &[&str], cell: u16) -> anyhow::Result<Cut> {
        use std::io::Write;
        let table = format!("chaosha{}c{cell}", std::process::id());
        let set = others.join(", ");
        let script = format!(
            "add table inet {table}\n\
             add chain inet {table} out {{ type filter hook output priority 0 ; policy accept ; }}\n\
             add rule inet {table} out ip saddr {from} ip daddr {{ {set} }} drop\n\
             add rule inet {table} out ip saddr {{ {set} }} ip daddr {from} drop\n"
        );
        let mut child = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .context("run nft (root and nftables needed; scripts/test installs it)")?;
        child
            .stdin
            .take()
            .context("nft's stdin")?
            .write_all(script.as_bytes())?;
        anyhow::ensure!(child.wait()?.success(), "nft -f: {script}");
        Ok(Cut { table })
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// The supervisor: a pass over every cell each second until `stop`; what it started, by name.
pub(super) fn supervise_every_second(
    cells: &Cells,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<String>> {
    let mut started = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(1));
        for place in &cells.places {
            started.extend(
                place
                    .supervise()?
                    .into_iter()
                    .map(|s| format!("cell {}: {s}", place.id)),
            );
        }
    }
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_spread_interleaved_and_round_the_cells() {
        let s = schedule(
            &[
                (Kind::PgMachine, 1),
                (Kind::SpotWipe, 1),
                (Kind::SpotPartition, 2),
            ],
            500,
            2,
        );
        assert_eq!(
            s,
            [
                (100, Kind::PgMachine, 0),
                (200, Kind::SpotWipe, 1),
                (300, Kind::SpotPartition, 0),
                (400, Kind::SpotPartition, 1),
            ]
        );
    }
}
