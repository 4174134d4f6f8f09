//! The tamper-evident log in the chaos run (issue 36): every ledger keeps it with one signing key
//! made for the run, and the end check asks that the tree caught up with the feed (the followers
//! rode through every kill and restart) and that `ledger verify` finds the whole log, its tree and
//! every checkpoint signed during the run in agreement.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;

/// The run's signing key file's name in its directory.
const KEY_FILE: &str = "log-signing.key";

/// How long the end check waits for the tree to hold every event.
const CATCH_UP_MAX: Duration = Duration::from_secs(60);

/// Writes a new signing key for the run in `dir`; its path, for `LEDGER_LOG_SIGNING_KEY_FILE`.
pub fn make_key(dir: &Path) -> anyhow::Result<PathBuf> {
    let seed: [u8; 32] = rand::rng().random();
    let signer = tlog::Signer::from_seed("chaos.ledger/log", seed)
        .map_err(|e| anyhow::anyhow!("a signing key: {e}"))?;
    let path = dir.join(KEY_FILE);
    std::fs::write(&path, format!("{}\n", signer.to_skey()))
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// What is wrong with the log at the end of a run, if anything: the tree still behind the feed
/// after [`CATCH_UP_MAX`], or `ledger verify` (the binary in `bin_dir`, against `db_url`, with
/// the run's key) not exiting 0, with what it printed. Under a cell map (`cell`: the map file
/// and the cell's id) `pool` and `db_url` are that cell's, and verify checks that cell's log.
pub async fn log_problems(
    pool: &sqlx::PgPool,
    bin_dir: &Path,
    db_url: &str,
    key: &Path,
    cell: Option<(&Path, u16)>,
) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let deadline = Instant::now() + CATCH_UP_MAX;
    loop {
        let (tree, head): (i64, i64) =
            sqlx::query_as("SELECT size, (SELECT position FROM feed_head) FROM tlog_state")
                .fetch_one(pool)
                .await?;
        if tree >= head {
            break;
        }
        if Instant::now() > deadline {
            problems.push(format!(
                "the tamper-evident log's tree stayed at {tree} of {head} events"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut verify = Command::new(bin_dir.join("ledger"));
    verify
        .arg("verify")
        .env("DATABASE_URL", db_url)
        .env("LEDGER_LOG_SIGNING_KEY_FILE", key);
    if let Some((map, id)) = cell {
        verify
            .env("LEDGER_CELL_MAP", map)
            .arg("--cell")
            .arg(id.to_string());
    }
    let out = tokio::task::spawn_blocking(move || verify.output()).await??;
    if !out.status.success() {
        problems.push(format!(
            "ledger verify exited {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(problems)
}
