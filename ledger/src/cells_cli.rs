//! `ledger cells`: the operator's commands over a cell map (ADR 0023). `plan` reads what each
//! partition weighs in its cell's database (`adapters::pg::partitions`), asks `cells::plan` for
//! the moves that would even the cells out, and prints them, executing nothing; `move`,
//! `moves` and `cancel` ask the running ledger (`cells_moves_cli.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use cells::{CellMap, Partition, Plan};
use clap::{Args, Subcommand, ValueEnum};

use crate::settings::Settings;
use crate::settings::{CellFlags, DatabaseFlags, Flags};

#[derive(Debug, Subcommand)]
pub enum CellsCommand {
    /// Print the partition moves that would even out users (or recent transfers) across the
    /// cells of the map; executes nothing.
    Plan(PlanArgs),
    /// Move a partition's users to another cell while every other user keeps trading: asks the
    /// running ledger (`--api`) to start the move, then prints each step until it ends.
    Move(crate::cells_moves_cli::MoveArgs),
    /// List the latest partition moves and where each stands.
    Moves(crate::cells_moves_cli::MovesArgs),
    /// Cancel a move that has not begun its switch: the partition stays whole in its source.
    Cancel(crate::cells_moves_cli::CancelArgs),
    /// Add a cell to the running ledger (`--api`): it takes the next id, is written into every
    /// cell's map and serves at once, owning no partition until moves give it some.
    Add(crate::cells_moves_cli::AddArgs),
}

impl CellsCommand {
    /// The settings this command declared.
    pub fn flags(&self, flags: Flags) -> Flags {
        let secrets = |api: &crate::cells_moves_cli::ApiArgs| Flags {
            secrets: api.secrets.clone(),
            ..flags.clone()
        };
        match self {
            CellsCommand::Plan(args) => Flags {
                cells: args.cell_map.clone(),
                database: args.database.clone(),
                ..flags.clone()
            },
            CellsCommand::Move(args) => secrets(&args.api),
            CellsCommand::Moves(args) => secrets(&args.api),
            CellsCommand::Cancel(args) => secrets(&args.api),
            CellsCommand::Add(args) => secrets(&args.api),
        }
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// What to even out: each partition's users, or its transfers of the last `--window-secs`.
    #[arg(long, value_enum, default_value_t = Weight::Users)]
    pub by: Weight,
    /// The window of `--by transfers`, in seconds.
    #[arg(long, default_value_t = 3600)]
    pub window_secs: u64,
    /// The most moves to propose.
    #[arg(long, default_value_t = 16)]
    pub max_moves: usize,
    /// The map `ledger up --cells N` runs (its databases on DATABASE_URL's server), instead of
    /// a map file.
    #[arg(long)]
    pub up_cells: Option<u16>,
    /// Print the plan as one JSON document.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub cell_map: CellFlags,
    #[command(flatten)]
    pub database: DatabaseFlags,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Weight {
    Users,
    Transfers,
}

/// `ledger cells …`.
pub async fn run(command: CellsCommand, settings: &Settings) -> anyhow::Result<()> {
    match command {
        CellsCommand::Plan(args) => plan(args, settings).await,
        CellsCommand::Move(args) => crate::cells_moves_cli::start(args, &settings.secrets).await,
        CellsCommand::Moves(args) => crate::cells_moves_cli::list(args, &settings.secrets).await,
        CellsCommand::Cancel(args) => crate::cells_moves_cli::cancel(args, &settings.secrets).await,
        CellsCommand::Add(args) => crate::cells_moves_cli::add(args, &settings.secrets).await,
    }
}

async fn plan(args: PlanArgs, settings: &Settings) -> anyhow::Result<()> {
    let map = match (args.up_cells, &settings.cells) {
        (Some(_), Some(_)) => bail!("give either --up-cells or a cell map, not both"),
        (Some(n), None) => crate::cellular::local_map(&settings.database.url, n)?,
        (None, Some(map)) => map.clone(),
        (None, None) => bail!("`ledger cells plan` needs a cell map (--cell-map or --up-cells N)"),
    };
    // The cells added while the deployment served are planned over too (ADR 0023 §1).
    let (map, _) = crate::cellular::adding::with_added_cells(settings, map).await?;
    let map = newest(&map).await?;
    let weights = weights(&map, args.by, Duration::from_secs(args.window_secs)).await?;
    let plan = cells::plan(&map, &weights, args.max_moves);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&as_json(&plan, args.by))?
        );
    } else {
        print!("{}", describe(&plan, args.by));
    }
    Ok(())
}

