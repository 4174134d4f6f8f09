//! The world of `ledger-bench move` (`moves.rs`): two real cells in the bench process (a fresh
//! PostgreSQL database and a spot-core process each, a coordinator over both, as the integration
//! test cells_move_010 builds them), the partition's history built through the coordinator's
//! bulk submit, the clients under load (the moving partition's users retry a fenced write
//! against the cell that owns the partition now, as the front would), and the move's
//! `PartitionStores` timed call by call so that a pause can be split into its parts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use adapters::pg::move_stores::{MoveCell, PgPartitionStores};
use adapters::{FundingLedger, SpotAdapter};
use anyhow::Context;
use application::moves::{
    Copied, Freeze, HistoryPrefix, MoveId, MoveRecord, MoveStep, PartitionBook, PartitionStores,
};
use application::{Coordinator, NewTransfer, StoreError};
use async_trait::async_trait;
use cells::{partition_of, CellId, Partition};
use domain::{AccountType, Amount, AssetRegistry, AssetSymbol, UserId};
use sqlx::PgPool;

use crate::cellstack::{fresh_database, Spot};

/// One cell: its database, its spot-core and a coordinator over both.
pub struct Cell {
    pub id: CellId,
    pub pool: PgPool,
    pub funding: FundingLedger,
    pub spot: SpotAdapter,
    pub engine: spot_core::SpotClient,
    pub coordinator: Coordinator,
    _proc: Spot,
}

/// Cell 1 and cell 2: partitions below 128 are cell 1's, the rest cell 2's (map version 1).
pub struct Two {
    pub cells: [Cell; 2],
    dir: PathBuf,
}

impl Drop for Two {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

impl Two {
    pub async fn start(server: &str, sslmode: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("ledger-bench-move-{}", ulid::Ulid::new()));
        std::fs::create_dir_all(&dir)?;
        let one = start_cell(server, sslmode, &dir, 1).await?;
        let two = start_cell(server, sslmode, &dir, 2).await?;
        Ok(Self {
            cells: [one, two],
            dir,
        })
    }

    pub fn cell(&self, id: CellId) -> &Cell {
        &self.cells[usize::from(id.get() != 1)]
    }

    /// The move's stores over both cells, timed.
    pub fn stores(&self) -> Timed {
        let cell = |c: &Cell| MoveCell {
            funding: c.funding.clone(),
            spot: c.spot.clone(),
        };
        let cells = self.cells.iter().map(|c| (c.id, cell(c))).collect();
        Timed {
            inner: PgPartitionStores::new(cells),
            times: Arc::default(),
        }
    }
}

async fn start_cell(
    server: &str,
    sslmode: &str,
    dir: &std::path::Path,
    n: u16,
) -> anyhow::Result<Cell> {
    let db = format!("ledger_bench_move_{n}");
    fresh_database(server, &db, sslmode).await?;
    let pool = schema::connect(&format!("{server}/{db}?sslmode={sslmode}"), 24).await?;
    sqlx::query("INSERT INTO cell_identity (cell_id, partitions) VALUES ($1, 256)")
        .bind(i32::from(n))
        .execute(&pool)
        .await?;
    sqlx::query(
        "INSERT INTO cell_partitions (partition, cell_id)
         SELECT p, CASE WHEN p >= 128 THEN 2 ELSE 1 END FROM generate_series(0, 255) p",
    )
    .execute(&pool)
    .await?;
    let proc = Spot::start(&dir.join(format!("spot{n}")), "127.0.0.1:0", None)?;
    let timeout = Duration::from_secs(3);
    let spot = SpotAdapter::with_token(proc.addr.clone(), timeout, None);
    let engine = spot_core::SpotClient::with_token(proc.addr.clone(), timeout, None);
    let funding = FundingLedger::new(pool.clone());
    let coordinator = adapters::pg::coordinator(
        pool.clone(),
        Arc::new(funding.clone()),
        Arc::new(spot.clone()),
        Arc::new(RwLock::new(AssetRegistry::default_assets())),
    );
    Ok(Cell {
        id: CellId::new(u64::from(n)).context("a cell id")?,
        pool,
        funding,
        spot,
        engine,
        coordinator,
        _proc: proc,
    })
}

/// `n` users of partition `p`, from user 1000 on.
pub fn users_of(p: Partition, n: usize) -> Vec<u64> {
    (1000..)
        .filter(|u| partition_of(UserId::new(*u).expect("a user id")) == p)
        .take(n)
        .collect()
}

