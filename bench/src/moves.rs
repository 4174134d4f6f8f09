//! `ledger-bench move` (ADR 0023, issue 51): a partition moved back and forth between two real
//! cells under load, with the move runner in the bench process (`movecells.rs` builds the
//! world). Per history size (`--history`, events of the moving partition): the history is built
//! through the bulk submit (timed), clients trade for the moving partition's users and for other
//! partitions' users of both cells, and `--moves` moves run A->B, B->A, ... `--gap` seconds apart,
//! each driven step by step with every step (and every store call) timed. Figures: the moved
//! users' pause (client side: first fenced refusal to first success after it, the worst user of
//! each move; runner side: PAUSING recorded to DONE recorded), the other users' committed rate
//! during the moves against a window before them, the move's time and where it goes, and both
//! cells' full conservation check after the last move.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adapters::pg::map_moves::PgMapMoves;
use adapters::pg::moves::PgMoves;
use adapters::spot::moves::EngineMoves;
use anyhow::{bail, Context};
use application::moves::{MoveError, MoveId, MoveRecords, MoveRunner, MoveSettings, MoveStep};
use application::moves::{MoveRecord, NoHold};
use application::SystemClock;
use cells::{CellId, Partition};

use crate::movecells::{bulk, client, deposit, owner, users_of, users_of_cell, Load, Times, Two};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Events of history in the moving partition, one run per size.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    history: Vec<u64>,
    /// Moves per history size, back and forth (cell 1 -> 2, 2 -> 1, ...).
    #[arg(long, default_value_t = 10)]
    moves: usize,
    /// Seconds between the end of a move and the start of the next.
    #[arg(long, default_value_t = 3)]
    gap: u64,
    /// Users of the moving partition, each a client under load.
    #[arg(long, default_value_t = 20)]
    movers: usize,
    /// Milliseconds each moving user's client waits between two transfers: the load must not
    /// grow the partition's history much beyond `--history` while the moves run.
    #[arg(long, default_value_t = 200)]
    mover_pause_ms: u64,
    /// Clients of other partitions' users in each cell.
    #[arg(long, default_value_t = 6)]
    others: usize,
    /// Seconds of the window before the first move whose rate of the other users is the
    /// baseline.
    #[arg(long, default_value_t = 20)]
    before: u64,
    /// Other partitions' history in the source cell, as a share of the moving partition's.
    #[arg(long, default_value_t = 0.25)]
    others_history: f64,
    /// Before each move, both engines forget the `(req_id, op)` records older than this many
    /// milliseconds (spot-core's idempotency horizon; the ledger's default retention is 7
    /// days). A move-out carries the partition's records in one WAL record of at most 1 MiB
    /// (about 4,500 records), so a partition that traded more than that within the horizon
    /// cannot move: `0` keeps every record, as production would, and such a move is cancelled.
    #[arg(long, default_value_t = 2_000)]
    spot_retention_ms: u64,
    /// Concurrent bulk batches (of 500) while building the history.
    #[arg(long, default_value_t = 4)]
    builders: usize,
    /// The shared PostgreSQL server (both cells' databases are made fresh on it).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    server: String,
    #[arg(long, default_value = "prefer")]
    sslmode: String,
}

/// The moving partition (cell 1's under the first map).
fn moving() -> Partition {
    Partition::new(5).expect("partition 5")
}

/// One move, as it went.
struct Moved {
    from: CellId,
    step: MoveStep,
    reason: Option<String>,
    start: Instant,
    total: Duration,
    /// PAUSING recorded to DONE recorded.
    paused: Option<Duration>,
    steps: BTreeMap<&'static str, Duration>,
    stores: Times,
    passes: u32,
    copied: u64,
    /// Other users' final answers during the move.
    others: u64,
}

/// The figures of one history size.
struct Size {
    history: u64,
    events: i64,
    /// The partition's events in its owner after the last move (the load's included).
    events_after: i64,
    build: Duration,
    first_check: Duration,
    moves: Vec<Moved>,
    client_pauses: Vec<Option<Duration>>,
    before_rate: f64,
    during_rate: f64,
    mover_rate: f64,
    errors: u64,
    exact: [bool; 2],
    steal: f64,
}