/// The map with the owners of the newest map the cells store (ADR 0023 §1: after a move the
/// file is only the seed); the file's when no cell stores a newer one.
async fn newest(map: &CellMap) -> anyhow::Result<CellMap> {
    use application::cell_map::CellMapStore;
    let mut best: Option<application::cell_map::StoredMap> = None;
    for spec in map.cells() {
        let pool = schema::connect(&spec.database_url, 1)
            .await
            .with_context(|| format!("cell {}: its database", spec.id))?;
        let stored = adapters::pg::cell_map::PgCellMap::new(pool.clone())
            .stored_map()
            .await;
        pool.close().await;
        if let Ok(stored) = stored {
            if best.as_ref().is_none_or(|b| stored.version > b.version) {
                best = Some(stored);
            }
        }
    }
    match best {
        Some(stored) if stored.version > 1 => map.with_owners(&stored.owners).with_context(|| {
            format!(
                "the cells' stored map (version {}) names a cell the file does not",
                stored.version
            )
        }),
        _ => Ok(map.clone()),
    }
}

/// Each partition's weight, read from the cell that owns it.
async fn weights(
    map: &CellMap,
    by: Weight,
    window: Duration,
) -> anyhow::Result<BTreeMap<Partition, u64>> {
    let mut out = BTreeMap::new();
    for spec in map.cells() {
        let database = crate::config::redact_url(&spec.database_url);
        let pool = schema::connect(&spec.database_url, 1)
            .await
            .with_context(|| format!("cell {}: database {database}", spec.id))?;
        let read = match by {
            Weight::Users => adapters::pg::partitions::users_per_partition(&pool).await,
            Weight::Transfers => {
                adapters::pg::partitions::transfers_per_partition(&pool, window).await
            }
        };
        let read = read.with_context(|| format!("cell {}: read its partitions", spec.id))?;
        for (raw, weight) in read {
            let partition = Partition::new(u64::from(raw)).expect("0 to 255 is a partition");
            // Only what the cell owns counts: rows of a partition another cell owns (a move's
            // leftovers, ADR 0023) are not its load.
            if map.owner(partition) == spec.id {
                out.insert(partition, weight);
            }
        }
        pool.close().await;
    }
    Ok(out)
}

fn unit(by: Weight) -> &'static str {
    match by {
        Weight::Users => "users",
        Weight::Transfers => "transfers",
    }
}

/// `n` of `unit`, singular for one.
fn count(n: u64, unit: &str) -> String {
    match n {
        1 => format!("1 {}", unit.trim_end_matches('s')),
        n => format!("{n} {unit}"),
    }
}

fn describe(plan: &Plan, by: Weight) -> String {
    let unit = unit(by);
    let mut out = String::from("cells now:\n");
    for (cell, load) in &plan.before {
        out.push_str(&format!("  cell {cell}: {}\n", count(*load, unit)));
    }
    if plan.moves.is_empty() {
        out.push_str("no move would even the cells out further\n");
        return out;
    }
    out.push_str(&format!(
        "{} moves (none executed; moving a partition is not built yet, ADR 0023):\n",
        plan.moves.len()
    ));
    for m in &plan.moves {
        out.push_str(&format!(
            "  partition {} from cell {} to cell {} ({})\n",
            m.partition,
            m.from,
            m.to,
            count(m.weight, unit)
        ));
    }
    out.push_str("cells after:\n");
    for (cell, load) in &plan.after {
        out.push_str(&format!("  cell {cell}: {}\n", count(*load, unit)));
    }
    out
}

fn as_json(plan: &Plan, by: Weight) -> serde_json::Value {
    let loads = |l: &BTreeMap<cells::CellId, u64>| -> serde_json::Value {
        l.iter()
            .map(|(c, w)| (c.to_string(), serde_json::json!(w)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    serde_json::json!({
        "by": unit(by),
        "before": loads(&plan.before),
        "after": loads(&plan.after),
        "moves": plan.moves.iter().map(|m| serde_json::json!({
            "partition": m.partition.get(),
            "from": m.from.get(),
            "to": m.to.get(),
            "weight": m.weight,
        })).collect::<Vec<_>>(),
    })
}