/// `n` users of cell `cell` (1: partitions below 128) not in partition `not`.
pub fn users_of_cell(cell: u16, not: Partition, n: usize) -> Vec<u64> {
    (1000..)
        .filter(|u| {
            let q = partition_of(UserId::new(*u).expect("a user id"));
            q != not && (q.get() >= 128) == (cell == 2)
        })
        .take(n)
        .collect()
}

pub fn transfer(user: u64, from: AccountType) -> NewTransfer {
    let to = if from == AccountType::Funding {
        AccountType::Spot
    } else {
        AccountType::Funding
    };
    NewTransfer {
        user_id: UserId::new(user).expect("a user id"),
        from,
        to,
        asset: AssetSymbol::parse("USDT").expect("USDT"),
        amount: Amount::parse("1").expect("an amount"),
        cid: None,
    }
}

/// 1,000,000 USDT into each of `users`' FUNDING in `cell`.
pub async fn deposit(cell: &Cell, users: &[u64]) -> anyhow::Result<()> {
    for &u in users {
        cell.funding
            .external_deposit(
                &format!("bench-move-{u}-{}", ulid::Ulid::new()),
                UserId::new(u).expect("a user id"),
                &AssetSymbol::parse("USDT").expect("USDT"),
                Amount::parse("1000000").expect("an amount"),
            )
            .await?;
    }
    Ok(())
}

/// `count` transfers of `users` in `cell` through the bulk submit, `tasks` batches of at most
/// 500 at a time, each user's direction alternating batch by batch. Answers how many committed.
pub async fn bulk(cell: &Cell, users: &[u64], count: u64, tasks: usize) -> anyhow::Result<u64> {
    let batch = 500u64;
    let batches = count.div_ceil(batch);
    let next = Arc::new(AtomicU64::new(0));
    let committed = Arc::new(AtomicU64::new(0));
    let work = (0..tasks.max(1)).map(|_| {
        let (next, committed) = (next.clone(), committed.clone());
        let coordinator = cell.coordinator.clone();
        let users = users.to_vec();
        async move {
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    return;
                }
                let n = batch.min(count - b * batch);
                let from = if b % 2 == 0 {
                    AccountType::Funding
                } else {
                    AccountType::Spot
                };
                let items = (0..n)
                    .map(|i| transfer(users[(i as usize) % users.len()], from))
                    .collect();
                let done = coordinator.submit_many(items).await;
                let ok = done
                    .iter()
                    .filter(|a| a.as_ref().is_ok_and(|t| t.state.is_terminal()))
                    .count();
                committed.fetch_add(ok as u64, Ordering::Relaxed);
            }
        }
    });
    futures_util::future::join_all(work).await;
    Ok(committed.load(Ordering::Relaxed))
}

/// What the clients saw.
#[derive(Default)]
pub struct Load {
    /// Transfers of users outside the moving partition answered in a final state.
    pub others: AtomicU64,
    /// Transfers of the moving partition's users answered in a final state.
    pub movers: AtomicU64,
    /// Answers neither final nor fenced, and fenced answers to a user outside the partition.
    pub errors: AtomicU64,
    /// The moving users' answers: when, whose, and whether it was a fenced refusal.
    pub log: Mutex<Vec<(Instant, u64, bool)>>,
    pub stop: AtomicBool,
}