/// `ledger-bench move`.
pub async fn run(args: Args) -> anyhow::Result<Vec<String>> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut sizes = Vec::new();
    for &history in &args.history {
        println!("== history {history} events in partition {} ==", moving());
        let size = one_size(&args, history).await?;
        print_size(&size);
        sizes.push(size);
    }
    let summary = summary(&command, &args, &sizes);
    println!();
    for line in &summary {
        println!("{line}");
    }
    Ok(summary)
}

/// The users of one run: the moving partition's, and other partitions' of each cell.
struct Users {
    movers: Vec<u64>,
    others1: Vec<u64>,
    others2: Vec<u64>,
}

/// One history size: the cells, the history, the load, the baseline, the moves, the checks.
async fn one_size(args: &Args, history: u64) -> anyhow::Result<Size> {
    let two = Arc::new(Two::start(&args.server, &args.sslmode).await?);
    let p = moving();
    let users = Users {
        movers: users_of(p, args.movers),
        others1: users_of_cell(1, p, args.others),
        others2: users_of_cell(2, p, args.others),
    };
    deposit(&two.cells[0], &users.movers).await?;
    deposit(&two.cells[0], &users.others1).await?;
    deposit(&two.cells[1], &users.others2).await?;
    let t = Instant::now();
    let events = build_history(&two, p, &users.movers, &users.others1, history, args).await?;
    let build = t.elapsed();
    println!("built: {events} events of partition {p} in {build:.1?}");
    // The serving process's periodic check would have checkpointed the history already: the
    // move's own check (VERIFYING) is incremental from that checkpoint.
    let t = Instant::now();
    for c in &two.cells {
        adapters::pg::check_incremental(&c.funding, &c.spot).await?;
    }
    let first_check = t.elapsed();
    println!("first conservation checks (both cells, the whole history): {first_check:.1?}");
    let mut size = under_load(&two, args, &users).await?;
    size.exact = check_both(&two).await?;
    let owner = owner(&two.cells[0].pool, p).await.context("the owner")?;
    let at_end = eventlog::copies::partition_event_count(&two.cell(owner).pool, i32::from(p.get()));
    size.events_after = at_end.await?;
    println!(
        "partition {p}'s events in cell {owner} after the moves: {}",
        size.events_after
    );
    size.history = history;
    size.events = events;
    size.build = build;
    size.first_check = first_check;
    Ok(size)
}

