//! The `ledger` command line: its subcommands and their arguments, the settings read once before
//! any of them runs, and the small commands (`token`, `migrate`, `audit`); the serving commands
//! `up` and `serve` are `serve.rs`, the relay's `relay_cli.rs`, the replay's `replay.rs`, and the
//! hidden `spot-core` (used by `up` when no spot-core binary is installed beside `ledger`) is
//! spot-core's own.

use std::path::PathBuf;
use std::time::Duration;

use crate::config;
use adapters::SpotAdapter;
use anyhow::{anyhow, Context};
use clap::{Args, Parser, Subcommand};
use domain::UserId;
use edge::auth::mint;

use crate::settings::options::{spot_address, Millis};
use crate::settings::{
    DatabaseFlags, DatabaseSettings, Flags, OtelFlags, SecretFlags, SecretSettings, Settings,
};
use crate::spot_child::SPOT_TOKEN_FILE;

#[derive(Debug, Parser)]
#[command(
    name = "ledger",
    version,
    about = "Event-sourced internal-transfer ledger"
)]
pub struct Cli {
    /// The `OTEL_*` settings, which every command reads (global). The other settings are the
    /// groups each command declares for itself (`settings/flags.rs`), so each `--help` lists
    /// only what that command reads; [`Command::flags`] gathers them, and they are read once
    /// into `Settings` before the command runs.
    #[command(flatten)]
    pub otel: OtelFlags,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole stack here: database (created if missing), migrations, spot-core as a child
    /// process, the API and the process manager; prints ready-to-use tokens.
    Up(crate::serve::UpArgs),
    /// Run the API and the process manager against an existing database and spot-core; several
    /// may run against one database. Needs LEDGER_JWT_SECRET.
    Serve(crate::serve::ServeArgs),
    /// Print a token minted with LEDGER_JWT_SECRET or the data dir's stored secret.
    Token(TokenArgs),
    /// Apply the database migrations and exit.
    Migrate(MigrateArgs),
    /// Rebuild every projection from the event log into fresh tables and report whether they
    /// equal the live ones; or show one transfer / one user's balances as of a position or time.
    Replay(crate::replay::ReplayArgs),
    /// Publish every feed event to a NATS JetStream stream, exactly once and in order; several
    /// may run, one publishes (docs/adr/0005-relay.md).
    Relay(crate::relay_cli::RelayArgs),
    /// Print the JetStream stream's events as JSON lines (a pull consumer).
    Tail(crate::relay_cli::TailArgs),
    /// Run the conservation check now and print its JSON report: incremental from the
    /// stored checkpoint (which it advances), or `--full` from the start of history. Exit 0 when
    /// money is conserved, 1 on a violation (transfers are then halted), 2 when it cannot run.
    Audit(AuditArgs),
    #[command(flatten)]
    Log(crate::log_cli::LogCommand),
    /// The operator's commands over a cell map (ADR 0023): `plan` prints the partition moves
    /// that would even the cells out; `move`, `moves` and `cancel` run them.
    #[command(subcommand)]
    Cells(crate::cells_cli::CellsCommand),
    /// Run the spot-core engine in this process.
    #[command(name = "spot-core", hide = true)]
    SpotCore(Box<spot_core::Args>),
}

