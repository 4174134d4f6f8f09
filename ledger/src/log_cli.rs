//! The tamper-evident log's commands (`docs/adr/0016-tamper-evident-log.md`): `ledger verify`
//! (re-read the log, recompute the tree, check every checkpoint; exit 1 naming the first
//! difference), `ledger log export-checkpoints FILE` (every signed checkpoint, for safekeeping
//! outside the database; `--from-stream` reads those published to JetStream), `ledger log-key` (the verifier key, or a new signing key); and the
//! follower's configuration for `serve` and `up` (`LEDGER_LOG_SIGNING_KEY_FILE`, the checkpoint
//! interval), with the key `up` keeps in its data dir.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rand::TryRngCore;
use tlog::{Signer, Verifier};
use tlog_follower::verify::{verify, OutsideNote};
use tlog_follower::FollowerConfig;

use crate::settings::options::{CheckpointStream, NatsServer};
use crate::settings::{CellFlags, DatabaseFlags, Flags, LogFlags, OtelFlags, Settings};

/// `ledger verify`'s exit status when it cannot run (no key, no database): neither "holds" (0)
/// nor "differs" (1), as `ledger audit`'s.
pub(crate) const VERIFY_EXIT_CANNOT_RUN: i32 = 2;

/// The signing key's file in `ledger up`'s data dir.
pub(crate) const LOG_KEY_FILE: &str = "log-signing.key";

/// The log's commands, flattened into `ledger`'s.
#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// Re-read the whole event log, recompute every leaf and the Merkle tree, and check every
    /// stored checkpoint (signature, root) and those of --checkpoints. Exit 0 when all holds, 1
    /// naming the first position or checkpoint that differs, 2 when it cannot run.
    Verify(VerifyArgs),
    /// The tamper-evident log's checkpoints.
    #[command(subcommand)]
    Log(LogSubcommand),
    /// Print the log's verifier key (C2SP vkey) from LEDGER_LOG_SIGNING_KEY_FILE, or generate a
    /// new signing key with --generate.
    LogKey(LogKeyArgs),
}

#[derive(Debug, Subcommand)]
pub enum LogSubcommand {
    /// Write every signed checkpoint to FILE, one JSON object `{"size", "note"}` a line.
    ExportCheckpoints {
        file: PathBuf,
        #[command(flatten)]
        database: DatabaseFlags,
    },
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Checkpoints saved outside the database (`ledger log export-checkpoints`); may be repeated.
    #[arg(long = "checkpoints")]
    pub checkpoints: Vec<PathBuf>,
    /// The verifier key to check signatures with; by default the one of
    /// LEDGER_LOG_SIGNING_KEY_FILE.
    #[arg(long)]
    pub vkey: Option<String>,
    /// Also check every checkpoint published to the JetStream checkpoint stream (by `serve` or
    /// `up` with --nats), read back from the NATS server of --nats.
    #[arg(long)]
    pub from_stream: bool,
    // The NATS server and the checkpoint stream of --from-stream.
    #[command(flatten)]
    pub nats: NatsServer,
    #[command(flatten)]
    pub checkpoint_stream: CheckpointStream,
    /// Under a cell map: the cell whose log to verify (its database from the map, the key of
    /// LEDGER_LOG_SIGNING_KEY_FILE's identity for that cell, its subject on the stream).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub cell: Option<u16>,
    #[command(flatten)]
    pub cell_map: CellFlags,
    #[command(flatten)]
    pub database: DatabaseFlags,
    #[command(flatten)]
    pub log: LogFlags,
}

#[derive(Debug, Args)]
pub struct LogKeyArgs {
    /// Write a new signing key to this file (mode 0600; refused if it exists) and print its
    /// verifier key.
    #[arg(long)]
    pub generate: Option<PathBuf>,
    /// The new key's name: the log's origin (with --generate).
    #[arg(long, requires = "generate")]
    pub origin: Option<String>,
    #[command(flatten)]
    pub log: LogFlags,
}

impl LogCommand {
    /// The settings this command declared, with the global `OTEL_*` ones.
    pub fn flags(&self, otel: &OtelFlags) -> Flags {
        let flags = Flags {
            otel: otel.clone(),
            ..Flags::default()
        };
        match self {
            LogCommand::Verify(args) => Flags {
                cells: args.cell_map.clone(),
                database: args.database.clone(),
                log: args.log.clone(),
                ..flags
            },
            LogCommand::Log(LogSubcommand::ExportCheckpoints { database, .. }) => Flags {
                database: database.clone(),
                ..flags
            },
            LogCommand::LogKey(args) => Flags {
                log: args.log.clone(),
                ..flags
            },
        }
    }
}

