//! Replay: rebuilds every projection from the event log from scratch into fresh tables (a schema
//! of their own) with the same projector code, then compares them with the live projections at
//! the same log position. Also point-in-time answers for audits: one transfer, or one user's
//! balances, as of a feed position or a time.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use cqrs_es::Aggregate;
use domain::{Transfer, TransferData, TransferEvent};
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::error::ProjectionError;
use crate::feed::{self, FeedEvent};
use crate::fold::{BalanceDelta, Fold};
use crate::log::{StoredEvent, TRANSFER_AGGREGATE};
use crate::projector::{Projector, LIVE_LOCK_KEY};

/// The advisory lock a replay's own projector takes (distinct from the live one).
const REPLAY_LOCK_KEY: i64 = 0x4c45_4447_4552_0002;

/// Events per transaction of the replay's bulk pass: large, since nothing waits on the replay's
/// lock (fewer, larger upserts of the same balances), and bounded, so memory stays small (about
/// 50 MB of events).
const BULK_BATCH_EVENTS: usize = 50_000;

/// The indexes writing needs (ON CONFLICT targets); every other index of the replay's tables is
/// built only if the replay is kept, after the comparison.
const WRITE_INDEXES: [&str; 3] = [
    "projector_cursor_pkey",
    "transfer_balances_pkey",
    "transfer_state_counts_pkey",
];

/// Creates in `schema` the indexes of the live read-model tables that writing needs, and returns
/// the statements for the rest, to run after the bulk pass.
/// Taken from the catalogue, so a new index in a migration is rebuilt here too.
async fn copy_indexes(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    schema: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let defs: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT tablename::text, indexname::text, indexdef FROM pg_indexes
         WHERE schemaname = 'public' AND tablename = ANY($1) ORDER BY indexname",
    )
    .bind(
        TABLES
            .iter()
            .map(|(t, _, _)| (*t).to_owned())
            .chain(["projector_cursor".to_owned()])
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut **tx)
    .await?;
    let mut later = Vec::new();
    for (table, name, def) in defs {
        let def = def.replacen(
            &format!(" ON public.{table} "),
            &format!(" ON \"{schema}\".{table} "),
            1,
        );
        if WRITE_INDEXES.contains(&name.as_str()) {
            sqlx::query(&def).execute(&mut **tx).await?;
        } else {
            later.push(def);
        }
    }
    Ok(later)
}

/// The tables a replay rebuilds, in its own schema.
const REPLAY_TABLES: [&str; 4] = [
    "projector_cursor",
    "transfers_view",
    "transfer_balances",
    "transfer_state_counts",
];

/// Connections building the rebuilt tables' indexes, or comparing them, side by side (one per
/// core of the machine this was measured on; each is one server process working).
const INDEX_BUILDERS: usize = 2;

/// Runs `work` on every item, [`INDEX_BUILDERS`] at a time, each worker taking the next item from
/// a shared queue (so the first items, the largest, start first). Results come in no fixed order.
async fn side_by_side<T, R, F, Fut>(items: Vec<T>, work: F) -> Result<Vec<R>, sqlx::Error>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<R, sqlx::Error>>,
{
    let queue = std::sync::Mutex::new(std::collections::VecDeque::from(items));
    let next = || queue.lock().map_or(None, |mut q| q.pop_front());
    let worker = || async {
        let mut done = Vec::new();
        while let Some(item) = next() {
            done.push(work(item).await?);
        }
        Ok::<_, sqlx::Error>(done)
    };
    let results = futures_util::future::try_join_all((0..INDEX_BUILDERS).map(|_| worker())).await?;
    Ok(results.into_iter().flatten().collect())
}

/// Builds the index statements side by side, the history's (on the largest table) first.
async fn build_indexes(pool: &PgPool, mut indexes: Vec<String>) -> Result<(), sqlx::Error> {
    indexes.sort_by_key(|def| !def.contains(".transfers_view "));
    side_by_side(indexes, |def| async move {
        let mut tx = pool.begin().await?;
        // Enough sort memory to build each index in one pass (the default, 64 MB, spills to
        // disk); the builders are the parallelism, so no extra workers per build.
        sqlx::query("SET LOCAL maintenance_work_mem = '256MB'")
            .execute(&mut *tx)
            .await?;
        sqlx::query("SET LOCAL max_parallel_maintenance_workers = 0")
            .execute(&mut *tx)
            .await?;
        sqlx::query(&def).execute(&mut *tx).await?;
        tx.commit().await
    })
    .await?;
    Ok(())
}