impl Command {
    /// The settings this command declared (the groups it does not take at their defaults),
    /// with the global `OTEL_*` ones.
    pub fn flags(&self, otel: &OtelFlags) -> Flags {
        let flags = Flags {
            otel: otel.clone(),
            ..Flags::default()
        };
        match self {
            Command::Up(args) => Flags {
                pg_search: args.pg_search.clone(),
                ..Flags::serving(&args.settings, otel)
            },
            Command::Serve(args) => Flags::serving(&args.settings, otel),
            Command::Token(args) => Flags {
                secrets: args.secrets.clone(),
                ..flags
            },
            Command::Migrate(args) => Flags {
                database: args.database.clone(),
                ..flags
            },
            Command::Replay(args) => Flags {
                database: args.database.clone(),
                ..flags
            },
            Command::Relay(args) => Flags {
                cells: args.cell_map.clone(),
                database: args.database.clone(),
                ..flags
            },
            Command::Tail(args) => Flags {
                cells: args.cell_map.clone(),
                ..flags
            },
            Command::Audit(args) => Flags {
                database: args.database.clone(),
                secrets: args.secrets.clone(),
                ..flags
            },
            Command::Log(command) => command.flags(otel),
            Command::Cells(command) => command.flags(flags),
            Command::SpotCore(_) => flags,
        }
    }
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseFlags,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Check from the start of history instead of the stored checkpoint (stores nothing).
    #[arg(long)]
    pub full: bool,
    /// The spot-core to read (HOST:PORT).
    #[arg(long, value_parser = spot_address)]
    pub spot_url: String,
    /// A `ledger up` data dir whose spot-core token to use when LEDGER_SPOT_CORE_TOKEN is unset.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// How long one spot-core call may take.
    #[arg(long = "spot-timeout-ms", default_value_t = Millis(config::SPOT_TIMEOUT_DEFAULT))]
    pub spot_timeout: Millis,
    #[command(flatten)]
    pub database: DatabaseFlags,
    #[command(flatten)]
    pub secrets: SecretFlags,
}

/// `ledger audit`'s exit status when the check cannot run.
pub(crate) const AUDIT_EXIT_CANNOT_RUN: i32 = 2;

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The user id the token speaks for (`sub`).
    #[arg(long)]
    pub user: u64,
    /// Add `role: "admin"`.
    #[arg(long)]
    pub admin: bool,
    /// Lifetime in seconds (at most 30 days: the API refuses tokens valid for longer).
    #[arg(long, default_value_t = config::TOKEN_TTL_DEFAULT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=edge::auth::TOKEN_LIFETIME_MAX.as_secs()))]
    pub ttl_secs: u64,
    /// The data dir whose stored secret to use when LEDGER_JWT_SECRET is unset.
    #[arg(long, default_value = "./.ledger")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub secrets: SecretFlags,
}

/// Logs go to stderr, filtered by RUST_LOG (default `info`), so stdout carries only what a
/// command prints for its user (tokens, the ready line); with `traces`, spans are exported over
/// OTLP too, as long as the returned guard lives (`docs/adr/0018-traces.md`).
pub fn init_tracing(
    traces: Option<&telemetry::Export>,
) -> anyhow::Result<Option<telemetry::Guard>> {
    telemetry::init(traces).map_err(anyhow::Error::msg)
}

/// Runs one command to completion, with the settings read once first; a setting that does not
/// parse stops every command (`ledger audit` with its "cannot run" status). The engine run
/// in-process (`ledger spot-core`) reports its own spans, as `spot-core`.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = Settings::from_flags(&cli.command.flags(&cli.otel));
    let _traces = match (&cli.command, &settings) {
        (Command::SpotCore(args), _) => spot_core::init_tracing_with(args)?,
        (_, Ok(settings)) => init_tracing(settings.traces.as_ref())?,
        (_, Err(_)) => init_tracing(None)?,
    };
    match cli.command {
        Command::Audit(args) => {
            let checked = match settings {
                Ok(settings) => audit(args, &settings).await,
                Err(e) => Err(e),
            };
            let code = match checked {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(e) => {
                    eprintln!("the conservation check cannot run: {e:#}");
                    AUDIT_EXIT_CANNOT_RUN
                }
            };
            std::process::exit(code)
        }
        command => run_command(command, settings?).await,
    }
}

