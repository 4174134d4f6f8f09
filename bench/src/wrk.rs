//! The same transfers as a client would drive them with a real HTTP load tool: a `ledger up` with
//! its default settings (info logging, the invariant monitor, the recovery worker, contract §5.4's
//! limits of 10 requests/s and 100 transfers/day per user), signed in as many users, driven
//! first by this benchmark's own client and then by `wrk` with `bench/wrk/transfers.lua`, and
//! printed side by side.

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use domain::UserId;
use futures_util::{stream, StreamExt, TryStreamExt};
use serde_json::json;

use crate::clients::{drive, Pids};
use crate::procstat;
use crate::transfers::{spawn_ready, Args, Proc, SECRET};

/// The wrk script, written next to the token file for each run.
const SCRIPT: &str = include_str!("../wrk/transfers.lua");
/// wrk's threads: one per core of this 2-core machine.
const WRK_THREADS: usize = 2;
/// The first user id of the `ledger up` runs.
const USER_FIRST: u64 = 100_000;
/// Settings `ledger up` must not inherit, so it runs with its defaults.
const NOT_INHERITED: [&str; 10] = [
    "RUST_LOG",
    "LEDGER_RATE_PER_SECOND",
    "LEDGER_DAILY_COUNT_MAX",
    "LEDGER_DAILY_AMOUNT_MAX",
    "LEDGER_INVARIANT_INTERVAL_SECS",
    "LEDGER_RECOVERY_STALE_MS",
    "LEDGER_RECOVERY_INTERVAL_MS",
    "LEDGER_RECOVERY_LEASE_MS",
    "LEDGER_FAILPOINT",
    "LEDGER_SPOT_CORE_TOKEN",
];

/// What wrk's script printed.
struct WrkResult {
    requests: u64,
    duration: Duration,
    committed: u64,
    other: u64,
    errors: u64,
    p50_ms: f64,
    p99_ms: f64,
}

impl WrkResult {
    fn parse(out: &str) -> anyhow::Result<Self> {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("WRK_RESULT "))
            .context("wrk printed no WRK_RESULT line")?;
        let field = |name: &str| -> anyhow::Result<u64> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .with_context(|| format!("WRK_RESULT has no {name}"))?
                .parse()
                .with_context(|| format!("WRK_RESULT {name}"))
        };
        Ok(Self {
            requests: field("requests")?,
            duration: Duration::from_micros(field("duration_us")?),
            committed: field("committed")?,
            other: field("other")?,
            errors: field("errors")?,
            p50_ms: field("p50_us")? as f64 / 1000.0,
            p99_ms: field("p99_us")? as f64 / 1000.0,
        })
    }

    fn tps(&self) -> f64 {
        self.committed as f64 / self.duration.as_secs_f64()
    }
}

