//! The benchmark's own HTTP client: concurrent clients driving transfers, each signed in as one
//! or more users and alternating each user's direction; what a run came to (rate, latency
//! percentiles, CPU per transfer of each process and of the machine).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::procstat;

/// The processes whose CPU a run reads (the machine's is always read).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pids {
    pub ledger: Option<u32>,
    pub spot: Option<u32>,
}

/// CPU used during a run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    pub ledger: Duration,
    pub spot: Duration,
    pub postgres: Duration,
    pub machine: Duration,
}

impl Cpu {
    fn read(pids: Pids) -> Self {
        Self {
            ledger: pids.ledger.map_or(Duration::ZERO, procstat::process_cpu),
            spot: pids.spot.map_or(Duration::ZERO, procstat::process_cpu),
            postgres: procstat::postgres_cpu(),
            machine: procstat::machine_busy(),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            ledger: self.ledger.saturating_sub(before.ledger),
            spot: self.spot.saturating_sub(before.spot),
            postgres: self.postgres.saturating_sub(before.postgres),
            machine: self.machine.saturating_sub(before.machine),
        }
    }
}

/// What one run of concurrent clients came to.
pub(crate) struct Run {
    /// Latencies of the requests whose every transfer was answered COMMITTED, sorted: one per
    /// transfer, or one per batch in a bulk run.
    pub latencies: Vec<Duration>,
    /// Transfers answered COMMITTED.
    pub committed: u64,
    /// Transfers per request (1 without `--bulk`).
    pub bulk: usize,
    pub not_committed: u64,
    pub elapsed: Duration,
    pub cpu: Cpu,
    /// Whose CPU was read: a process not read prints as `n/a`.
    pub pids: Pids,
}

impl Run {
    pub fn tps(&self) -> f64 {
        self.committed as f64 / self.elapsed.as_secs_f64()
    }

    /// The latency percentile `p` (0.0 to 1.0) in ms.
    pub fn pct(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i].as_secs_f64() * 1000.0
    }

    pub fn per_transfer_ms(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0 / self.committed.max(1) as f64
    }

    pub fn print(&self, title: &str) {
        println!();
        println!("== {title}, {:.1} s ==", self.elapsed.as_secs_f64());
        println!("committed transfers:        {}", self.committed);
        println!("not committed (answers):    {}", self.not_committed);
        println!("committed transfers/s:      {:.0}", self.tps());
        let per = if self.bulk > 1 {
            format!("per batch of {}", self.bulk)
        } else {
            "to COMMITTED".to_owned()
        };
        println!(
            "latency {per} ms:    p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}",
            self.pct(0.50),
            self.pct(0.95),
            self.pct(0.99),
            self.pct(1.0)
        );
        let per_k = |d: Duration| format!("{:.3}", self.per_transfer_ms(d));
        let of = |pid: Option<u32>, d: Duration| pid.map_or_else(|| "n/a".to_owned(), |_| per_k(d));
        println!(
            "CPU s per 1,000 transfers:  ledger {}  spot-core {}  postgres {}  whole machine {}",
            of(self.pids.ledger, self.cpu.ledger),
            of(self.pids.spot, self.cpu.spot),
            per_k(self.cpu.postgres),
            per_k(self.cpu.machine),
        );
    }
}

/// Client ids (`cid`) for a run whose transfers each carry one, as a careful client sends them:
/// unique across runs and clients (a run's prefix, then a counter).
#[derive(Debug)]
pub(crate) struct Cids {
    prefix: String,
    next: std::sync::atomic::AtomicU64,
}