async fn run_command(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Up(args) if args.ha => match args.cells {
            Some(count) => crate::ha_up::up_cells(args, &settings, count).await,
            None => crate::ha_up::up(args, &settings).await,
        },
        Command::Up(args) => match crate::cellular::up_map(args.cells, &settings)? {
            Some(map) => crate::cellular::up(args, &settings, map).await,
            None => crate::serve::up(args, &settings).await,
        },
        Command::Serve(args) => match &settings.cells {
            Some(map) => crate::cellular::serve(args, &settings, map).await,
            None => crate::serve::serve(args, &settings).await,
        },
        Command::Token(args) => token(args, &settings.secrets),
        Command::Migrate(_) => migrate(&settings.database).await,
        Command::Replay(args) => crate::replay::run(args, &settings.database).await,
        Command::Relay(args) => crate::relay_cli::relay(args, &settings).await,
        Command::Tail(args) => crate::relay_cli::tail(args, settings.cells.as_ref()).await,
        Command::Audit(_) => unreachable!("`run` answers `ledger audit` itself"),
        Command::SpotCore(args) => spot_core::run(*args).await,
        Command::Log(command) => crate::log_cli::run(command, &settings).await,
        Command::Cells(command) => crate::cells_cli::run(command, &settings).await,
    }
}

/// `ledger audit`: runs the check like the admin route does (recorded, halting on a violation),
/// prints the report; `Ok(ok)`.
async fn audit(args: AuditArgs, settings: &Settings) -> anyhow::Result<bool> {
    let token = match (&settings.secrets.spot_core_token, &args.data_dir) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(dir)) => {
            let path = dir.join(SPOT_TOKEN_FILE);
            match std::fs::read_to_string(&path) {
                Ok(text) => Some(text.trim().to_owned()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
            }
        }
        (None, None) => None,
    };
    let spot = SpotAdapter::with_token(args.spot_url, args.spot_timeout.0, token);
    let pool = settings.database.pool(2).await?;
    let ledger = adapters::pg::ledger(pool, spot, domain::AssetRegistry::default_assets());
    let mode = if args.full {
        application::audit::Mode::Full
    } else {
        application::audit::Mode::Incremental
    };
    let (report, halted) = ledger
        .audit(mode)
        .await
        .map_err(|e| anyhow!(application::error_chain(&e)))?;
    let mut body = serde_json::to_value(&report)?;
    body["halted"] = serde_json::json!(halted);
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(report.ok)
}

async fn migrate(database: &DatabaseSettings) -> anyhow::Result<()> {
    let pool = schema::prepare(&database.url, 2).await?;
    pool.close().await;
    println!(
        "migrations applied to {}",
        config::redact_url(&database.url)
    );
    Ok(())
}

