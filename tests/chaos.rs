//! The chaos run (FND-001..006, INV-004): N transfers in both directions through several real
//! `ledger serve` processes while those and spot-core are killed with SIGKILL at random moments,
//! again and again; then every transfer must reach a terminal state, every `req_id` must be
//! applied at most once in each system and exactly as its final state says, and fund
//! conservation must hold. Used by `cargo run -p tests --bin chaos` and by a smaller test.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::Rng;
use rust_decimal::Decimal;
use serde_json::json;
use spot_core::client::SpotClient;
use spot_core::protocol::{JournalRecord, Outcome, Request, Response};

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
    /// Where `ledger` and `spot-core` are built.
    pub bin_dir: PathBuf,
    /// A PostgreSQL server; the run creates its own database there.
    pub server_url: String,
    /// How long everything may take to settle after the last crash.
    pub settle_max: Duration,
}

/// What the run found. Zeros where zeros are due: `created`, `lost`, `duplicates`, `mismatched`,
/// `stuck`, `unanswered`.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub transfers: usize,
    pub crashes: usize,
    pub ledger_crashes: usize,
    pub spot_crashes: usize,
    pub states: BTreeMap<String, usize>,
    pub created: Decimal,
    pub lost: Decimal,
    pub duplicates: usize,
    pub mismatched: usize,
    pub stuck: usize,
    pub unanswered: usize,
    pub elapsed: Duration,
}