/// Runs one of the log's commands.
pub async fn run(command: LogCommand, settings: &Settings) -> anyhow::Result<()> {
    match command {
        LogCommand::Verify(args) => {
            let code = match verify_command(args, settings).await {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(e) => {
                    eprintln!("ledger verify cannot run: {e:#}");
                    VERIFY_EXIT_CANNOT_RUN
                }
            };
            std::process::exit(code)
        }
        LogCommand::Log(LogSubcommand::ExportCheckpoints { file, .. }) => {
            export(&file, settings).await
        }
        LogCommand::LogKey(args) => log_key(args, settings),
    }
}

/// The follower's configuration: `None` without a signing key (the log is then not kept).
pub(crate) fn follower_config(settings: &Settings) -> anyhow::Result<Option<FollowerConfig>> {
    let Some(path) = key_path(settings) else {
        tracing::warn!("LEDGER_LOG_SIGNING_KEY_FILE is unset: the tamper-evident log is not kept");
        return Ok(None);
    };
    Ok(Some(FollowerConfig {
        signer: read_signer(path)?,
        checkpoint_events: settings.log.checkpoint_events,
        checkpoint_interval: settings.log.checkpoint_interval,
    }))
}

/// The follower's configuration for cell `cell` of a cell map: the configured key's identity
/// for that cell (`<origin>/cell/<N>`, a key derived for it: `tlog::Signer::for_cell`).
pub(crate) fn of_cell(
    config: Option<FollowerConfig>,
    cell: u16,
) -> anyhow::Result<Option<FollowerConfig>> {
    config
        .map(|c| {
            let signer = c
                .signer
                .for_cell(cell)
                .map_err(|e| anyhow!("the log signing key for cell {cell}: {e}"))?;
            Ok(FollowerConfig { signer, ..c })
        })
        .transpose()
}

/// Where the follower's checkpoints are published: with a signing key and a NATS server, the
/// checkpoint stream, on the subject of `cell` (`None` without a cell map). The event stream is
/// refused: the checkpoints have a stream of their own.
pub(crate) fn checkpoint_target(
    relay: Option<&relay::RelayConfig>,
    log: Option<&FollowerConfig>,
    cell: Option<u16>,
) -> anyhow::Result<Option<relay::checkpoints::CheckpointTarget>> {
    let (Some(relay), Some(_)) = (relay, log) else {
        return Ok(None);
    };
    if relay.checkpoint_stream == relay.stream {
        bail!(
            "the checkpoint stream must not be the event stream ({}): give another \
             --checkpoint-stream",
            relay.stream
        );
    }
    Ok(Some(relay::checkpoints::CheckpointTarget {
        nats_url: relay.nats_url.clone(),
        stream: relay.checkpoint_stream.clone(),
        subject: relay::checkpoints::subject(cell),
    }))
}

/// The checkpoints of the JetStream checkpoint stream, for `ledger verify --from-stream`.
async fn read_stream(args: &VerifyArgs, cell: Option<u16>) -> anyhow::Result<Vec<OutsideNote>> {
    let url = args
        .nats
        .url()
        .context("--from-stream needs --nats URL or LEDGER_NATS_URL")?;
    let subject = relay::checkpoints::subject(cell);
    let notes = relay::checkpoints::read_back(url, &args.checkpoint_stream.name, &subject)
        .await
        .with_context(|| {
            format!(
                "read the checkpoints of stream {}",
                args.checkpoint_stream.name
            )
        })?;
    Ok(notes
        .into_iter()
        .map(|n| OutsideNote {
            source: format!(
                "stream {} sequence {}",
                args.checkpoint_stream.name, n.sequence
            ),
            note: n.note,
        })
        .collect())
}

/// `settings` with the data dir's signing key (generated there if missing) unless a key file
/// was configured: what `ledger up` serves with.
pub(crate) fn with_data_dir_key(settings: &Settings, data_dir: &Path) -> anyhow::Result<Settings> {
    let mut settings = settings.clone();
    if key_path(&settings).is_none() {
        let path = data_dir.join(LOG_KEY_FILE);
        let tag: String = random_seed()?[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let origin = format!("ledger.localhost/{tag}");
        generate_key(&path, &origin).or_else(|e| match e.downcast_ref::<std::io::Error>() {
            Some(io) if io.kind() == ErrorKind::AlreadyExists => Ok(String::new()),
            _ => Err(e),
        })?;
        settings.log.signing_key_file = Some(path);
    }
    Ok(settings)
}

/// The configured signing key file; an empty variable counts as unset.
fn key_path(settings: &Settings) -> Option<&Path> {
    settings.log.signing_key_file.as_deref()
}

fn random_seed() -> anyhow::Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut seed)
        .context("read random bytes from the OS")?;
    Ok(seed)
}