/// The clients started, the baseline window, the moves, the clients stopped.
async fn under_load(two: &Arc<Two>, args: &Args, users: &Users) -> anyhow::Result<Size> {
    let load = Arc::new(Load::default());
    let mut tasks = Vec::new();
    for (list, mover) in [
        (&users.movers, true),
        (&users.others1, false),
        (&users.others2, false),
    ] {
        for &u in list {
            let pause = Duration::from_millis(if mover { args.mover_pause_ms } else { 0 });
            let task = client(two.clone(), u, mover, pause, load.clone());
            tasks.push(tokio::spawn(task));
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (c0, t0) = (load.others.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(args.before)).await;
    let before_rate = per_second(load.others.load(Ordering::Relaxed) - c0, t0.elapsed());
    let steal0 = steal_jiffies();
    let (moves, mover_rate) = run_moves(two, args, &load).await?;
    let steal = steal0.and_then(|s| steal_jiffies().map(|e| e.since(&s)));
    load.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await?;
    }
    let client_pauses = client_pauses(&moves, &load, args.gap);
    let (busy, time): (u64, Duration) = moves
        .iter()
        .fold((0, Duration::ZERO), |(n, d), m| (n + m.others, d + m.total));
    Ok(Size {
        history: 0,
        events: 0,
        events_after: 0,
        build: Duration::ZERO,
        first_check: Duration::ZERO,
        moves,
        client_pauses,
        before_rate,
        during_rate: per_second(busy, time),
        mover_rate,
        errors: load.errors.load(Ordering::Relaxed),
        exact: [false; 2],
        steal: steal.unwrap_or(f64::NAN),
    })
}

/// Both cells' full conservation check, printed.
async fn check_both(two: &Two) -> anyhow::Result<[bool; 2]> {
    let mut exact = [false; 2];
    for (i, c) in two.cells.iter().enumerate() {
        let report = adapters::pg::check_full(&c.funding, &c.spot).await?;
        println!(
            "cell {}: full conservation check {} ({} transfers, {} disagreements)",
            c.id,
            if report.ok { "EXACT" } else { "NOT EXACT" },
            report.transfers_checked,
            report.disagreements.len()
        );
        if !report.ok {
            println!("{report:#?}");
        }
        exact[i] = report.ok;
    }
    Ok(exact)
}

fn per_second(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// The moving partition's users trade until the partition holds `history` events (the events
/// per transfer measured on a first batch), and the source's other users a share of that.
async fn build_history(
    two: &Two,
    p: Partition,
    movers: &[u64],
    others: &[u64],
    history: u64,
    args: &Args,
) -> anyhow::Result<i64> {
    let cell = &two.cells[0];
    let count = || eventlog::copies::partition_event_count(&cell.pool, i32::from(p.get()));
    let first = 500u64.min(history / 4).max(movers.len() as u64);
    bulk(cell, movers, first, 1).await?;
    let mut events = count().await?;
    let per = (events as f64 / first as f64).max(1.0);
    let extra = (history as f64 * args.others_history / per) as u64;
    if extra > 0 && !others.is_empty() {
        bulk(cell, others, extra, args.builders).await?;
    }
    while (events as u64) < history {
        let left = ((history - events as u64) as f64 / per).ceil() as u64;
        bulk(cell, movers, left.max(1), args.builders).await?;
        events = count().await?;
    }
    Ok(events)
}

/// The moves, one after the other, `--gap` seconds apart, each from the partition's owner
/// now; answers them and the moving users' final answers per second over the whole phase.
async fn run_moves(two: &Two, args: &Args, load: &Load) -> anyhow::Result<(Vec<Moved>, f64)> {
    let stores = two.stores();
    let records: BTreeMap<_, _> = two
        .cells
        .iter()
        .map(|c| (c.id, PgMoves::new(c.pool.clone())))
        .collect();
    let records = Arc::new(PgMapMoves::new(records));
    let engines = two.cells.iter().map(|c| (c.id, c.engine.clone())).collect();
    let runner = MoveRunner::new(
        records.clone(),
        Arc::new(stores.clone()),
        Arc::new(EngineMoves::new(engines)),
        Arc::new(NoHold),
        Arc::new(SystemClock),
        MoveSettings::default(),
    );
    let (m0, t0) = (load.movers.load(Ordering::Relaxed), Instant::now());
    let mut moves = Vec::new();
    for i in 0..args.moves {
        let from = owner(&two.cells[0].pool, moving())
            .await
            .context("the partition's owner")?;
        let to = if from == CellId::ONE {
            two.cells[1].id
        } else {
            CellId::ONE
        };
        let version = map_version(&two.cell(from).pool).await?;
        if args.spot_retention_ms > 0 {
            forget_records(two, args.spot_retention_ms).await?;
        }
        stores.take();
        let c0 = load.others.load(Ordering::Relaxed);
        let mut moved = drive_timed(&runner, records.as_ref(), from, to, version).await?;
        moved.stores = stores.take();
        moved.others = load.others.load(Ordering::Relaxed) - c0;
        print_move(i + 1, &moved, to);
        moves.push(moved);
        tokio::time::sleep(Duration::from_secs(args.gap)).await;
    }
    let movers = load.movers.load(Ordering::Relaxed) - m0;
    Ok((moves, per_second(movers, t0.elapsed())))
}

/// Both engines' idempotency horizon advanced to `retention_ms` ago.
async fn forget_records(two: &Two, retention_ms: u64) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let before_ms = u64::try_from(now.as_millis())?.saturating_sub(retention_ms);
    for c in &two.cells {
        let request = spot_core::protocol::Request::AdvanceHorizon { before_ms };
        c.engine.call(&request).await?;
    }
    Ok(())
}

async fn map_version(pool: &sqlx::PgPool) -> anyhow::Result<u64> {
    let v: i64 = sqlx::query_scalar("SELECT map_version FROM cell_identity")
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(v)?)
}