impl Report {
    /// True when every figure that must be zero is.
    pub fn clean(&self) -> bool {
        self.created.is_zero()
            && self.lost.is_zero()
            && self.duplicates == 0
            && self.mismatched == 0
            && self.stuck == 0
            && self.unanswered == 0
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
        writeln!(
            f,
            "crashes injected:     {} (ledger {}, spot-core {})",
            self.crashes, self.ledger_crashes, self.spot_crashes
        )?;
        for (state, n) in &self.states {
            writeln!(f, "  {state:<20}{n}")?;
        }
        writeln!(f, "money created:        {}", self.created)?;
        writeln!(f, "money lost:           {}", self.lost)?;
        writeln!(f, "duplicates applied:   {}", self.duplicates)?;
        writeln!(f, "records disagreeing:  {}", self.mismatched)?;
        writeln!(f, "transfers stuck:      {}", self.stuck)?;
        write!(f, "requests unanswered:  {}", self.unanswered)
    }
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// Spawns and returns once it printed a line starting with `ready`; retries while the port of a
/// killed predecessor is not free yet.
fn spawn_ready(mut make: impl FnMut() -> Command, ready: &str) -> anyhow::Result<(Proc, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut child = make()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            if let Some(rest) = line.strip_prefix(ready) {
                let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                std::thread::spawn(move || for _ in lines {});
                return Ok((Proc(child), addr));
            }
        }
        child.kill().ok();
        child.wait().ok();
        if Instant::now() > deadline {
            bail!("process did not become ready");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spawn_spot(bin_dir: &Path, data: &Path, listen: &str) -> anyhow::Result<(Proc, String)> {
    let exe = bin_dir.join("spot-core");
    spawn_ready(
        || {
            let mut c = Command::new(&exe);
            c.arg("--listen").arg(listen).arg("--data-dir").arg(data);
            c
        },
        "spot-core listening on ",
    )
}

fn spawn_ledger(bin_dir: &Path, db_url: &str, spot: &str) -> anyhow::Result<(Proc, String)> {
    let exe = bin_dir.join("ledger");
    spawn_ready(
        || {
            let mut c = Command::new(&exe);
            c.args(["serve", "--listen", "127.0.0.1:0", "--spot-url", spot])
                .args(["--spot-timeout-ms", "1000"])
                .env("DATABASE_URL", db_url)
                .env("LEDGER_JWT_SECRET", SECRET)
                .env("RUST_LOG", "warn")
                .env("LEDGER_RATE_PER_SECOND", "off")
                .env("LEDGER_DAILY_COUNT_MAX", "off")
                .env("LEDGER_RECOVERY_STALE_MS", "1000")
                .env("LEDGER_RECOVERY_INTERVAL_MS", "200")
                .env("LEDGER_RETRY_BACKOFF_MS_BASE", "50")
                .env("LEDGER_RETRY_BACKOFF_MS_MAX", "1000")
                .env("LEDGER_RECOVERY_LEASE_MS", "15000")
                .env_remove("LEDGER_FAILPOINT");
            c
        },
        "ledger serving on ",
    )
}

struct Cluster {
    bin_dir: PathBuf,
    db_url: String,
    spot_data: PathBuf,
    spot_addr: String,
    spot: Mutex<Option<Proc>>,
    ledgers: Mutex<Vec<(Option<Proc>, String)>>,
}

impl Cluster {
    fn bases(&self) -> Vec<String> {
        let ledgers = self.ledgers.lock().unwrap_or_else(|e| e.into_inner());
        ledgers
            .iter()
            .filter(|(p, _)| p.is_some())
            .map(|(_, b)| b.clone())
            .collect()
    }

    fn kill_spot_and_restart(&self, pause: Duration) -> anyhow::Result<()> {
        drop(self.spot.lock().unwrap_or_else(|e| e.into_inner()).take());
        std::thread::sleep(pause);
        let (p, addr) = spawn_spot(&self.bin_dir, &self.spot_data, &self.spot_addr)?;
        anyhow::ensure!(addr == self.spot_addr, "spot-core moved to {addr}");
        *self.spot.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        Ok(())
    }

    fn kill_ledger_and_restart(&self, i: usize, pause: Duration) -> anyhow::Result<()> {
        drop(
            self.ledgers.lock().unwrap_or_else(|e| e.into_inner())[i]
                .0
                .take(),
        );
        std::thread::sleep(pause);
        let (p, base) = spawn_ledger(&self.bin_dir, &self.db_url, &self.spot_addr)?;
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner())[i] = (Some(p), base);
        Ok(())
    }
}

/// One submitted transfer: what the client asked for.
#[derive(Debug, Clone)]
struct Sent {
    from_funding: bool,
}

/// Runs the whole chaos scenario and reports what it found.
pub async fn run(cfg: Config) -> anyhow::Result<Report> {
    let started = Instant::now();
    let db_url = format!(
        "{}/chaos_{}",
        cfg.server_url,
        ulid::Ulid::new().to_string().to_lowercase()
    );
    let pool = schema::prepare(&db_url, 8).await?;
    let tmp = tempfile::tempdir()?;
    let spot_data = tmp.path().join("spot");
    let (bin_dir, data) = (cfg.bin_dir.clone(), spot_data.clone());
    let (spot, spot_addr) =
        tokio::task::spawn_blocking(move || spawn_spot(&bin_dir, &data, "127.0.0.1:0")).await??;
    let mut ledgers = Vec::new();
    for _ in 0..cfg.ledgers.max(1) {
        let (b, d, s) = (cfg.bin_dir.clone(), db_url.clone(), spot_addr.clone());
        let (p, base) = tokio::task::spawn_blocking(move || spawn_ledger(&b, &d, &s)).await??;
        ledgers.push((Some(p), base));
    }
    let cluster = Arc::new(Cluster {
        bin_dir: cfg.bin_dir.clone(),
        db_url: db_url.clone(),
        spot_data,
        spot_addr: spot_addr.clone(),
        spot: Mutex::new(Some(spot)),
        ledgers: Mutex::new(ledgers),
    });

    let funding = adapters::FundingLedger::new(pool.clone());
    let usdt = domain::AssetSymbol::parse("USDT").map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for user in 1..=cfg.users {
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
    let spot_admin = SpotClient::new(spot_addr.clone(), Duration::from_secs(5));
    for user in (7..=cfg.users).step_by(7) {
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
    let unanswered = Arc::new(AtomicUsize::new(0));
    let sent: Arc<Mutex<HashMap<String, Sent>>> = Arc::default();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..cfg.clients.max(1) {
        let (cluster, next, unanswered, sent, cfg) = (
            cluster.clone(),
            next.clone(),
            unanswered.clone(),
            sent.clone(),
            cfg.clone(),
        );
        clients.spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client");
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= cfg.transfers {
                    return;
                }
                let user = 1 + (i as u64) % cfg.users;
                let (from_funding, amount) = {
                    let mut rng = rand::rng();
                    (rng.random_bool(0.6), rng.random_range(1..=40u32))
                };
                let (from, to) = if from_funding {
                    ("FUNDING", "SPOT")
                } else {
                    ("SPOT", "FUNDING")
                };
                let token = command_api::mint(
                    SECRET.as_bytes(),
                    domain::UserId::new(user).expect("user id"),
                    false,
                    Duration::from_secs(3600),
                );
                let body = json!({"from": from, "to": to, "asset": "USDT",
                                  "amount": format!("{amount}.5"), "cid": format!("chaos-{i}")});
                let deadline = Instant::now() + Duration::from_secs(120);
                let answered = loop {
                    if Instant::now() > deadline {
                        break None;
                    }
                    let bases = cluster.bases();
                    if bases.is_empty() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    let base = &bases[rand::rng().random_range(0..bases.len())];
                    let resp = http
                        .post(format!("{base}/api/v1/internal_transfer"))
                        .bearer_auth(&token)
                        .json(&body)
                        .send()
                        .await;
                    if let Ok(resp) = resp {
                        if let Ok(v) = resp.json::<serde_json::Value>().await {
                            if let Some(id) = v["req_id"].as_str() {
                                break Some(id.to_owned());
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                match answered {
                    Some(id) => {
                        sent.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id, Sent { from_funding });
                    }
                    None => {
                        unanswered.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
    }

    // The killer: SIGKILL a random process, restart it after a random pause, until the clients
    // are done and enough crashes were injected.
    let clients_done = Arc::new(AtomicBool::new(false));
    let killer = {
        let (cluster, done, cfg) = (cluster.clone(), clients_done.clone(), cfg.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<(usize, usize)> {
            let (mut ledger_kills, mut spot_kills) = (0, 0);
            while !(done.load(Ordering::SeqCst) && ledger_kills + spot_kills >= cfg.crashes_min) {
                let (wait, pause, pick_spot, which) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(150..900u64),
                        rng.random_range(0..300u64),
                        rng.random_bool(0.4),
                        rng.random_range(0..cfg.ledgers.max(1)),
                    )
                };
                std::thread::sleep(Duration::from_millis(wait));
                let spot = cfg.kill_spot && (pick_spot || !cfg.kill_ledgers);
                if spot {
                    cluster.kill_spot_and_restart(Duration::from_millis(pause))?;
                    spot_kills += 1;
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
    while clients.join_next().await.is_some() {}
    clients_done.store(true, Ordering::SeqCst);
    let (ledger_crashes, spot_crashes) = killer.await??;

    // Settle: every transfer must reach a terminal state on its own (the recovery workers).
    let settle_deadline = Instant::now() + cfg.settle_max;
    let stuck = loop {
        let open = open_transfers(&pool).await?;
        if open == 0 || Instant::now() > settle_deadline {
            break open;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let spot_client = SpotClient::new(spot_addr, Duration::from_secs(5));
    let mut report = check(&pool, &spot_client, &sent).await?;
    report.crashes = ledger_crashes + spot_crashes;
    report.ledger_crashes = ledger_crashes;
    report.spot_crashes = spot_crashes;
    report.stuck = stuck;
    report.unanswered = unanswered.load(Ordering::SeqCst);
    report.elapsed = started.elapsed();
    drop(cluster);
    pool.close().await;
    Ok(report)
}

/// Transfers whose last event is not terminal, straight from the event log.
async fn open_transfers(pool: &sqlx::PgPool) -> anyhow::Result<usize> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (
            SELECT DISTINCT ON (aggregate_id) aggregate_id, event_type, payload FROM events
            WHERE aggregate_type = 'Transfer' ORDER BY aggregate_id, sequence DESC) last
         WHERE event_type NOT IN ('TransferCommitted', 'TransferFailed', 'TransferRolledBack')
           AND NOT (event_type = 'TransferManuallyResolved'
                    AND payload->'TransferManuallyResolved'->>'to_state'
                        IN ('COMMITTED', 'FAILED', 'ROLLED_BACK'))",
    )
    .fetch_one(pool)
    .await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Everything spot-core's WAL holds, through `journal`, page by page.
async fn spot_journal(client: &SpotClient) -> anyhow::Result<Vec<JournalRecord>> {
    let mut all = Vec::new();
    loop {
        let after_seq = all.last().map_or(0, JournalRecord::seq);
        let req = Request::Journal {
            after_seq,
            limit: 10_000,
        };
        match client.call(&req).await? {
            Response::Ok {
                records: Some(records),
                ..
            } => {
                if records.is_empty() {
                    return Ok(all);
                }
                all.extend(records);
            }
            other => bail!("journal answered {other:?}"),
        }
    }
}

async fn check(
    pool: &sqlx::PgPool,
    spot: &SpotClient,
    sent: &Mutex<HashMap<String, Sent>>,
) -> anyhow::Result<Report> {
    let mut report = Report::default();
    // The final state of each transfer, from its events.
    let finals: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT aggregate_id, event_type,
                COALESCE(payload->'TransferManuallyResolved'->>'to_state', '') FROM (
            SELECT DISTINCT ON (aggregate_id) aggregate_id, event_type, payload FROM events
            WHERE aggregate_type = 'Transfer' ORDER BY aggregate_id, sequence DESC) last",
    )
    .fetch_all(pool)
    .await?;
    report.transfers = finals.len();

    // (req_id, op) → applied, in each system; a second record of one key is a duplicate.
    let mut applied: HashMap<(String, String, &'static str), usize> = HashMap::new();
    let journal: Vec<(String, String, String)> =
        sqlx::query_as("SELECT req_id, operation, outcome FROM funding_journal")
            .fetch_all(pool)
            .await?;
    for (req_id, op, outcome) in journal {
        let n = applied.entry((req_id, op, "FUNDING")).or_insert(0);
        *n += usize::from(outcome == "APPLIED");
    }
    let mut seen = HashMap::new();
    for record in spot_journal(spot).await? {
        if let Some((op, m)) = record.as_movement() {
            let key = (m.req_id.clone(), format!("{op:?}").to_uppercase(), "SPOT");
            *seen.entry(key.clone()).or_insert(0usize) += 1;
            let n = applied.entry(key).or_insert(0);
            *n += usize::from(m.outcome == Outcome::Applied);
        }
    }
    report.duplicates =
        seen.values().filter(|n| **n > 1).count() + applied.values().filter(|n| **n > 1).count();

    let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (req_id, event_type, manual_to) in &finals {
        let state = match event_type.as_str() {
            "TransferCommitted" => "COMMITTED",
            "TransferFailed" => "FAILED",
            "TransferRolledBack" => "ROLLED_BACK",
            "TransferManuallyResolved" => manual_to.as_str(),
            _ => "OPEN",
        };
        *report.states.entry(state.to_owned()).or_insert(0) += 1;
        let Some(s) = sent.get(req_id) else {
            // Created but never answered to its client: its direction is in its first event.
            continue;
        };
        let (src, dst) = if s.from_funding {
            ("FUNDING", "SPOT")
        } else {
            ("SPOT", "FUNDING")
        };
        let got = |op: &str, sys: &'static str| {
            applied
                .get(&(req_id.clone(), op.to_owned(), sys))
                .copied()
                .unwrap_or(0)
        };
        let expected = match state {
            "COMMITTED" => (1, 1, 0),
            "FAILED" => (0, 0, 0),
            "ROLLED_BACK" => (1, 0, 1),
            _ => continue,
        };
        let actual = (
            got("WITHDRAW", src),
            got("DEPOSIT", dst),
            got("REFUND", src),
        );
        if actual != expected {
            report.mismatched += 1;
            eprintln!("records disagree for {req_id} ({state}): withdraw/deposit/refund applied {actual:?}, expected {expected:?}");
        }
    }

    // Conservation, system-wide for USDT: FUNDING + SPOT + in-flight = external deposits. With
    // every transfer terminal, in-flight is zero; any open one is counted at its amount if money
    // has left its source.
    let funding_total: Decimal = sqlx::query_scalar(
        "SELECT COALESCE(SUM(balance), 0) FROM funding_accounts WHERE asset = 'USDT'",
    )
    .fetch_one(pool)
    .await?;
    let external: Decimal = sqlx::query_scalar(
        "SELECT COALESCE(SUM(amount), 0) FROM external_deposits WHERE asset = 'USDT'",
    )
    .fetch_one(pool)
    .await?;
    let spot_total = match spot.call(&Request::Totals {}).await? {
        Response::Ok {
            totals: Some(t), ..
        } => t
            .into_iter()
            .find(|e| e.asset == "USDT")
            .map_or(Decimal::ZERO, |e| e.sum),
        other => bail!("totals answered {other:?}"),
    };
    let diff = funding_total + spot_total - external;
    if diff > Decimal::ZERO {
        report.created = diff.normalize();
    } else if diff < Decimal::ZERO {
        report.lost = (-diff).normalize();
    }
    Ok(report)
}
