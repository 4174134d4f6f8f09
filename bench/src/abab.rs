//! Alternating runs (ABAB...) of one setting off and on: the same database, the same spot-core
//! data and the same clients run after run, both processes started afresh for each run with the
//! setting's environment, so what differs between an "off" and an "on" run is the setting, and
//! the machine's drift (another build, a warm cache) falls on both alike. `traces` (trace
//! export) and `tlog` (the tamper-evident log) measure with it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use domain::UserId;
use serde_json::json;

use crate::clients::{drive_batches, Pids, Run};
use crate::transfers::{bin, serve_command, spawn_ready, Proc, SECRET};

/// A clean database, a spot-core data directory and signed-in clients, kept across the runs.
pub(crate) struct Bench {
    pub url: String,
    data: PathBuf,
    pub http: reqwest::Client,
    /// One token per client, each its own user's.
    tokens: Vec<Vec<String>>,
    seconds: u64,
    /// Each run's first seconds, driven and not counted (`drive`).
    settle: Duration,
    seeded: bool,
}

/// spot-core and `ledger serve` of one run; both end when it is dropped.
pub(crate) struct Started {
    spot: Proc,
    ledger: Proc,
    pub base: String,
}

impl Started {
    pub fn pids(&self) -> Pids {
        Pids {
            ledger: Some(self.ledger.child.id()),
            spot: Some(self.spot.child.id()),
        }
    }
}

impl Bench {
    /// Drops and makes `database` on `server` (migrated), and a fresh spot-core data directory.
    pub async fn new(
        server: &str,
        sslmode: &str,
        database: &str,
        clients: usize,
        seconds: u64,
    ) -> anyhow::Result<Self> {
        if clients == 0 {
            bail!("--clients must be above zero");
        }
        let url = format!("{server}/{database}?sslmode={sslmode}");
        {
            use sqlx::ConnectOptions;
            let admin = url
                .parse::<sqlx::postgres::PgConnectOptions>()
                .context("parse server URL")?
                .database("postgres");
            let mut conn = admin.connect().await.context("connect to PostgreSQL")?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
                .execute(&mut conn)
                .await?;
        }
        drop(schema::prepare(&url, 2).await?);
        let data =
            std::env::temp_dir().join(format!("ledger-bench-{database}-{}", ulid::Ulid::new()));
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(clients * 2)
            .build()?;
        let tokens = (0..clients)
            .map(|c| {
                let user = UserId::new(1000 + c as u64).expect("valid user id");
                vec![edge::mint(
                    SECRET.as_bytes(),
                    user,
                    false,
                    Duration::from_secs(3600),
                )]
            })
            .collect();
        Ok(Self {
            url,
            data,
            http,
            tokens,
            seconds,
            settle: Duration::ZERO,
            seeded: false,
        })
    }

    /// spot-core on the kept data and `ledger serve` on the database, with `env` added to both.
    pub fn start(&self, env: &[(&str, String)]) -> anyhow::Result<Started> {
        start(&self.url, &self.data.join("spot"), env)
    }

    /// Drives transfers through `started` for the run's seconds, `bulk` per request (1: the
    /// single route); the first run's clients get their money first.
    /// One measured run: first `settle` of traffic, not counted (its rate is printed), then
    /// `seconds` counted. Both kinds of run settle alike. What it leaves out is each run's start:
    /// a fresh process's pools and caches, and for an "on" run whatever its setting did before
    /// the traffic (the log's catch-up read of the off run's entries pulls them through
    /// PostgreSQL's buffers): what is measured is the setting's cost at a steady state.
    pub async fn drive(&mut self, started: &Started, bulk: usize) -> anyhow::Result<Run> {
        if !self.settle.is_zero() {
            let settle = self.drive_for(started, bulk, self.settle).await?;
            println!(
                "settling, not counted:      {:.1} s at {:.0} transfers/s",
                self.settle.as_secs_f64(),
                settle.tps()
            );
        }
        self.drive_for(started, bulk, Duration::from_secs(self.seconds))
            .await
    }

    /// Sets how long each run settles before it is counted (`drive`).
    pub fn settle(&mut self, seconds: f64) {
        self.settle = Duration::from_secs_f64(seconds.max(0.0));
    }