/// One move started and driven with `runner.step` until it ends, each step's time added up
/// under its name; a failed step is retried after a second, from the stored record.
async fn drive_timed(
    runner: &MoveRunner,
    records: &PgMapMoves,
    from: CellId,
    to: CellId,
    version: u64,
) -> anyhow::Result<Moved> {
    let id = MoveId(ulid::Ulid::new().to_string());
    let start = Instant::now();
    let mut record = runner
        .start(id.clone(), moving(), from, to, version)
        .await?;
    let mut steps: BTreeMap<&'static str, Duration> = BTreeMap::new();
    let mut pausing: Option<Instant> = None;
    let mut failed = 0;
    while !record.step.is_end() {
        let (at, t) = (record.step, Instant::now());
        if at == MoveStep::Pausing {
            pausing.get_or_insert(t);
        }
        match runner.step(record.clone()).await {
            Ok(next) => record = next,
            Err(e @ (MoveError::Store(_) | MoveError::Superseded(_))) => {
                failed += 1;
                eprintln!("move {id} at {}: {e}; again ({failed})", at.as_str());
                if failed == 10 && record.step.may_cancel() {
                    // The runner retries a failed step forever (its partition frozen from
                    // PAUSING on): the bench cancels it, as an operator would.
                    runner.cancel(&id, &format!("bench: {e}")).await?;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                record = reload(records, &id).await?;
            }
            Err(e) => bail!("move {id} at {}: {e}", at.as_str()),
        }
        *steps.entry(at.as_str()).or_default() += t.elapsed();
        if start.elapsed() > Duration::from_secs(900) {
            bail!(
                "move {id} did not end in 15 minutes: at {}",
                record.step.as_str()
            );
        }
    }
    Ok(Moved {
        from,
        step: record.step,
        reason: record.reason.clone(),
        start,
        total: start.elapsed(),
        paused: pausing
            .filter(|_| record.step == MoveStep::Done)
            .map(|t| t.elapsed()),
        steps,
        stores: Times::default(),
        passes: record.passes,
        copied: record.copied,
        others: 0,
    })
}

async fn reload(records: &PgMapMoves, id: &MoveId) -> anyhow::Result<MoveRecord> {
    records.load(id).await?.context("the move's record")
}

/// Per move, the worst moving user's pause: from their first fenced refusal during the move
/// (or in the `gap` after it) to their first success after that refusal. `None` when no moving
/// user was refused.
fn client_pauses(moves: &[Moved], load: &Load, gap: u64) -> Vec<Option<Duration>> {
    let log = load.log.lock().expect("the log");
    moves
        .iter()
        .map(|m| {
            let end = m.start + m.total + Duration::from_secs(gap);
            // Per user: the first refusal not yet followed by a success (None once it was).
            let mut first: BTreeMap<u64, Option<Instant>> = BTreeMap::new();
            let mut worst: Option<Duration> = None;
            for &(at, user, fenced) in log.iter().filter(|e| e.0 >= m.start && e.0 <= end) {
                match (fenced, first.get(&user).copied()) {
                    (true, None) => {
                        first.insert(user, Some(at));
                    }
                    (false, Some(Some(f))) => {
                        let pause = at.saturating_duration_since(f);
                        worst = Some(worst.map_or(pause, |w| w.max(pause)));
                        first.insert(user, None);
                    }
                    _ => {}
                }
            }
            worst
        })
        .collect()
}

/// The machine's steal time so far (`/proc/stat`'s `cpu` line), to say how much of the
/// run's CPU the host took away.
#[derive(Clone, Copy)]
struct Steal {
    steal: u64,
    total: u64,
}

impl Steal {
    /// Steal as a share of all CPU time since `before`, in percent.
    fn since(&self, before: &Steal) -> f64 {
        let total = self.total.saturating_sub(before.total).max(1);
        self.steal.saturating_sub(before.steal) as f64 * 100.0 / total as f64
    }
}

fn steal_jiffies() -> Option<Steal> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let xs: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    Some(Steal {
        steal: *xs.get(7)?,
        total: xs.iter().take(8).sum(),
    })
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn median_max(mut xs: Vec<Duration>) -> (Duration, Duration) {
    xs.sort();
    let n = xs.len();
    if n == 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let median = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2
    };
    (median, xs[n - 1])
}

fn print_move(n: usize, m: &Moved, to: CellId) {
    let steps: Vec<String> = m
        .steps
        .iter()
        .map(|(k, v)| format!("{k} {}", secs(*v)))
        .collect();
    println!(
        "move {n}: cell {} -> {to}: {} in {} s (PAUSING..DONE {} s; {} rows copied, {} catch-up passes; drain+freeze {} s) [{}]{}",
        m.from,
        m.step.as_str(),
        secs(m.total),
        m.paused.map_or("n/a".into(), secs),
        m.copied,
        m.passes,
        secs(m.stores.drain),
        steps.join(", "),
        m.reason.as_ref().map_or(String::new(), |r| format!(" reason: {r}"))
    );
}

/// The median over the moves of one part of the breakdown.
fn part(moves: &[Moved], f: impl Fn(&Moved) -> Duration) -> String {
    let (median, max) = median_max(moves.iter().map(f).collect());
    format!("{}/{}", secs(median), secs(max))
}

