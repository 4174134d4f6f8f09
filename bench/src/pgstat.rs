//! `pg_stat_statements` around each transfer run (`ledger-bench transfers --statements`): what a
//! transfer cost PostgreSQL, statement by statement (calls and execution time per transfer). The
//! server must preload the extension (`shared_preload_libraries = 'pg_stat_statements'`);
//! without it the benchmark says so once and goes on. The counts are the whole server's during
//! the run: the ledger's background work (projector, maintenance, audit) included.

use sqlx::PgPool;

/// Empties the statistics before a run; false when the extension is not available.
pub async fn reset(pool: &PgPool) -> bool {
    let created = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(pool)
        .await;
    let reset = sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await;
    if let Err(e) = created.and(reset) {
        println!("pg_stat_statements unavailable ({e}): no statement profile");
        return false;
    }
    true
}

/// Prints the run's statements per transfer: the totals, then the 12 costliest.
pub async fn print(pool: &PgPool, label: &str, transfers: u64) -> anyhow::Result<()> {
    let per = transfers.max(1) as f64;
    let (calls, ms): (Option<i64>, Option<f64>) = sqlx::query_as(
        "SELECT sum(calls)::bigint, sum(total_exec_time) FROM pg_stat_statements
          WHERE query NOT LIKE '%pg_stat_statements%'",
    )
    .fetch_one(pool)
    .await?;
    println!(
        "statements ({label}, {transfers} transfers): {:.2} calls and {:.0} µs of execution per transfer",
        calls.unwrap_or(0) as f64 / per,
        ms.unwrap_or(0.0) * 1000.0 / per
    );
    let top: Vec<(String, i64, f64)> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 100), calls, total_exec_time
           FROM pg_stat_statements
          WHERE query NOT LIKE '%pg_stat_statements%'
          ORDER BY total_exec_time DESC LIMIT 12",
    )
    .fetch_all(pool)
    .await?;
    for (query, calls, ms) in top {
        println!(
            "  {:>7.3} calls {:>6.1} µs  {query}",
            calls as f64 / per,
            ms * 1000.0 / per
        );
    }
    Ok(())
}
