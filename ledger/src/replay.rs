//! `ledger replay`: rebuilds every projection from the event log into fresh tables and reports
//! whether they equal the live projections (exit status 1 if not), with a progress bar on a
//! terminal; or, for audits, one transfer's state (`--transfer`) or one user's balances
//! (`--user`) as of a feed position (`--at-position`) or a time (`--at-time`).

use anyhow::{bail, Context};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use projections::replay::{self, AsOf};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Show this transfer (req_id) as of the moment given, instead of a full replay.
    #[arg(long, conflicts_with = "user")]
    pub transfer: Option<String>,
    /// Show this user's balances as of the moment given, instead of a full replay.
    #[arg(long)]
    pub user: Option<u64>,
    /// The moment: a feed position (events up to and including it).
    #[arg(long, conflicts_with = "at_time")]
    pub at_position: Option<i64>,
    /// The moment: a time in RFC 3339 (events that happened at or before it).
    #[arg(long)]
    pub at_time: Option<String>,
    /// Keep the rebuilt tables (schema `replay_<timestamp>`) for inspection.
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub database: crate::settings::DatabaseFlags,
}

/// Runs the command; a full replay that finds a difference fails.
pub async fn run(
    args: ReplayArgs,
    database: &crate::settings::DatabaseSettings,
) -> anyhow::Result<()> {
    let pool = database.pool(4).await?;
    let as_of = match (&args.at_position, &args.at_time) {
        (Some(p), _) => AsOf::Position(*p),
        (None, Some(t)) => AsOf::Time(
            DateTime::parse_from_rfc3339(t)
                .with_context(|| format!("--at-time {t:?} is not RFC 3339"))?
                .with_timezone(&Utc),
        ),
        (None, None) => AsOf::Now,
    };
    if let Some(req_id) = &args.transfer {
        return show_transfer(&pool, req_id, as_of).await;
    }
    if let Some(user) = args.user {
        let user = i64::try_from(user).context("--user is too large")?;
        return show_balances(&pool, user, as_of).await;
    }
    if as_of != AsOf::Now {
        bail!("--at-position and --at-time need --transfer or --user");
    }
    full_replay(&pool, args.keep).await
}

async fn full_replay(pool: &sqlx::PgPool, keep: bool) -> anyhow::Result<()> {
    // indicatif draws only on a terminal, so piped output stays clean.
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "replaying {bar:40} {pos}/{len} events ({per_sec}, eta {eta})",
        )
        .context("progress bar template")?,
    );
    let report = replay::replay(pool, keep, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .await
    .context("replay")?;
    bar.finish_and_clear();
    println!(
        "replayed {} events into schema {}{}; compared after {} events",
        report.events_replayed,
        report.schema,
        if keep { " (kept)" } else { " (dropped)" },
        report.events_compared
    );
    for t in &report.tables {
        println!(
            "  {:<22} live {:>8} rows  replay {:>8} rows  only-live {:>6}  only-replay {:>6}  {}",
            t.table,
            t.live_rows,
            t.replay_rows,
            t.only_live,
            t.only_replay,
            if t.equal() { "EQUAL" } else { "DIFFERENT" }
        );
    }
    if report.equal() {
        println!("result: EQUAL (every projection rebuilt from the log matches the live one)");
        Ok(())
    } else {
        println!("result: DIFFERENT");
        bail!("the rebuilt projections differ from the live ones")
    }
}

fn moment(as_of: AsOf) -> String {
    match as_of {
        AsOf::Now => "now".to_owned(),
        AsOf::Position(p) => format!("feed position {p}"),
        AsOf::Time(t) => t.to_rfc3339_opts(SecondsFormat::Millis, true),
    }
}

async fn show_transfer(pool: &sqlx::PgPool, req_id: &str, as_of: AsOf) -> anyhow::Result<()> {
    match replay::transfer_as_of(pool, req_id, as_of).await? {
        None => println!("transfer {req_id} did not exist as of {}", moment(as_of)),
        Some((data, events)) => {
            println!("transfer {req_id} as of {}:", moment(as_of));
            println!(
                "  user {}  {} -> {}  {} {}  state {}",
                data.user_id, data.from, data.to, data.amount, data.asset, data.state
            );
            for e in events {
                println!(
                    "  #{:<3} position {:<8} {:<24} {}",
                    e.sequence,
                    e.position,
                    e.event_type,
                    e.occurred_at.to_rfc3339_opts(SecondsFormat::Millis, true)
                );
            }
        }
    }
    Ok(())
}

async fn show_balances(pool: &sqlx::PgPool, user: i64, as_of: AsOf) -> anyhow::Result<()> {
    let rows = replay::balances_as_of(pool, user, as_of).await?;
    println!("user {user} balances as of {}:", moment(as_of));
    if rows.is_empty() {
        println!("  (none)");
    }
    for r in rows {
        println!(
            "  {:<6} deposits {:>14}  funding {:>14}  spot {:>14}  in-flight {:>14}",
            r.asset, r.deposits, r.funding, r.spot, r.in_flight
        );
    }
    Ok(())
}