/// Runs both clients against one `ledger up` on its own database; returns the summary lines.
// long: one measurement read top to bottom (start the server, run both clients, figures); a figures tool.
pub async fn run(args: &Args, serve_url: &str) -> anyhow::Result<Vec<String>> {
    if Command::new("wrk").arg("--version").output().is_err() {
        println!("== ledger up through wrk: wrk is not installed (Debian: apt-get install wrk); skipped ==");
        return Ok(vec!["wrk: not installed, skipped".to_owned()]);
    }
    let url = serve_url.replacen("/ledger_bench?", "/ledger_bench_up?", 1);
    {
        use sqlx::ConnectOptions;
        let admin = url
            .parse::<sqlx::postgres::PgConnectOptions>()?
            .database("postgres");
        let mut conn = admin.connect().await?;
        sqlx::query("DROP DATABASE IF EXISTS ledger_bench_up WITH (FORCE)")
            .execute(&mut conn)
            .await?;
    }
    let data = std::env::temp_dir().join(format!("ledger-bench-up-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&data)?;
    let mut cmd = Command::new(crate::transfers::bin("ledger")?);
    cmd.args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.join("up"))
        .env("DATABASE_URL", &url)
        .env("LEDGER_JWT_SECRET", SECRET);
    for name in NOT_INHERITED {
        cmd.env_remove(name);
    }
    let (up, api) = spawn_ready(cmd, "API:")?;
    let base = api.trim().to_owned();
    let up = Stopped(up);
    println!(
        "ledger up: {base} (pid {}), default settings, its own spot-core child",
        up.0.child.id()
    );

    let users = args.wrk_users.max(args.wrk_connections);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.wrk_connections * 2)
        .build()?;
    let admin = edge::mint(
        SECRET.as_bytes(),
        UserId::new(1).expect("user 1"),
        true,
        Duration::from_secs(3600),
    );
    stream::iter(0..users as u64)
        .map(|i| {
            let http = http.clone();
            let admin = admin.clone();
            let base = base.clone();
            async move {
                let user = USER_FIRST + i;
                let r = http
                    .post(format!("{base}/api/v1/admin/deposits"))
                    .bearer_auth(&admin)
                    .json(&json!({"user_id": user, "asset": "USDT", "amount": "1000000", "external_id": format!("bench-up-{user}")}))
                    .send()
                    .await?;
                if !r.status().is_success() {
                    bail!("seed deposit failed: {}", r.text().await?);
                }
                Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let tokens: Vec<String> = (0..users as u64)
        .map(|i| {
            let user = UserId::new(USER_FIRST + i).expect("valid user id");
            edge::mint(SECRET.as_bytes(), user, false, Duration::from_secs(3600))
        })
        .collect();
    println!(
        "seeded {users} users; limits left at their defaults (10 requests/s, 100 transfers/day per user): each user sends well under both"
    );

    // The own client: the users dealt out to the connections, each taking its users in turn.
    let mut dealt = vec![Vec::new(); args.wrk_connections];
    for (i, token) in tokens.iter().enumerate() {
        dealt[i % args.wrk_connections].push(token.clone());
    }
    let pids = Pids {
        ledger: Some(up.0.child.id()),
        spot: None,
    };
    let own = drive(&http, &base, dealt, Duration::from_secs(args.seconds), pids).await?;
    own.print(&format!(
        "ledger up, this benchmark's client ({} connections, {users} users)",
        args.wrk_connections
    ));

    // wrk, the same connections and users.
    let script = data.join("transfers.lua");
    std::fs::write(&script, SCRIPT)?;
    let token_file = data.join("tokens.txt");
    std::fs::write(&token_file, tokens.join("\n") + "\n")?;
    let busy_before = procstat::machine_busy();
    let out = tokio::task::spawn_blocking({
        let (script, token_file, base) = (script.clone(), token_file.clone(), base.clone());
        let (connections, seconds) = (args.wrk_connections, args.seconds);
        move || {
            Command::new("wrk")
                .arg(format!("-t{WRK_THREADS}"))
                .arg(format!("-c{connections}"))
                .arg(format!("-d{seconds}s"))
                .arg("-s")
                .arg(&script)
                .arg(&base)
                .arg("--")
                .arg(&token_file)
                .arg(WRK_THREADS.to_string())
                .output()
        }
    })
    .await??;
    let busy = procstat::machine_busy() - busy_before;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "wrk failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let wrk = WrkResult::parse(&stdout)?;
    let wrk_cpu_ms = busy.as_secs_f64() * 1000.0 / wrk.committed.max(1) as f64;
    println!();
    println!(
        "== ledger up, wrk -t{WRK_THREADS} -c{} -d{}s -s bench/wrk/transfers.lua ({users} users) ==",
        args.wrk_connections, args.seconds
    );
    println!(
        "requests:                   {} (committed {}, other answers {}, socket/HTTP errors {})",
        wrk.requests, wrk.committed, wrk.other, wrk.errors
    );
    println!("committed transfers/s:      {:.0}", wrk.tps());
    println!(
        "latency (every request) ms: p50 {:.1}  p99 {:.1}",
        wrk.p50_ms, wrk.p99_ms
    );
    println!("machine CPU per transfer:   {wrk_cpu_ms:.3} ms (wrk's own included)");
    let ratio = wrk.tps() / own.tps().max(1e-9);
    println!();
    println!("== ledger up: wrk beside this benchmark's client ==");
    println!(
        "                 transfers/s   p50 ms   p99 ms   machine CPU ms each\n  own client     {:>11.0}   {:>6.1}   {:>6.1}   {:>8.3}\n  wrk            {:>11.0}   {:>6.1}   {:>6.1}   {:>8.3}\n  wrk / own      {ratio:>11.2}",
        own.tps(),
        own.pct(0.50),
        own.pct(0.99),
        own.per_transfer_ms(own.cpu.machine),
        wrk.tps(),
        wrk.p50_ms,
        wrk.p99_ms,
        wrk_cpu_ms,
    );
    drop(up);
    std::fs::remove_dir_all(&data).ok();
    Ok(vec![format!(
        "ledger up with default settings, {} connections, {users} users: wrk {:.0}/s (p50 {:.1} ms, p99 {:.1} ms) beside the own client's {:.0}/s (p50 {:.1} ms, p99 {:.1} ms); wrk / own {ratio:.2} (target within 20 %)",
        args.wrk_connections,
        wrk.tps(),
        wrk.p50_ms,
        wrk.p99_ms,
        own.tps(),
        own.pct(0.50),
        own.pct(0.99),
    )])
}

/// `ledger up` stopped with SIGTERM, so it stops its spot-core child too; killed if it lingers.
struct Stopped(Proc);

impl Drop for Stopped {
    fn drop(&mut self) {
        let pid = self.0.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..100 {
            if matches!(self.0.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