/// Each projection table and the columns compared, with the filter that drops rows meaning
/// "nothing" (a zero sum may or may not have a row, depending on batching). The feed is not a
/// projection: its positions are written with the events themselves (migration 0013), so there
/// is nothing of it to rebuild.
const TABLES: [(&str, &str, &str); 3] = [
    ("transfers_view", "*", "true"),
    (
        "transfer_balances",
        "user_id, asset, funding_net, spot_net, in_flight",
        "NOT (funding_net = 0 AND spot_net = 0 AND in_flight = 0)",
    ),
    (
        "transfer_state_counts",
        "state_id, state, count",
        "count <> 0",
    ),
];

/// Compares each rebuilt table with its live one: both ways (rows of one side with no equal row
/// on the other, as multisets), as separate queries on [`INDEX_BUILDERS`] connections at once.
async fn compare(pool: &PgPool, schema: &str) -> Result<Vec<TableComparison>, sqlx::Error> {
    let select = |columns: &str, from: String, meaningful: &str| {
        format!("SELECT {columns} FROM {from} WHERE {meaningful}")
    };
    // (table index, live side first?, query): rows of one side, and how many have no equal row
    // on the other.
    let mut queries = Vec::new();
    for (i, (table, columns, meaningful)) in TABLES.iter().enumerate() {
        let live = select(columns, format!("public.{table}"), meaningful);
        let rebuilt = select(columns, format!("\"{schema}\".{table}"), meaningful);
        for (live_side, one, other) in [(true, &live, &rebuilt), (false, &rebuilt, &live)] {
            queries.push((
                i,
                live_side,
                format!(
                    "SELECT (SELECT count(*) FROM ({one}) a),
                            (SELECT count(*) FROM ({one} EXCEPT ALL {other}) b)"
                ),
            ));
        }
    }
    let found = side_by_side(queries, |(i, live_side, query)| async move {
        let (rows, unmatched): (i64, i64) = sqlx::query_as(&query).fetch_one(pool).await?;
        Ok((i, live_side, rows, unmatched))
    })
    .await?;
    let mut tables: Vec<TableComparison> = TABLES
        .iter()
        .map(|(table, _, _)| TableComparison {
            table: (*table).to_owned(),
            live_rows: 0,
            replay_rows: 0,
            only_live: 0,
            only_replay: 0,
        })
        .collect();
    for (i, live_side, rows, unmatched) in found {
        let t = &mut tables[i];
        if live_side {
            (t.live_rows, t.only_live) = (rows, unmatched);
        } else {
            (t.replay_rows, t.only_replay) = (rows, unmatched);
        }
    }
    Ok(tables)
}

/// How one table compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableComparison {
    pub table: String,
    pub live_rows: i64,
    pub replay_rows: i64,
    /// Rows in the live table with no equal row in the replay, and the other way round.
    pub only_live: i64,
    pub only_replay: i64,
}

impl TableComparison {
    pub fn equal(&self) -> bool {
        self.only_live == 0 && self.only_replay == 0
    }
}

/// The outcome of a full replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Where the rebuilt tables were written (dropped afterwards unless kept).
    pub schema: String,
    pub events_replayed: i64,
    /// How many events the live projections had applied where both sides were compared.
    pub events_compared: i64,
    pub tables: Vec<TableComparison>,
}

impl ReplayReport {
    pub fn equal(&self) -> bool {
        self.tables.iter().all(TableComparison::equal)
    }
}

async fn live_cursor(executor: &PgPool) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT tx_id::text::bigint, global_position FROM projector_cursor WHERE projector = 'main'",
    )
    .fetch_one(executor)
    .await
}