fn token(args: TokenArgs, secrets: &SecretSettings) -> anyhow::Result<()> {
    let user = UserId::new(args.user).map_err(|_| anyhow!("--user must be a positive integer"))?;
    let secret = match secrets.jwt.clone() {
        Some(secret) => secret,
        None => config::secret_from_file(&args.data_dir)?.with_context(|| {
            format!(
                "no secret: set {} or run `ledger up --data-dir {}` once to generate one",
                config::JWT_SECRET_ENV,
                args.data_dir.display()
            )
        })?,
    };
    println!(
        "{}",
        mint(
            &secret.bytes,
            user,
            args.admin,
            Duration::from_secs(args.ttl_secs)
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn up_passes_spot_storage_settings_to_its_child_only_when_set() {
        use clap::Parser;
        let cli = Cli::try_parse_from(["ledger", "up"]).unwrap();
        let Command::Up(args) = cli.command else {
            panic!("not up")
        };
        assert!(args.spot_storage.args().is_empty(), "spot-core's defaults");
        let cli = Cli::try_parse_from([
            "ledger",
            "up",
            "--spot-snapshot-every-records",
            "300",
            "--spot-segment-bytes",
            "65536",
            "--spot-archive-dir",
            "/tmp/archive",
        ])
        .unwrap();
        let Command::Up(args) = cli.command else {
            panic!("not up")
        };
        let given: Vec<String> = args
            .spot_storage
            .args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            given,
            [
                "--snapshot-every-records",
                "300",
                "--segment-bytes",
                "65536",
                "--archive-dir",
                "/tmp/archive"
            ]
        );
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn up_has_local_defaults() {
        let cli = Cli::try_parse_from(["ledger", "up"]).unwrap();
        let Command::Up(args) = cli.command else {
            panic!("not up");
        };
        assert_eq!(args.listen, "127.0.0.1:8080");
        assert_eq!(args.data_dir, PathBuf::from("./.ledger"));
        assert!(args.spot_url.is_none());
    }

    #[test]
    fn serve_requires_a_spot_url() {
        assert!(Cli::try_parse_from(["ledger", "serve"]).is_err());
        assert!(Cli::try_parse_from(["ledger", "serve", "--spot-url", "127.0.0.1:7001"]).is_ok());
        // Under a cell map each cell's spot-core is in the map (`--cell-map` after `serve`, or
        // LEDGER_CELL_MAP).
        assert!(Cli::try_parse_from(["ledger", "serve", "--cell-map", "c.toml"]).is_ok());
    }

    #[test]
    fn up_takes_a_number_of_cells_but_not_with_a_spot_url() {
        let cli = Cli::try_parse_from(["ledger", "up", "--cells", "3"]).unwrap();
        let Command::Up(args) = cli.command else {
            panic!("not up");
        };
        assert_eq!(args.cells, Some(3));
        assert!(
            Cli::try_parse_from(["ledger", "up", "--cells", "3", "--spot-url", "h:1"]).is_err()
        );
    }

    #[test]
    fn token_takes_user_admin_and_ttl() {
        let cli = Cli::try_parse_from([
            "ledger",
            "token",
            "--user",
            "5",
            "--admin",
            "--ttl-secs",
            "60",
        ])
        .unwrap();
        let Command::Token(args) = cli.command else {
            panic!("not token");
        };
        assert_eq!((args.user, args.admin, args.ttl_secs), (5, true, 60));
    }

    /// The long help of subcommand `path` (`["log", "export-checkpoints"]`).
    fn help_of(path: &[&str]) -> String {
        let mut command = Cli::command();
        command.build();
        let mut sub = &mut command;
        for name in path {
            sub = sub.find_subcommand_mut(name).expect("a subcommand");
        }
        sub.render_long_help().to_string()
    }

    #[test]
    fn each_subcommand_shows_only_the_settings_it_reads() {
        let server_only = [
            "--rate-per-second",
            "--recovery-stale-ms",
            "--http-connections-max",
            "--metrics-listen",
        ];
        for path in [
            &["verify"][..],
            &["token"],
            &["migrate"],
            &["replay"],
            &["relay"],
            &["tail"],
            &["audit"],
            &["log-key"],
            &["log", "export-checkpoints"],
        ] {
            let help = help_of(path);
            for flag in server_only {
                assert!(!help.contains(flag), "{path:?} shows {flag}:\n{help}");
            }
            // Every command reports traces.
            assert!(help.contains("--otel-exporter-otlp-endpoint"), "{path:?}");
        }
        for path in [["serve"], ["up"]] {
            let help = help_of(&path);
            for flag in server_only {
                assert!(help.contains(flag), "{path:?} lacks {flag}");
            }
        }
        assert!(help_of(&["up"]).contains("--pg-default-addr"));
        assert!(!help_of(&["serve"]).contains("--pg-default-addr"));
        assert!(!help_of(&["tail"]).contains("--database-url"));
        assert!(help_of(&["tail"]).contains("--cell-map"));
        assert!(help_of(&["migrate"]).contains("--database-url"));
        assert!(!help_of(&["migrate"]).contains("--cell-map"));
        assert!(help_of(&["log-key"]).contains("--log-signing-key-file"));
        assert!(!help_of(&["log-key"]).contains("--database-url"));
    }

    #[test]
    fn a_subcommands_settings_reach_its_flags() {
        let cli = Cli::try_parse_from([
            "ledger",
            "serve",
            "--spot-url",
            "127.0.0.1:7001",
            "--rate-per-second",
            "3",
            "--database-url",
            "postgres://h/d",
        ])
        .unwrap();
        let flags = cli.command.flags(&cli.otel);
        assert_eq!(flags.server.rate_per_second.as_deref(), Some("3"));
        assert_eq!(
            flags.database.database_url.as_deref(),
            Some("postgres://h/d")
        );
        // A setting of another command's is no flag of this one.
        assert!(Cli::try_parse_from(["ledger", "tail", "--rate-per-second", "3"]).is_err());
    }
}