/// Transfers back and forth for `user` until `load.stop`, to the cell that owns its partition;
/// a fenced refusal sends it to the owner the refusing cell's map names (at once if it moved,
/// after 20 ms if it is still paused there), as a front that reloads its map would.
pub async fn client(two: Arc<Two>, user: u64, mover: bool, pause: Duration, load: Arc<Load>) {
    let uid = UserId::new(user).expect("a user id");
    let mut at = if partition_of(uid).get() >= 128 {
        CellId::new(2).expect("cell 2")
    } else {
        CellId::ONE
    };
    let mut to_spot = true;
    while !load.stop.load(Ordering::Relaxed) {
        let from = if to_spot {
            AccountType::Funding
        } else {
            AccountType::Spot
        };
        let answer = two.cell(at).coordinator.submit(transfer(user, from)).await;
        let fenced = answer.as_ref().is_err_and(|e| e.is_fenced());
        if mover && (answer.is_ok() || fenced) {
            let mut log = load.log.lock().expect("the log");
            log.push((Instant::now(), user, fenced));
        }
        match answer {
            Ok(t) if t.state.is_terminal() => {
                let counter = if mover { &load.movers } else { &load.others };
                counter.fetch_add(1, Ordering::Relaxed);
                to_spot = !to_spot;
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            Err(_) if fenced && mover => match owner(&two.cell(at).pool, partition_of(uid)).await {
                Some(cell) if cell != at => at = cell,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            other => {
                if load.errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("user {user}: {other:?}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The cell `pool`'s map names for `p`.
pub async fn owner(pool: &PgPool, p: Partition) -> Option<CellId> {
    let cell: i32 = sqlx::query_scalar("SELECT cell_id FROM cell_partitions WHERE partition = $1")
        .bind(i16::from(p.get()))
        .fetch_one(pool)
        .await
        .ok()?;
    CellId::new(u64::try_from(cell).ok()?)
}

/// `PgPartitionStores`, each call's time added up under its name (`copy` calls by the step
/// they ran in), and the span from a move's first freeze call to its `Frozen` answer.
#[derive(Clone)]
pub struct Timed {
    inner: PgPartitionStores,
    pub times: Arc<Mutex<Times>>,
}

/// What `Timed` added up since it was last taken.
#[derive(Debug, Default, Clone)]
pub struct Times {
    pub calls: BTreeMap<&'static str, Duration>,
    pub drain_from: Option<Instant>,
    pub drain: Duration,
}

impl Timed {
    /// What was added up since the last take, and a fresh start.
    pub fn take(&self) -> Times {
        std::mem::take(&mut *self.times.lock().expect("times"))
    }

    fn add(&self, name: &'static str, since: Instant) {
        let mut times = self.times.lock().expect("times");
        *times.calls.entry(name).or_default() += since.elapsed();
    }
}

#[async_trait]
impl PartitionStores for Timed {
    async fn mark_incoming(&self, c: CellId, p: Partition, id: &MoveId) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.mark_incoming(c, p, id).await;
        self.add("mark", t);
        r
    }

    async fn copy_batch(&self, record: &MoveRecord) -> Result<Copied, StoreError> {
        let t = Instant::now();
        let r = self.inner.copy_batch(record).await;
        let draining = self.times.lock().expect("times").drain_from.is_some();
        let name = match record.step {
            MoveStep::Copying => "copy",
            MoveStep::CatchingUp => "catch-up",
            _ if draining => "tail",
            _ => "copy before the hold",
        };
        self.add(name, t);
        r
    }

    async fn freeze(&self, record: &MoveRecord) -> Result<Freeze, StoreError> {
        let t = Instant::now();
        self.times
            .lock()
            .expect("times")
            .drain_from
            .get_or_insert(t);
        let r = self.inner.freeze(record).await;
        self.add("freeze calls", t);
        if let Ok(Freeze::Frozen) = r {
            let mut times = self.times.lock().expect("times");
            times.drain = times.drain_from.map_or(Duration::ZERO, |f| f.elapsed());
        }
        r
    }

    async fn unfreeze(&self, c: CellId, p: Partition) -> Result<(), StoreError> {
        self.inner.unfreeze(c, p).await
    }

    async fn void_incoming(&self, c: CellId, p: Partition, id: &MoveId) -> Result<(), StoreError> {
        self.inner.void_incoming(c, p, id).await
    }

    async fn book(&self, c: CellId, p: Partition, after: i64) -> Result<PartitionBook, StoreError> {
        let t = Instant::now();
        let r = self.inner.book(c, p, after).await;
        self.add("books", t);
        r
    }

    async fn history_prefixes(
        &self,
        record: &MoveRecord,
    ) -> Result<(HistoryPrefix, HistoryPrefix), StoreError> {
        let t = Instant::now();
        let r = self.inner.history_prefixes(record).await;
        self.add("history prefixes", t);
        r
    }

    /// Both cells' checks run side by side: each call's time is its own (the two overlap).
    async fn conservation_exact(&self, c: CellId) -> Result<bool, StoreError> {
        let t = Instant::now();
        let draining = self.times.lock().expect("times").drain_from.is_some();
        let r = self.inner.conservation_exact(c).await;
        self.add(
            if draining {
                "conservation"
            } else {
                "conservation warm-up"
            },
            t,
        );
        r
    }

    async fn switch(&self, record: &MoveRecord) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.switch(record).await;
        self.add("switch", t);
        r
    }
}