impl Cids {
    pub(crate) fn new() -> Arc<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Arc::new(Self {
            prefix: format!("bench-{nanos}-"),
            next: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn take(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}{n}", self.prefix)
    }
}

/// Drives transfers from one task per client until `duration` is over. A client signs in as each
/// of its users in turn (one token each) and alternates each user's direction, FUNDING→SPOT then
/// back, 1 USDT at a time, so balances never run out.
pub(crate) async fn drive(
    http: &reqwest::Client,
    base: &str,
    users: Vec<Vec<String>>,
    duration: Duration,
    pids: Pids,
) -> anyhow::Result<Run> {
    drive_batches(http, base, users, duration, pids, 1, None).await
}

/// `drive` with `bulk` transfers per request: with more than one, each request is a batch to
/// `POST /api/v1/internal_transfers`, all in one direction, the next batch of that user back.
pub(crate) async fn drive_batches(
    http: &reqwest::Client,
    base: &str,
    users: Vec<Vec<String>>,
    duration: Duration,
    pids: Pids,
    bulk: usize,
    cids: Option<Arc<Cids>>,
) -> anyhow::Result<Run> {
    drive_as(http, base, users, duration, pids, bulk, cids, None).await
}

/// `drive_batches`, and with `admin` (an admin's token) and `bulk` above 1, every client's
/// batches sent by the admin for many users, one per item (`users` then holds each client's
/// user ids, in decimal): a back office's bulk requests, which no per-user limit refuses for
/// their size (the per-second limit counts each user's transfers, contract §5.4).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive_as(
    http: &reqwest::Client,
    base: &str,
    users: Vec<Vec<String>>,
    duration: Duration,
    pids: Pids,
    bulk: usize,
    cids: Option<Arc<Cids>>,
    admin: Option<String>,
) -> anyhow::Result<Run> {
    let bulk = bulk.max(1);
    let not_committed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let before = Cpu::read(pids);
    let started = Instant::now();
    let client = Client {
        http: http.clone(),
        url: match bulk {
            1 => format!("{base}/api/v1/internal_transfer"),
            _ => format!("{base}/api/v1/internal_transfers"),
        },
        bulk,
        deadline: started + duration,
        cids,
        not_committed: not_committed.clone(),
        admin: admin.filter(|_| bulk > 1),
    };
    let tasks: Vec<_> = users
        .into_iter()
        .map(|tokens| tokio::spawn(client.clone().run(tokens)))
        .collect();
    let mut latencies = Vec::new();
    let mut committed = 0;
    for t in tasks {
        let (mine, done) = t.await?;
        latencies.extend(mine);
        committed += done;
    }
    let elapsed = started.elapsed();
    let cpu = Cpu::read(pids).since(before);
    latencies.sort();
    Ok(Run {
        latencies,
        committed,
        bulk,
        not_committed: not_committed.load(std::sync::atomic::Ordering::Relaxed),
        elapsed,
        cpu,
        pids,
    })
}

/// What every client task of one run shares.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    url: String,
    /// Transfers per request (1: the single route).
    bulk: usize,
    deadline: Instant,
    cids: Option<Arc<Cids>>,
    /// Transfers answered but not committed, across clients.
    not_committed: Arc<std::sync::atomic::AtomicU64>,
    /// An admin's token: batches name a user per item (`drive_as`).
    admin: Option<String>,
}

impl Client {
    /// One client until the deadline, its users in turn: the latency of each request whose
    /// transfers all committed, and how many transfers committed. A user's direction flips only
    /// after a request that committed whole, so balances never run out.
    async fn run(self, tokens: Vec<String>) -> (Vec<Duration>, u64) {
        if let Some(admin) = self.admin.clone() {
            return self.run_for_users(&admin, tokens).await;
        }
        let mut mine = Vec::new();
        let mut committed = 0u64;
        let mut to_spot = vec![true; tokens.len()];
        let mut turn = 0;
        while Instant::now() < self.deadline {
            let t0 = Instant::now();
            let done = self.send(&tokens[turn], to_spot[turn]).await;
            committed += done;
            let missed = self.bulk as u64 - done;
            if missed == 0 {
                mine.push(t0.elapsed());
                to_spot[turn] = !to_spot[turn];
                turn = (turn + 1) % tokens.len();
            } else {
                self.not_committed
                    .fetch_add(missed, std::sync::atomic::Ordering::Relaxed);
            }
        }
        (mine, committed)
    }