/// Rebuilds every projection from the log into a fresh schema and compares it with the live
/// projections at one log position. `progress(applied, total)` is called after every batch.
/// The live projector is paused only for the final catch-up and the comparison.
pub async fn replay(
    pool: &PgPool,
    keep: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<ReplayReport, ProjectionError> {
    let schema = format!("replay_{}", Utc::now().format("%Y%m%d_%H%M%S_%6f"));
    let indexes = create_schema(pool, &schema).await?;
    let total = eventlog::batches::count(pool).await?;
    let total = u64::try_from(total).unwrap_or(0);
    let projector = Projector::in_schema(pool.clone(), schema.clone(), REPLAY_LOCK_KEY);
    let mut applied: u64 = 0;

    // Phase 1, without pausing anything: up to where the live projector stood when we began.
    // That position was below the commit watermark when it was applied, so the events up to it can no
    // longer change, and one streaming read in large batches (the bulk pass) takes them all.
    let target = live_cursor(pool).await?;
    projector
        .bulk_pass(target, BULK_BATCH_EVENTS, |n| {
            applied += n as u64;
            progress(applied, total.max(applied));
        })
        .await?;
    // Phase 2: hold the live projector's lock so the live tables stand still, bring the replay
    // to exactly the live position, and compare.
    let mut hold = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(LIVE_LOCK_KEY)
        .execute(&mut *hold)
        .await?;
    let target = live_cursor(pool).await?;
    loop {
        let pass = projector.pass(Some(target)).await?;
        applied += pass.applied as u64;
        progress(applied, total.max(applied));
        if pass.exhausted {
            break;
        }
    }
    let events_compared: i64 =
        sqlx::query_scalar("SELECT events_applied FROM projector_cursor WHERE projector = 'main'")
            .fetch_one(&mut *hold)
            .await?;
    // The live tables stand still while `hold` keeps the lock, so the comparisons can run on
    // other connections, side by side.
    let tables = compare(pool, &schema).await?;
    hold.commit().await?;
    finish_schema(pool, &schema, keep, indexes).await?;
    Ok(ReplayReport {
        schema,
        events_replayed: i64::try_from(applied).unwrap_or(i64::MAX),
        events_compared,
        tables,
    })
}

/// The replay's schema: every projection table, unlogged and without indexes (returned, to
/// build at the end), and a cursor at the start of the log.
async fn create_schema(pool: &PgPool, schema: &str) -> Result<Vec<String>, ProjectionError> {
    let mut setup = pool.begin().await?;
    sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&mut *setup)
        .await?;
    for table in REPLAY_TABLES {
        // Without indexes: maintaining them row by row is most of a bulk rebuild's cost, and
        // building them once afterwards is far cheaper. The ones writing needs come first.
        // Unlogged: the rebuild is scratch, compared and dropped, so writing it (and its index
        // builds) to the WAL buys nothing; a kept replay is made logged at the end.
        sqlx::query(&format!(
            "CREATE UNLOGGED TABLE \"{schema}\".{table} (LIKE public.{table} INCLUDING ALL EXCLUDING INDEXES)"
        ))
        .execute(&mut *setup)
        .await?;
    }
    let indexes = copy_indexes(&mut setup, schema).await?;
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".projector_cursor (projector, tx_id, global_position, events_applied)
         VALUES ('main', '0', 0, 0)"
    ))
    .execute(&mut *setup)
    .await?;
    setup.commit().await?;

    Ok(indexes)
}