fn step(m: &Moved, name: &str) -> Duration {
    m.steps.get(name).copied().unwrap_or_default()
}

fn call(m: &Moved, name: &str) -> Duration {
    m.stores.calls.get(name).copied().unwrap_or_default()
}

/// One row of the breakdown: what it reads of a move.
type Part = fn(&Moved) -> Duration;

fn print_size(s: &Size) {
    let m = &s.moves;
    println!();
    println!(
        "breakdown at {} events (median/max over {} moves, seconds):",
        s.history,
        m.len()
    );
    println!("| part | median/max s |\n|---|---|");
    let rows: [(&str, Part); 17] = [
        ("whole move", |m| m.total),
        ("PLANNED (mark incoming)", |m| step(m, "PLANNED")),
        ("COPYING (first pass)", |m| step(m, "COPYING")),
        ("CATCHING_UP (all passes)", |m| step(m, "CATCHING_UP")),
        ("PAUSING", |m| step(m, "PAUSING")),
        ("  history prefixes (live, both cells)", |m| {
            call(m, "history prefixes")
        }),
        ("  checks' warm-up (live, sum of 2)", |m| {
            call(m, "conservation warm-up")
        }),
        ("  copy before the hold (live)", |m| {
            call(m, "copy before the hold")
        }),
        ("  drain + freeze", |m| m.stores.drain),
        ("  of which freeze calls", |m| call(m, "freeze calls")),
        ("  last tail copy", |m| call(m, "tail")),
        ("MOVING_SPOT", |m| step(m, "MOVING_SPOT")),
        ("VERIFYING", |m| step(m, "VERIFYING")),
        ("  both books (sum of 2)", |m| call(m, "books")),
        ("  both conservation checks (sum of 2)", |m| {
            call(m, "conservation")
        }),
        ("SWITCHING", |m| step(m, "SWITCHING")),
        ("PAUSING..DONE", |m| m.paused.unwrap_or_default()),
    ];
    for (name, f) in rows {
        println!("| {name} | {} |", part(m, f));
    }
}

fn pause_cell(xs: &[Option<Duration>]) -> String {
    let known: Vec<Duration> = xs.iter().flatten().copied().collect();
    let (median, max) = median_max(known.clone());
    format!(
        "{}/{} ({} of {})",
        secs(median),
        secs(max),
        known.len(),
        xs.len()
    )
}

fn summary(command: &str, args: &Args, sizes: &[Size]) -> Vec<String> {
    let mut out = vec![
        format!("command: {command}"),
        format!(
            "{} moving users of partition {}, {} other users in each cell, {} s baseline window, {} s between moves",
            args.movers, moving(), args.others, args.before, args.gap
        ),
        "| history (events) | built in s | first check s | moves DONE | move s median/max | pause client s median/max (moves seen) | PAUSING..DONE s median/max | others' tx/s before -> during (ratio) | movers' tx/s | errors | conservation after | steal % |".into(),
        "|---|---|---|---|---|---|---|---|---|---|---|---|".into(),
    ];
    for s in sizes {
        let done = s.moves.iter().filter(|m| m.step == MoveStep::Done).count();
        let paused: Vec<Option<Duration>> = s.moves.iter().map(|m| m.paused).collect();
        let (tm, tx) = median_max(s.moves.iter().map(|m| m.total).collect());
        out.push(format!(
            "| {} ({} built, {} after) | {:.1} | {:.1} | {done}/{} | {}/{} | {} | {} | {:.0} -> {:.0} ({:.2}) | {:.0} | {} | cell 1 {}, cell 2 {} | {:.1} |",
            s.history,
            s.events,
            s.events_after,
            s.build.as_secs_f64(),
            s.first_check.as_secs_f64(),
            s.moves.len(),
            secs(tm),
            secs(tx),
            pause_cell(&s.client_pauses),
            pause_cell(&paused),
            s.before_rate,
            s.during_rate,
            s.during_rate / s.before_rate.max(1e-9),
            s.mover_rate,
            s.errors,
            if s.exact[0] { "exact" } else { "NOT EXACT" },
            if s.exact[1] { "exact" } else { "NOT EXACT" },
            s.steal
        ));
    }
    out.push("targets: pause median <= 2 s, max <= 5 s; others' ratio >= 0.80".into());
    out
}