/// Writes a new signing key named `origin` to `path` (created, mode 0600, synced); returns its
/// verifier key. An existing file is an `AlreadyExists` error, never overwritten.
fn generate_key(path: &Path, origin: &str) -> anyhow::Result<String> {
    let signer = Signer::from_seed(origin, random_seed()?)
        .map_err(|e| anyhow!("log origin {origin:?}: {e}"))?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(format!("{}\n", signer.to_skey()).as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(signer.verifier().to_vkey())
}

fn read_signer(path: &Path) -> anyhow::Result<Signer> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read the log signing key {}", path.display()))?;
    Signer::parse(&text).map_err(|e| anyhow!("the log signing key {}: {e}", path.display()))
}

/// The verifier: `--vkey`, or the configured signing key's (its identity for `cell`, if given).
fn verifier(
    vkey: Option<&str>,
    settings: &Settings,
    cell: Option<u16>,
) -> anyhow::Result<Verifier> {
    match (vkey, key_path(settings)) {
        (Some(v), _) => Verifier::parse(v).map_err(|e| anyhow!("--vkey: {e}")),
        (None, Some(path)) => {
            let signer = read_signer(path)?;
            let signer = match cell {
                Some(cell) => signer
                    .for_cell(cell)
                    .map_err(|e| anyhow!("the key for cell {cell}: {e}"))?,
                None => signer,
            };
            Ok(signer.verifier())
        }
        (None, None) => bail!("give --vkey or LEDGER_LOG_SIGNING_KEY_FILE"),
    }
}

/// The database whose log is verified: cell `cell`'s under a cell map, else `DATABASE_URL`'s.
async fn log_database(settings: &Settings, cell: Option<u16>) -> anyhow::Result<sqlx::PgPool> {
    let (Some(cell), Some(map)) = (cell, &settings.cells) else {
        return settings.database.pool(2).await;
    };
    let id = cells::CellId::new(cell.into()).context("a cell id")?;
    let spec = map
        .cell(id)
        .with_context(|| format!("the cell map has no cell {cell}"))?;
    schema::prepare_with(&spec.database_url, 2, settings.database.liveness).await
}

fn log_key(args: LogKeyArgs, settings: &Settings) -> anyhow::Result<()> {
    let vkey = match &args.generate {
        Some(path) => {
            let origin = args
                .origin
                .as_deref()
                .context("--generate needs --origin")?;
            generate_key(path, origin).with_context(|| format!("create {}", path.display()))?
        }
        None => verifier(None, settings, None)?.to_vkey(),
    };
    println!("{vkey}");
    Ok(())
}

async fn export(file: &Path, settings: &Settings) -> anyhow::Result<()> {
    let pool = settings.database.pool(2).await?;
    let all = tlog_follower::proofs::all_checkpoints(&pool).await?;
    let mut out = String::new();
    for (size, note) in &all {
        out.push_str(&serde_json::json!({ "size": size, "note": note }).to_string());
        out.push('\n');
    }
    std::fs::write(file, out).with_context(|| format!("write {}", file.display()))?;
    println!("{} checkpoints written to {}", all.len(), file.display());
    Ok(())
}

/// Reads the notes of an export file.
fn read_outside(path: &Path) -> anyhow::Result<Vec<OutsideNote>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(n, line)| {
            let value: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{} line {}: not JSON", path.display(), n + 1))?;
            let note = value["note"]
                .as_str()
                .with_context(|| format!("{} line {}: no note", path.display(), n + 1))?;
            Ok(OutsideNote {
                source: format!("{} line {}", path.display(), n + 1),
                note: note.to_owned(),
            })
        })
        .collect()
}

/// `ledger verify`: prints what was checked and `Ok(true)` when everything holds.
async fn verify_command(args: VerifyArgs, settings: &Settings) -> anyhow::Result<bool> {
    let verifier = verifier(args.vkey.as_deref(), settings, args.cell)?;
    let mut outside = Vec::new();
    for path in &args.checkpoints {
        outside.extend(read_outside(path)?);
    }
    let from_files = outside.len();
    if args.from_stream {
        outside.extend(read_stream(&args, args.cell).await?);
        println!(
            "{} checkpoints read back from stream {}",
            outside.len() - from_files,
            args.checkpoint_stream.name
        );
    }
    let pool = log_database(settings, args.cell).await?;
    // indicatif draws only on a terminal, so piped output stays clean.
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("verifying {pos} entries ({per_sec})")
            .expect("a valid template"),
    );
    let report = verify(&pool, &verifier, &outside, |n| bar.set_position(n)).await?;
    bar.finish_and_clear();
    println!(
        "read {} entries; tree of {}; {} stored and {} outside checkpoints; deposits held to \
         their entries: {}; moves and added cells held to their entries: {}; key {}",
        report.entries,
        report.tree_size,
        report.stored_checkpoints,
        report.outside_checkpoints,
        report.deposits,
        report.map_facts,
        verifier.to_vkey()
    );
    match report.finding {
        None => {
            println!("the log verifies");
            Ok(true)
        }
        Some(f) => {
            println!("VERIFY FAILED at {f}");
            Ok(false)
        }
    }
}
