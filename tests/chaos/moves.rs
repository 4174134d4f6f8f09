//! Partition moves among the chaos run's faults (`--cells N`, ADR 0023): while the clients trade
//! and the processes are killed, two lanes ask the running ledgers (their admin route
//! `POST /api/v1/admin/cells/moves`, with an admin token as every admin call of the run) to move
//! the partitions of the run's first users back and forth between the cells, some of them
//! cancelled a moment after they start (`POST .../moves/{id}/cancel`: before or after their
//! switch, whichever comes first). At the end every move the ledgers recorded must end (`DONE`
//! or `CANCELLED`), and the cells must agree on one map, every partition `STEADY`: the end check
//! then counts each cell's money by the partitions it owns under that map ([`StoredMap`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{json, Value};

use super::cluster::Cluster;
use super::SECRET;

/// The users whose partitions move: the first few of the run (all of them trade), so the same
/// partitions go back and forth.
const MOVING_USERS: u64 = 6;
/// Every third move is cancelled a moment after it starts.
const CANCEL_EVERY: usize = 3;
/// How long a lane keeps asking one move to start (the ledgers and databases come and go).
const START_MAX: Duration = Duration::from_secs(60);

/// The cell map the cells hold at the end of a run.
#[derive(Debug, Clone)]
pub(super) struct StoredMap {
    /// The highest version any cell holds.
    pub version: i64,
    /// Each partition's cell id under it (index: the partition).
    pub owners: Vec<u16>,
    /// What is wrong: cells that hold another version or other owners, partitions not STEADY.
    pub problems: Vec<String>,
}

impl StoredMap {
    /// The partitions cell `cell` owns, for SQL (`= ANY($1)`).
    pub fn owned(&self, cell: u16) -> Vec<i32> {
        (0..)
            .zip(&self.owners)
            .filter(|(_, owner)| **owner == cell)
            .map(|(p, _)| p)
            .collect()
    }

    /// The index (cell id minus one) of the cell owning `user`'s partition.
    pub fn index_of(&self, user: u64) -> usize {
        let user = domain::UserId::new(user).expect("a user id");
        let p = usize::from(cells::partition_of(user).get());
        usize::from(self.owners[p].saturating_sub(1))
    }
}

/// Every cell's stored map (`cell_identity.map_version`, `cell_partitions`): the highest
/// version, and whatever disagrees with it.
pub(super) async fn stored_map(pools: &[sqlx::PgPool]) -> anyhow::Result<StoredMap> {
    let mut maps = Vec::new();
    for pool in pools {
        let version: i64 = sqlx::query_scalar("SELECT map_version FROM cell_identity")
            .fetch_one(pool)
            .await?;
        let rows: Vec<(i16, i32, String)> = sqlx::query_as(
            "SELECT partition, cell_id, state FROM cell_partitions ORDER BY partition",
        )
        .fetch_all(pool)
        .await?;
        maps.push((version, rows));
    }
    let (version, newest) = maps
        .iter()
        .max_by_key(|(v, _)| *v)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no cell"))?;
    let mut problems = Vec::new();
    for (i, (v, rows)) in maps.iter().enumerate() {
        let same = rows
            .iter()
            .zip(&newest)
            .all(|(a, b)| (a.0, a.1) == (b.0, b.1));
        if *v != version || !same || rows.len() != newest.len() {
            problems.push(format!(
                "cell {} holds map version {v}, not the newest ({version}) as it is",
                i + 1
            ));
        }
        for (p, _, state) in rows.iter().filter(|(_, _, s)| s != "STEADY") {
            problems.push(format!("cell {}: partition {p} is {state}", i + 1));
        }
    }
    let owners = newest
        .iter()
        .map(|(_, c, _)| u16::try_from(*c).unwrap_or(0))
        .collect::<Vec<_>>();
    if owners.len() != usize::from(cells::PARTITIONS) {
        problems.push(format!("the map names {} partitions", owners.len()));
    }
    Ok(StoredMap {
        version,
        owners,
        problems,
    })
}

/// How far the run has come, to spread the moves over it.
pub(super) struct Progress {
    pub next: Arc<AtomicUsize>,
    pub done: Arc<AtomicBool>,
    pub transfers: usize,
}

/// What the moves came to.
#[derive(Debug, Clone, Default)]
pub struct MovesReport {
    /// Moves the lanes started (answered 202).
    pub started: usize,
    /// Cancels asked and accepted (the move was still before its switch).
    pub cancels: usize,
    /// Every move the ledgers recorded, by how it ended.
    pub done: usize,
    pub cancelled: usize,
    /// The final map's version.
    pub map_version: i64,
}

fn admin() -> String {
    edge::mint(
        SECRET.as_bytes(),
        domain::UserId::new(1).expect("user id"),
        true,
        Duration::from_secs(3600),
    )
}

/// One admin call to a random live ledger: its status and JSON body, `None` when none answered.
async fn call(
    http: &reqwest::Client,
    cluster: &Cluster,
    post: bool,
    path: &str,
    body: Option<Value>,
) -> Option<(u16, Value)> {
    let bases = cluster.bases();
    if bases.is_empty() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        return None;
    }
    let base = &bases[rand::rng().random_range(0..bases.len())];
    let url = format!("{base}/api/v1/admin/cells/moves{path}");
    let req = if post { http.post(url) } else { http.get(url) };
    let req = req.bearer_auth(admin());
    let req = match body {
        Some(b) => req.json(&b),
        None => req,
    };
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    Some((status, body))
}

