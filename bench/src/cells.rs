//! Cells (ADR 0017, issue 34): what a cell map costs and what a fault in one cell costs the
//! others.
//!
//! - `transfers --cells N`: (1) the routing cost: one cell without a map (today) against one cell
//!   under a map (the front router, the placement, the per-cell wiring), in alternating runs
//!   (ABAB...), the median machine CPU per transfer of each (target: the map's at most 5 %
//!   higher); (2) the rate and machine CPU per transfer of 1 cell and of N cells under a map, in
//!   the same run. Two cores cannot show scale-out itself: N cells on one machine share its CPU.
//! - `cells`: three cells (cell 3's database on a private PostgreSQL cluster the benchmark
//!   makes), clients in every cell, and the three faults one after the other: SIGKILL cell 3's
//!   spot-core, stop cell 3's PostgreSQL, plant a conservation mismatch in cell 1 by SQL and run
//!   the check (cell 1 halts). For each: the other cells' committed rate during the fault against
//!   the window before it (target >= 80 %), and the faulted cell's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use domain::UserId;
use serde_json::json;

use crate::cellstack::{Layout, PrivateCluster, Stack};
use crate::clients::{drive, transfer_one, Pids, Run};
use crate::transfers::SECRET;

/// The users the benchmark clients move money for: 1000, 1001, ...
const FIRST_USER: u64 = 1000;

fn mint(user: u64, admin: bool) -> String {
    edge::mint(
        SECRET.as_bytes(),
        UserId::new(user).expect("a user id"),
        admin,
        Duration::from_secs(3600),
    )
}

/// Deposits 1,000,000 USDT for each of `users` through the admin route (its user's cell).
async fn seed(http: &reqwest::Client, base: &str, users: &[u64]) -> anyhow::Result<()> {
    let admin = mint(1, true);
    for &user in users {
        let r = http
            .post(format!("{base}/api/v1/admin/deposits"))
            .bearer_auth(&admin)
            .json(
                &json!({"user_id": user, "asset": "USDT", "amount": "1000000",
                          "external_id": format!("bench-seed-{user}-{}", ulid::Ulid::new())}),
            )
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("seed deposit for user {user} failed: {}", r.text().await?);
        }
    }
    Ok(())
}