    /// One client sending batches as `admin`, each item for the next of `users` (user ids) in
    /// turn: a user's direction flips when its transfer committed. The latency of each batch
    /// whose every transfer committed, and how many transfers committed.
    async fn run_for_users(self, admin: &str, users: Vec<String>) -> (Vec<Duration>, u64) {
        let users: Vec<u64> = users.iter().filter_map(|u| u.parse().ok()).collect();
        let mut mine = Vec::new();
        let mut committed = 0u64;
        let mut to_spot = vec![true; users.len()];
        let mut turn = 0;
        while Instant::now() < self.deadline && !users.is_empty() {
            let picked: Vec<usize> = (0..self.bulk).map(|k| (turn + k) % users.len()).collect();
            turn = (turn + self.bulk) % users.len();
            let items = picked
                .iter()
                .map(|&i| {
                    let mut body = transfer_body(to_spot[i], self.cids.as_ref().map(|c| c.take()));
                    body["user_id"] = json!(users[i]);
                    body
                })
                .collect::<Vec<_>>();
            let t0 = Instant::now();
            let done = transfer_items(&self.http, &self.url, admin, items).await;
            let mut all = done.len() == picked.len();
            for (&i, ok) in picked.iter().zip(&done) {
                match ok {
                    true => {
                        committed += 1;
                        to_spot[i] = !to_spot[i];
                    }
                    false => all = false,
                }
            }
            let missed = self.bulk as u64 - done.iter().filter(|ok| **ok).count() as u64;
            match all {
                true => mine.push(t0.elapsed()),
                false => {
                    self.not_committed
                        .fetch_add(missed, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        (mine, committed)
    }

    /// One request as `token`'s user: how many of its transfers committed.
    async fn send(&self, token: &str, to_spot: bool) -> u64 {
        let cid = || self.cids.as_ref().map(|c| c.take());
        match self.bulk {
            1 => u64::from(transfer_one(&self.http, &self.url, token, to_spot, cid()).await),
            n => {
                let cids = (0..n).map(|_| cid()).collect();
                transfer_batch(&self.http, &self.url, token, to_spot, cids).await
            }
        }
    }
}

/// One transfer's body: 1 USDT FUNDING→SPOT when `to_spot`, else back, with its `cid` if any.
fn transfer_body(to_spot: bool, cid: Option<String>) -> serde_json::Value {
    let (from, to) = if to_spot {
        ("FUNDING", "SPOT")
    } else {
        ("SPOT", "FUNDING")
    };
    let mut body = json!({"from": from, "to": to, "asset": "USDT", "amount": "1"});
    if let Some(cid) = cid {
        body["cid"] = json!(cid);
    }
    body
}

/// One transfer of 1 USDT as `token`'s user, FUNDING→SPOT when `to_spot`, else back; whether it
/// was answered COMMITTED.
pub(crate) async fn transfer_one(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    to_spot: bool,
    cid: Option<String>,
) -> bool {
    let r = http
        .post(url)
        .bearer_auth(token)
        .json(&transfer_body(to_spot, cid))
        .send()
        .await;
    match r {
        Ok(r) => r
            .json::<serde_json::Value>()
            .await
            .map(|b| b["state"] == "COMMITTED")
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// One batch of `items` (each a transfer's body naming its `user_id`) sent with an admin's
/// token: whether each was answered COMMITTED, in order (none when the request failed).
async fn transfer_items(
    http: &reqwest::Client,
    url: &str,
    admin: &str,
    items: Vec<serde_json::Value>,
) -> Vec<bool> {
    let body = json!({ "transfers": items });
    let Ok(r) = http.post(url).bearer_auth(admin).json(&body).send().await else {
        return Vec::new();
    };
    let Ok(answer) = r.json::<serde_json::Value>().await else {
        return Vec::new();
    };
    answer["results"]
        .as_array()
        .map_or_else(Vec::new, |results| {
            results.iter().map(|r| r["state"] == "COMMITTED").collect()
        })
}

/// One batch of transfers of 1 USDT as `token`'s user (one per entry of `cids`, each with its
/// cid if any), all FUNDING→SPOT when `to_spot`, else all back; how many were answered
/// COMMITTED.
pub(crate) async fn transfer_batch(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    to_spot: bool,
    cids: Vec<Option<String>>,
) -> u64 {
    let items: Vec<_> = cids
        .into_iter()
        .map(|cid| transfer_body(to_spot, cid))
        .collect();
    let body = json!({ "transfers": items });
    let Ok(r) = http.post(url).bearer_auth(token).json(&body).send().await else {
        return 0;
    };
    let Ok(answer) = r.json::<serde_json::Value>().await else {
        return 0;
    };
    answer["results"].as_array().map_or(0, |results| {
        results.iter().filter(|r| r["state"] == "COMMITTED").count() as u64
    })
}