/// Starts one move of a moving user's partition to another cell than its owner's: the move's id.
async fn start_one(
    http: &reqwest::Client,
    cluster: &Cluster,
    pools: &[sqlx::PgPool],
    users: u64,
) -> Option<String> {
    let deadline = Instant::now() + START_MAX;
    while Instant::now() < deadline {
        let (user, pick) = {
            let mut rng = rand::rng();
            (
                rng.random_range(1..=users.clamp(1, MOVING_USERS)),
                rng.random_range(1..pools.len()),
            )
        };
        let p = cells::partition_of(domain::UserId::new(user).expect("user id")).get();
        // Its owner now (a database restarting is asked again).
        let Ok(map) = stored_map(pools).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let owner = usize::from(map.owners[usize::from(p)]).max(1);
        let to = (owner - 1 + pick) % pools.len() + 1;
        let body = json!({"partition": p, "to": to});
        match call(http, cluster, true, "", Some(body)).await {
            Some((202, started)) => return started["id"].as_str().map(str::to_owned),
            // A move of it already open, a map that changed meanwhile, a cell restarting, a
            // ledger killed mid-answer: another look.
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    None
}

/// Cancels move `id` after a random moment; whether the cancel was accepted (a move past its
/// switch refuses it, 409, and goes on to DONE).
async fn cancel_soon(http: &reqwest::Client, cluster: &Cluster, id: &str) -> bool {
    let wait = rand::rng().random_range(0..1_500u64);
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match call(http, cluster, true, &format!("/{id}/cancel"), None).await {
            Some((200, _)) => return true,
            Some((409, _)) => return false,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    false
}

/// Waits for move `id` to end, up to `max`.
async fn wait_end(http: &reqwest::Client, cluster: &Cluster, id: &str, max: Duration) {
    let deadline = Instant::now() + max;
    while Instant::now() < deadline {
        if let Some((200, m)) = call(http, cluster, false, &format!("/{id}"), None).await {
            if m["step"] == "DONE" || m["step"] == "CANCELLED" {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The moves of one run: `moves` of them over two lanes, the k-th due once k/(moves + 1) of the
/// transfers were handed out (those not yet started when the clients are done start then),
/// each lane waiting for its move to end (or 60 s) before the next. Answers (started, cancels).
pub(super) async fn run(
    cluster: Arc<Cluster>,
    pools: Vec<sqlx::PgPool>,
    users: u64,
    moves: usize,
    progress: Progress,
) -> (usize, usize) {
    let (started, cancels) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let progress = Arc::new(progress);
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..2 {
        let (cluster, pools, started, cancels, progress) = (
            cluster.clone(),
            pools.clone(),
            started.clone(),
            cancels.clone(),
            progress.clone(),
        );
        lanes.spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client");
            for k in (lane..moves).step_by(2) {
                let due = progress.transfers * (k + 1) / (moves + 1);
                while progress.next.load(Ordering::SeqCst) < due
                    && !progress.done.load(Ordering::SeqCst)
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let Some(id) = start_one(&http, &cluster, &pools, users).await else {
                    continue;
                };
                started.fetch_add(1, Ordering::SeqCst);
                if k % CANCEL_EVERY == CANCEL_EVERY - 1 && cancel_soon(&http, &cluster, &id).await {
                    cancels.fetch_add(1, Ordering::SeqCst);
                }
                wait_end(&http, &cluster, &id, Duration::from_secs(60)).await;
            }
        });
    }
    while lanes.join_next().await.is_some() {}
    (
        started.load(Ordering::SeqCst),
        cancels.load(Ordering::SeqCst),
    )
}

/// Waits until every move recorded in any cell (`partition_moves`, read from each cell's
/// database: a ledger that did not reach a cell would list only part of them) has ended, up to
/// `max`: how many ended DONE and CANCELLED, and the moves still open at the deadline.
pub(super) async fn all_ended(
    pools: &[sqlx::PgPool],
    max: Duration,
) -> anyhow::Result<(usize, usize, Vec<String>)> {
    let deadline = Instant::now() + max;
    loop {
        let mut moves: Vec<(String, String)> = Vec::new();
        let mut failed = None;
        for pool in pools {
            match sqlx::query_as("SELECT id, step FROM partition_moves")
                .fetch_all(pool)
                .await
            {
                Ok(rows) => moves.extend(rows),
                Err(e) => failed = Some(e),
            }
        }
        let count = |step: &str| moves.iter().filter(|(_, s)| s == step).count();
        let open: Vec<String> = moves
            .iter()
            .filter(|(_, s)| s != "DONE" && s != "CANCELLED")
            .map(|(id, s)| format!("{id} at {s}"))
            .collect();
        match failed {
            None if open.is_empty() => return Ok((count("DONE"), count("CANCELLED"), open)),
            Some(e) if Instant::now() > deadline => return Err(e.into()),
            None if Instant::now() > deadline => {
                return Ok((count("DONE"), count("CANCELLED"), open))
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}