    async fn drive_for(
        &mut self,
        started: &Started,
        bulk: usize,
        time: Duration,
    ) -> anyhow::Result<Run> {
        if !self.seeded {
            seed(&self.http, &started.base, self.tokens.len()).await?;
            self.seeded = true;
        }
        drive_batches(
            &self.http,
            &started.base,
            self.tokens.clone(),
            time,
            started.pids(),
            bulk,
            None,
        )
        .await
    }

    /// A first run with the setting off, not counted: a fresh database's first seconds run at a
    /// third of the rate (no statistics yet, cold caches), which would otherwise land in "off".
    pub async fn warm_up(&mut self, seconds: u64, bulk: usize) -> anyhow::Result<()> {
        if seconds == 0 {
            return Ok(());
        }
        let started = self.start(&[])?;
        let run = self
            .drive_for(&started, bulk, Duration::from_secs(seconds))
            .await?;
        drop(started);
        run.print("warm-up (setting off, not counted)");
        Ok(())
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.data).ok();
    }
}

/// spot-core on `data` and `ledger serve` on `url`, with `env` added to both.
fn start(url: &str, data: &Path, env: &[(&str, String)]) -> anyhow::Result<Started> {
    let mut spot_cmd = Command::new(bin("spot-core")?);
    spot_cmd
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data);
    for (k, v) in env {
        spot_cmd.env(k, v);
    }
    let (spot, spot_addr) = spawn_ready(spot_cmd, "spot-core listening on ")?;
    let mut ledger_cmd = serve_command(url, &spot_addr)?;
    for (k, v) in env {
        ledger_cmd.env(k, v);
    }
    let (ledger, serving) = spawn_ready(ledger_cmd, "ledger serving on ")?;
    let base = serving
        .split_whitespace()
        .next()
        .context("address")?
        .to_owned();
    Ok(Started { spot, ledger, base })
}

/// Money for every client's user, through the admin deposit route.
async fn seed(http: &reqwest::Client, base: &str, clients: usize) -> anyhow::Result<()> {
    let admin = edge::mint(
        SECRET.as_bytes(),
        UserId::new(1).unwrap(),
        true,
        Duration::from_secs(3600),
    );
    for c in 0..clients {
        let user = 1000 + c as u64;
        let r = http
            .post(format!("{base}/api/v1/admin/deposits"))
            .bearer_auth(&admin)
            .json(&json!({"user_id": user, "asset": "USDT", "amount": "1000000", "external_id": format!("bench-seed-{user}")}))
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("seed deposit failed: {}", r.text().await?);
        }
    }
    Ok(())
}

/// The rates of the off and the on runs of one measurement.
#[derive(Debug, Default)]
pub(crate) struct Series {
    pub off: Vec<f64>,
    pub on: Vec<f64>,
}

impl Series {
    pub fn push(&mut self, on: bool, rate: f64) {
        if on {
            self.on.push(rate);
        } else {
            self.off.push(rate);
        }
    }

    /// (off median, on median, how much slower on is in %).
    pub fn medians(&self) -> (f64, f64, f64) {
        let (off, on) = (median(self.off.clone()), median(self.on.clone()));
        (off, on, (1.0 - on / off.max(1e-9)) * 100.0)
    }

    /// Prints both series with their medians and the ratio, under `title`; the summary line.
    pub fn print(&self, title: &str, unit: &str) -> String {
        let (off, on, slower) = self.medians();
        let fmt = |rates: &[f64]| {
            rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!();
        println!("== {title} ==");
        println!("off {unit}: {} (median {off:.0})", fmt(&self.off));
        println!("on {unit}:  {} (median {on:.0})", fmt(&self.on));
        // Each pair's own ratio (its two runs side by side in time): a check on drift across
        // the session that the medians alone would hide.
        let pairs: Vec<f64> = self
            .off
            .iter()
            .zip(&self.on)
            .map(|(off, on)| (1.0 - on / off.max(1e-9)) * 100.0)
            .collect();
        let listed: Vec<String> = pairs.iter().map(|p| format!("{p:.1}")).collect();
        println!(
            "each pair, on slower by %: {} (median {:.1})",
            listed.join(", "),
            median(pairs.clone())
        );
        println!("on is {slower:.1}% slower (target <= 5%)");
        format!(
            "{title}: off median {off:.0}/s, on median {on:.0}/s, on {slower:.1}% slower (target <= 5%)"
        )
    }
}

pub(crate) fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    match rates.len() {
        0 => 0.0,
        n if n % 2 == 1 => rates[n / 2],
        n => (rates[n / 2 - 1] + rates[n / 2]) / 2.0,
    }
}
