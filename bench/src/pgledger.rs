//! pgledger side by side (issue 49): the single-database ledger of `../shared/anchors/pgledger`,
//! driven by `pgbench` at the same client count and on the same PostgreSQL as a run of ours, so
//! the two rates come from one sitting. It needs a loaded `pgledger_anchor` database (that
//! README says how to load it); without one the benchmark says so and goes on without it.

use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;

use crate::procstat;

/// pgledger's transfer as `../shared/anchors/pgledger/pgledger-transfer.sql` gives it: each
/// client moves 1.00 between its own two accounts, in a random direction.
const TRANSFER_SQL: &str = "\\set dir random(0,1)
SELECT id FROM pgledger_create_transfer(CASE WHEN :dir = 0 THEN 'a_' || :client_id || '_f' ELSE 'a_' || :client_id || '_s' END, CASE WHEN :dir = 0 THEN 'a_' || :client_id || '_s' ELSE 'a_' || :client_id || '_f' END, 1.00::numeric);
";

/// The anchor's database name.
pub const DATABASE: &str = "pgledger_anchor";

/// One pgledger run: its rate and the machine's CPU per transfer.
#[derive(Debug, Clone, Copy)]
pub struct Pgledger {
    pub clients: usize,
    pub tps: f64,
    pub machine_cpu_per_transfer_ms: f64,
}

/// Whether the anchor is loaded on the server `pool` talks to: the database exists and holds
/// pgledger's function and the accounts of every client (256 clients at most).
pub async fn loaded(pool: &PgPool) -> bool {
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(DATABASE)
        .fetch_optional(pool)
        .await
        .ok()
        .flatten();
    exists.is_some()
}

/// `pgbench`: on PATH, or PostgreSQL 15's own.
fn pgbench() -> String {
    let debian = "/usr/lib/postgresql/15/bin/pgbench";
    if std::path::Path::new(debian).exists() {
        debian.to_owned()
    } else {
        "pgbench".to_owned()
    }
}

/// Runs pgledger's transfer at `clients` for `seconds` on `server` (host and port of the URL's
/// libpq form are taken from `url`): what pgbench reports, with the machine's CPU over the run.
pub fn run(
    url: &sqlx::postgres::PgConnectOptions,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<Pgledger> {
    let script = std::env::temp_dir().join(format!("pgledger-transfer-{}.sql", std::process::id()));
    std::fs::write(&script, TRANSFER_SQL)?;
    let before = procstat::machine_busy();
    let started = std::time::Instant::now();
    let output = Command::new(pgbench())
        .args(["-h", url.get_host(), "-p", &url.get_port().to_string()])
        .args(["-U", url.get_username(), "-n", "-M", "prepared"])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
            &seconds.to_string(),
        ])
        .arg("-f")
        .arg(&script)
        .arg(DATABASE)
        .output()
        .context("run pgbench")?;
    let elapsed = started.elapsed().max(Duration::from_millis(1));
    let machine = procstat::machine_busy().saturating_sub(before);
    std::fs::remove_file(&script).ok();
    let text = String::from_utf8_lossy(&output.stdout);
    let tps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .with_context(|| {
            format!(
                "pgbench printed no rate: {}{}",
                text,
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    let transfers = (tps * elapsed.as_secs_f64()).max(1.0);
    Ok(Pgledger {
        clients,
        tps,
        machine_cpu_per_transfer_ms: machine.as_secs_f64() * 1000.0 / transfers,
    })
}