/// A kept replay gets its indexes and is made logged; otherwise it is dropped.
async fn finish_schema(
    pool: &PgPool,
    schema: &str,
    keep: bool,
    indexes: Vec<String>,
) -> Result<(), ProjectionError> {
    if keep {
        // The remaining indexes, only for tables that are kept: the comparison needs none (and a
        // row applied twice already shows there, as a row only the replay has). The unique ones
        // prove it again: a transfer row applied twice fails the build.
        build_indexes(pool, indexes).await?;
        for table in REPLAY_TABLES {
            sqlx::query(&format!("ALTER TABLE \"{schema}\".{table} SET LOGGED"))
                .execute(pool)
                .await?;
        }
    } else {
        sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// "As of": a feed position, or a time (events that happened at or before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsOf {
    Now,
    Position(i64),
    Time(DateTime<Utc>),
}

impl AsOf {
    fn bounds(self) -> (Option<i64>, Option<DateTime<Utc>>) {
        match self {
            Self::Now => (None, None),
            Self::Position(p) => (Some(p), None),
            Self::Time(t) => (None, Some(t)),
        }
    }
}

fn stored(e: &FeedEvent) -> StoredEvent {
    StoredEvent {
        tx_id: 0,
        global_position: e.global_position,
        aggregate_type: e.aggregate_type.clone(),
        aggregate_id: e.aggregate_id.clone(),
        sequence: e.sequence,
        event_type: e.event_type.clone(),
        event_version: e.event_version.clone(),
        payload: e.payload.clone(),
    }
}

/// One transfer as it stood at `as_of`, folded by the aggregate itself from the events up to
/// then, with those events. `None` if it did not exist yet.
pub async fn transfer_as_of(
    pool: &PgPool,
    req_id: &str,
    as_of: AsOf,
) -> Result<Option<(TransferData, Vec<FeedEvent>)>, ProjectionError> {
    let (position, time) = as_of.bounds();
    let events = feed::aggregate_events(pool, TRANSFER_AGGREGATE, req_id, position, time).await?;
    let mut transfer = Transfer::default();
    for e in &events {
        let event: Option<TransferEvent> = stored(e).transfer_event()?;
        if let Some(event) = event {
            transfer.apply(event);
        }
    }
    Ok(transfer.data.map(|data| (data, events)))
}

/// One user's balances per asset as of a moment: money deposited from outside up to then, what
/// transfers had done to FUNDING and SPOT, and what was in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceAsOf {
    pub asset: String,
    pub deposits: Decimal,
    /// deposits + funding net of transfers.
    pub funding: Decimal,
    pub spot: Decimal,
    pub in_flight: Decimal,
}

/// One user's balances as of a feed position or a time. External deposits are read from their
/// table, not folded from their entries in the feed (migration 0025): the entries of deposits
/// made before that migration sit at the log's end, after events they preceded. They count up to
/// the time given, or for a position up to the time of the event at that position.
pub async fn balances_as_of(
    pool: &PgPool,
    user_id: i64,
    as_of: AsOf,
) -> Result<Vec<BalanceAsOf>, ProjectionError> {
    let (position, time) = as_of.bounds();
    let events = eventlog::feed::user_events_upto(pool, user_id, position, time).await?;
    let mut fold = Fold::default();
    for e in &events {
        fold.apply(&stored(e))?;
    }
    let deposits_until: Option<DateTime<Utc>> = match as_of {
        AsOf::Now => None,
        AsOf::Time(t) => Some(t),
        AsOf::Position(p) => eventlog::feed::time_upto(pool, p)
            .await?
            .or(Some(DateTime::<Utc>::MIN_UTC)),
    };
    let deposits: Vec<(String, Decimal)> = sqlx::query_as(
        "SELECT asset, SUM(amount) FROM external_deposits
         WHERE user_id = $1 AND ($2::timestamptz IS NULL OR created_at <= $2)
         GROUP BY asset",
    )
    .bind(user_id)
    .bind(deposits_until)
    .fetch_all(pool)
    .await?;
    let mut per_asset: BTreeMap<String, (Decimal, BalanceDelta)> = BTreeMap::new();
    for (asset, amount) in deposits {
        per_asset.entry(asset).or_default().0 += amount;
    }
    for ((_, asset), delta) in fold.balances {
        let entry = per_asset.entry(asset).or_default();
        entry.1.funding_net += delta.funding_net;
        entry.1.spot_net += delta.spot_net;
        entry.1.in_flight += delta.in_flight;
    }
    Ok(per_asset
        .into_iter()
        .map(|(asset, (deposits, d))| BalanceAsOf {
            asset,
            deposits: deposits.normalize(),
            funding: (deposits + d.funding_net).normalize(),
            spot: d.spot_net.normalize(),
            in_flight: d.in_flight.normalize(),
        })
        .collect())
}