/// One run of `clients` clients (users 1000..) against `stack`.
async fn run_on(
    http: &reqwest::Client,
    stack: &Stack,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<Run> {
    let users = (0..clients)
        .map(|c| vec![mint(FIRST_USER + c as u64, false)])
        .collect();
    let pids = Pids {
        ledger: Some(stack.ledger.child.id()),
        spot: stack.spots.first().and_then(|s| s.pid()),
    };
    drive(http, &stack.base, users, Duration::from_secs(seconds), pids).await
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// `ledger-bench transfers --cells N`.
// long: one measurement read top to bottom (the ABAB rounds, then 1 and N cells); a figures tool.
pub async fn transfers(args: &crate::transfers::Args, cells: u16) -> anyhow::Result<Vec<String>> {
    if !(2..=8).contains(&cells) {
        bail!("--cells must be from 2 to 8 (1 cell is always measured beside it)");
    }
    let clients = args.clients.first().copied().unwrap_or(32);
    let (server, sslmode) = (args.server.as_str(), args.sslmode.as_str());
    let users: Vec<u64> = (0..clients as u64).map(|c| FIRST_USER + c).collect();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients * 2)
        .build()?;
    let layout = |name, cells| Layout {
        name,
        cells,
        server,
        private: &[],
        sslmode,
    };
    // (1) The routing cost: today's one cell against one cell under a map, alternating.
    let plain = Stack::start(&layout("plain", None)).await?;
    let mapped = Stack::start(&layout("map1", Some(1))).await?;
    seed(&http, &plain.base, &users).await?;
    seed(&http, &mapped.base, &users).await?;
    println!(
        "routing cost: {} rounds of {} s each, {clients} clients: no map, then a map of 1 cell",
        args.rounds, args.seconds
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // The ledger process's own CPU per transfer too: where routing is paid, and not blurred by
    // other work on a shared machine as the machine's figure is.
    let (mut la, mut lb) = (Vec::new(), Vec::new());
    let mut mapped_runs = Vec::new();
    for round in 1..=args.rounds {
        let without = run_on(&http, &plain, clients, args.seconds).await?;
        let with = run_on(&http, &mapped, clients, args.seconds).await?;
        let (ca, cb) = (
            without.per_transfer_ms(without.cpu.machine),
            with.per_transfer_ms(with.cpu.machine),
        );
        println!(
            "  round {round}: no map {:.0}/s {ca:.3} ms CPU each | map of 1 cell {:.0}/s {cb:.3} ms CPU each",
            without.tps(),
            with.tps()
        );
        a.push(ca);
        b.push(cb);
        la.push(without.per_transfer_ms(without.cpu.ledger));
        lb.push(with.per_transfer_ms(with.cpu.ledger));
        mapped_runs.push(with);
    }
    drop(plain);
    let (ma, mb) = (median(a), median(b));
    let routing = mb / ma.max(1e-9) - 1.0;
    let (mla, mlb) = (median(la), median(lb));
    let routing_ledger = mlb / mla.max(1e-9) - 1.0;
    // (2) 1 cell and N cells under a map, in the same run.
    let one = mapped_runs
        .into_iter()
        .max_by(|x, y| x.tps().total_cmp(&y.tps()))
        .context("at least one round")?;
    drop(mapped);
    let many_stack = Stack::start(&layout("mapn", Some(cells))).await?;
    seed(&http, &many_stack.base, &users).await?;
    let many = run_on(&http, &many_stack, clients, args.seconds).await?;
    drop(many_stack);
    one.print(&format!("transfers, a map of 1 cell ({clients} clients)"));
    many.print(&format!(
        "transfers, a map of {cells} cells on this machine ({clients} clients)"
    ));
    let summary = vec![
        format!(
            "routing cost (median machine CPU per transfer, {} ABAB rounds of {} s): no map {ma:.3} ms, a map of 1 cell {mb:.3} ms: {:+.1} % (target <= +5 %)",
            args.rounds, args.seconds, routing * 100.0
        ),
        format!(
            "routing cost in the ledger process alone (median CPU per transfer): no map {mla:.3} ms, a map of 1 cell {mlb:.3} ms: {:+.1} %",
            routing_ledger * 100.0
        ),
        format!(
            "1 cell: {:.0} transfers/s, {:.3} ms machine CPU each; {cells} cells on the same 2 cores: {:.0}/s, {:.3} ms each ({clients} clients)",
            one.tps(),
            one.per_transfer_ms(one.cpu.machine),
            many.tps(),
            many.per_transfer_ms(many.cpu.machine)
        ),
    ];
    println!();
    for line in &summary {
        println!("{line}");
    }
    Ok(summary)
}

#[derive(clap::Args, Debug)]
pub struct FaultArgs {
    /// Clients per cell, each moving its own user's money.
    #[arg(long, default_value_t = 4)]
    clients_per_cell: usize,
    /// Seconds of each window: before a fault, and during it.
    #[arg(long, default_value_t = 8)]
    window: u64,
    /// The shared PostgreSQL server (cells 1 and 2); cell 3 gets a private cluster.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    server: String,
    #[arg(long, default_value = "prefer")]
    sslmode: String,
}

/// Committed transfers per cell so far, counted by every client.
struct Counters([AtomicU64; 3]);

impl Counters {
    fn snapshot(&self) -> [u64; 3] {
        [0, 1, 2].map(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// `ledger-bench cells`.
// long: the three faults one after the other, each measured and undone; a figures tool.
pub async fn faults(args: FaultArgs) -> anyhow::Result<Vec<String>> {
    let private = PrivateCluster::start().context("a private PostgreSQL for cell 3")?;
    let stack = Stack::start(&Layout {
        name: "faults",
        cells: Some(3),
        server: &args.server,
        private: &[(3, private.server_url())],
        sslmode: &args.sslmode,
    })
    .await?;
    let mut stack = stack;
    let mut users: Vec<(u16, u64)> = Vec::new();
    for cell in 1..=3u16 {
        let mine = (FIRST_USER..)
            .filter(|&u| stack.cell_of(u) == cell)
            .take(args.clients_per_cell);
        users.extend(mine.map(|u| (cell, u)));
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let ids: Vec<u64> = users.iter().map(|(_, u)| *u).collect();
    seed(&http, &stack.base, &ids).await?;
    let counters = Arc::new(Counters(Default::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let url = format!("{}/api/v1/internal_transfer", stack.base);
    let tasks: Vec<_> = users
        .iter()
        .map(|&(cell, user)| {
            let (http, url, counters, stop) =
                (http.clone(), url.clone(), counters.clone(), stop.clone());
            tokio::spawn(async move {
                let token = mint(user, false);
                let mut to_spot = true;
                while !stop.load(Ordering::Relaxed) {
                    if transfer_one(&http, &url, &token, to_spot, None).await {
                        counters.0[usize::from(cell) - 1].fetch_add(1, Ordering::Relaxed);
                        to_spot = !to_spot;
                    } else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();
    let window = Duration::from_secs(args.window);
    let mut summary = Vec::new();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let rates = measure(&counters, window, || {
        stack.spots[2].kill();
        Ok(())
    })
    .await?;
    summary.push(report("SIGKILL cell 3's spot-core", 3, &rates));
    stack.spots[2].restart()?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let rates = measure(&counters, window, || private.stop_immediate()).await?;
    summary.push(report("stop cell 3's PostgreSQL (immediate)", 3, &rates));
    private.pg_ctl_start()?;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let plant = plant_mismatch(&stack, FIRST_USER..);
    let rates = measure_async(&counters, window, plant).await?;
    summary.push(report(
        "a conservation mismatch planted in cell 1 (halted)",
        1,
        &rates,
    ));

    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.ok();
    }
    println!();
    for line in &summary {
        println!("{line}");
    }
    Ok(summary)
}

/// Per-cell committed rates in the window before `fault` and in the window after it.
type Rates = ([f64; 3], [f64; 3]);

async fn measure(
    counters: &Counters,
    window: Duration,
    fault: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Rates> {
    measure_async(counters, window, async move { fault() }).await
}

async fn measure_async(
    counters: &Counters,
    window: Duration,
    fault: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Rates> {
    let rate = |a: [u64; 3], b: [u64; 3], secs: f64| [0, 1, 2].map(|i| (b[i] - a[i]) as f64 / secs);
    let (t0, c0) = (Instant::now(), counters.snapshot());
    tokio::time::sleep(window).await;
    let before = rate(c0, counters.snapshot(), t0.elapsed().as_secs_f64());
    fault.await?;
    // The fault's first second (requests in flight when it struck) is not counted.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (t1, c1) = (Instant::now(), counters.snapshot());
    tokio::time::sleep(window).await;
    let during = rate(c1, counters.snapshot(), t1.elapsed().as_secs_f64());
    Ok((before, during))
}

/// Money out of nowhere in cell 1's FUNDING (no journal row), then the check, which halts it.
async fn plant_mismatch(stack: &Stack, mut users: std::ops::RangeFrom<u64>) -> anyhow::Result<()> {
    let user = users
        .find(|&u| stack.cell_of(u) == 1)
        .context("a user in cell 1")?;
    let pool = sqlx::PgPool::connect(&stack.databases[0]).await?;
    sqlx::query("UPDATE funding_accounts SET balance = balance + 1 WHERE user_id = $1")
        .bind(i64::try_from(user)?)
        .execute(&pool)
        .await?;
    pool.close().await;
    // The invariant route runs in the home cell, cell 1, until the admin views fan out.
    let report: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/api/v1/admin/invariant", stack.base))
        .bearer_auth(mint(1, true))
        .send()
        .await?
        .json()
        .await?;
    if report["halted"] != json!(true) {
        bail!("cell 1 did not halt on the planted mismatch: {report}");
    }
    Ok(())
}

fn report(fault: &str, faulted: u16, (before, during): &Rates) -> String {
    let others: Vec<usize> = (0..3).filter(|&i| i + 1 != usize::from(faulted)).collect();
    let sum = |r: &[f64; 3]| others.iter().map(|&i| r[i]).sum::<f64>();
    let (b, d) = (sum(before), sum(during));
    let f = usize::from(faulted) - 1;
    format!(
        "{fault}: the other cells {b:.0} -> {d:.0} transfers/s during it ({:.0} % of before; target >= 80 %); cell {faulted} {:.0} -> {:.0}/s",
        d / b.max(1e-9) * 100.0,
        before[f],
        during[f]
    )
}
