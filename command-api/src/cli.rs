//! The `ledger` command line: `up` (the whole stack, spot-core as a child process), `serve` (API
//! and process manager only), `token`, `migrate`, and the hidden `spot-core` used by `up` when no
//! spot-core binary is installed beside `ledger`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use adapters::SpotAdapter;
use anyhow::{anyhow, bail, Context};
use clap::{Args, Parser, Subcommand};
use domain::UserId;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdin, Command as ChildCommand};

use crate::app::serve_with_shutdown;
use crate::auth::mint;
use crate::config::{self, JwtSecret, SecretSource};
use crate::settings::{MetricsListen, Settings};
use crate::startup::{shutdown_signal, Background, Serving};
use crate::state::AppState;

/// The line spot-core prints on stdout once it accepts connections.
pub(crate) const SPOT_READY_PREFIX: &str = "spot-core listening on ";

/// The file in `ledger up`'s data dir holding the token shared with its spot-core child.
pub(crate) const SPOT_TOKEN_FILE: &str = "spot.token";

#[derive(Debug, Parser)]
#[command(
    name = "ledger",
    version,
    about = "Event-sourced internal-transfer ledger"
)]
pub struct Cli {
    /// Everything configurable, from flags or the environment (see `settings.rs`).
    #[command(flatten)]
    pub settings: Settings,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole stack here: database (created if missing), migrations, spot-core as a child
    /// process, the API and the process manager; prints ready-to-use tokens.
    Up(UpArgs),
    /// Run the API and the process manager against an existing database and spot-core; several
    /// may run against one database. Needs LEDGER_JWT_SECRET.
    Serve(ServeArgs),
    /// Print a token minted with LEDGER_JWT_SECRET or the data dir's stored secret.
    Token(TokenArgs),
    /// Apply the database migrations and exit.
    Migrate,
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
    /// Run the spot-core engine in this process.
    #[command(name = "spot-core", hide = true)]
    SpotCore(spot_core::Args),
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Address the API listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Where the JWT secret and spot-core's data live.
    #[arg(long, default_value = "./.ledger")]
    pub data_dir: PathBuf,
    /// A spot-core already running (HOST:PORT); when absent one is started as a child process.
    #[arg(long)]
    pub spot_url: Option<String>,
    /// Asset configuration (JSON array); the shipped default when absent.
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// How long one spot-core call may take before its outcome counts as unknown.
    #[arg(long, default_value_t = config::SPOT_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub spot_timeout_ms: u64,
    /// The event relay to NATS JetStream, run in-process when `--nats` is given.
    #[command(flatten)]
    pub relay: crate::relay_cli::RelayOptions,
    /// Passed to the spot-core child: its snapshot and WAL settings.
    #[command(flatten)]
    pub spot_storage: SpotStorage,
}

/// The spot-core child's storage settings `ledger up` passes through (spot-core's own flags of
/// the same names without `spot-`); each is left to spot-core's default when unset.
#[derive(Debug, Clone, Default, Args)]
pub struct SpotStorage {
    /// A snapshot every this many WAL records (0: never).
    #[arg(long, env = "LEDGER_SPOT_SNAPSHOT_EVERY_RECORDS")]
    pub spot_snapshot_every_records: Option<u64>,
    /// Bytes of one WAL segment.
    #[arg(long, env = "LEDGER_SPOT_SEGMENT_BYTES")]
    pub spot_segment_bytes: Option<u64>,
    /// Where compacted WAL segments are moved instead of deleted.
    #[arg(long, env = "LEDGER_SPOT_ARCHIVE_DIR")]
    pub spot_archive_dir: Option<PathBuf>,
}

impl SpotStorage {
    /// spot-core's flags for these settings.
    fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        if let Some(n) = self.spot_snapshot_every_records {
            args.push("--snapshot-every-records".into());
            args.push(n.to_string().into());
        }
        if let Some(n) = self.spot_segment_bytes {
            args.push("--segment-bytes".into());
            args.push(n.to_string().into());
        }
        if let Some(dir) = &self.spot_archive_dir {
            args.push("--archive-dir".into());
            args.push(dir.clone().into_os_string());
        }
        args
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// The spot-core to use (HOST:PORT).
    #[arg(long)]
    pub spot_url: String,
    /// Asset configuration (JSON array); the shipped default when absent.
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// How long one spot-core call may take before its outcome counts as unknown.
    #[arg(long, default_value_t = config::SPOT_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub spot_timeout_ms: u64,
    /// The event relay to NATS JetStream, run in-process when `--nats` is given.
    #[command(flatten)]
    pub relay: crate::relay_cli::RelayOptions,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Check from the start of history instead of the stored checkpoint (stores nothing).
    #[arg(long)]
    pub full: bool,
    /// The spot-core to read (HOST:PORT).
    #[arg(long)]
    pub spot_url: String,
    /// A `ledger up` data dir whose spot-core token to use when LEDGER_SPOT_CORE_TOKEN is unset.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// How long one spot-core call may take.
    #[arg(long, default_value_t = config::SPOT_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub spot_timeout_ms: u64,
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
          value_parser = clap::value_parser!(u64).range(1..=crate::auth::TOKEN_LIFETIME_MAX.as_secs()))]
    pub ttl_secs: u64,
    /// The data dir whose stored secret to use when LEDGER_JWT_SECRET is unset.
    #[arg(long, default_value = "./.ledger")]
    pub data_dir: PathBuf,
}

/// Logs go to stderr, filtered by RUST_LOG (default `info`), so stdout carries only what a
/// command prints for its user (tokens, the ready line).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // try_init: a second initialisation (an engine run in-process that sets up its own) is not
    // an error worth dying for.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs one command to completion.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = cli.settings;
    match cli.command {
        Command::Up(args) => up(args, &settings).await,
        Command::Serve(args) => serve(args, &settings).await,
        Command::Token(args) => token(args, &settings),
        Command::Migrate => migrate(&settings).await,
        Command::Replay(args) => crate::replay::run(args, &settings).await,
        Command::Relay(args) => crate::relay_cli::relay(args, &settings).await,
        Command::Tail(args) => crate::relay_cli::tail(args).await,
        Command::Audit(args) => {
            let code = match audit(args, &settings).await {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(e) => {
                    eprintln!("the conservation check cannot run: {e:#}");
                    AUDIT_EXIT_CANNOT_RUN
                }
            };
            std::process::exit(code)
        }
        Command::SpotCore(args) => spot_core::run(args).await,
    }
}

/// The application state with everything the settings configure (limits, the fail point, the
/// idempotency retention), and how to serve it: the recovery worker, the conservation check's
/// interval, the idempotency horizon, the HTTP limits, where `/metrics` is served, and the relay
/// when `relay` is given.
fn configured(
    settings: &Settings,
    pool: sqlx::PgPool,
    spot: SpotAdapter,
    assets: domain::AssetRegistry,
    secret: &JwtSecret,
    relay: Option<relay::RelayConfig>,
) -> anyhow::Result<(AppState, Serving)> {
    let horizon = settings.horizon()?;
    let mut state = AppState::new(pool, spot, assets, &secret.bytes);
    state.ledger = state
        .ledger
        .with_idempotency_retention(horizon.retention)
        .with_bulk_max(
            settings
                .bulk_transfers_max
                .unwrap_or(application::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT),
        );
    let state = state
        .with_watched_limits(settings.limits()?, settings.frequency()?)
        .with_failpoints(settings.failpoints());
    let serving = Serving {
        background: Background {
            recovery: Some(settings.recovery()),
            audit_interval: settings.audit_interval(),
            relay,
            horizon: Some(horizon),
        },
        http: settings.http_limits()?,
        metrics_on_api: settings.metrics_listen() == MetricsListen::Api,
    };
    Ok((state, serving))
}

/// `ledger audit`: runs the check like the admin route does (recorded, halting on a violation),
/// prints the report; `Ok(ok)`.
async fn audit(args: AuditArgs, settings: &Settings) -> anyhow::Result<bool> {
    let token = match (settings.spot_core_token()?, &args.data_dir) {
        (Some(token), _) => Some(token),
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
    let spot = SpotAdapter::with_token(
        config::spot_addr(&args.spot_url)?,
        Duration::from_millis(args.spot_timeout_ms),
        token,
    );
    let pool = settings.pool(2).await?;
    let ledger = application::Ledger::new(pool, spot, domain::AssetRegistry::default_assets());
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

async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let url = settings.database_url();
    let pool = schema::prepare(&url, 2).await?;
    pool.close().await;
    println!("migrations applied to {}", config::redact_url(&url));
    Ok(())
}

fn token(args: TokenArgs, settings: &Settings) -> anyhow::Result<()> {
    let user = UserId::new(args.user).map_err(|_| anyhow!("--user must be a positive integer"))?;
    let secret = match settings.jwt_secret()? {
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

async fn serve(args: ServeArgs, settings: &Settings) -> anyhow::Result<()> {
    let secret = settings.jwt_secret()?.with_context(|| {
        format!(
            "`ledger serve` needs {} (shared by every instance)",
            config::JWT_SECRET_ENV
        )
    })?;
    let assets = config::load_assets(args.assets.as_deref())?;
    let spot_addr = config::spot_addr(&args.spot_url)?;
    let pool = settings.pool(config::POOL_CONNECTIONS_MAX).await?;
    // Optional: a spot-core on loopback may run without a token.
    let spot = SpotAdapter::with_liveness(
        spot_addr.clone(),
        Duration::from_millis(args.spot_timeout_ms),
        settings.spot_core_token()?,
        settings.spot_liveness(),
    );
    // Serving while spot-core is down is allowed: transfers wait and the recovery worker retries.
    if let Err(e) = spot.ping().await {
        tracing::warn!(spot = %spot_addr, error = %e, "spot-core does not answer yet");
    }
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let (state, serving) = configured(settings, pool, spot, assets, &secret, args.relay.config())?;
    let metrics = bind_metrics(settings).await?;
    println!("ledger serving on http://{local} (spot-core at {spot_addr})");
    run_until_stopped(listener, metrics, state, serving, None).await
}

async fn up(args: UpArgs, settings: &Settings) -> anyhow::Result<()> {
    let assets = config::load_assets(args.assets.as_deref())?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let secret = config::secret_for_data_dir(settings.jwt_secret()?, &args.data_dir)?;
    // Kept until `up` returns: dropping it stops a private cluster.
    let (url, _private_pg) = crate::private_pg::database_for_up(
        settings.database_url.as_deref(),
        &settings.pg_search,
        &args.data_dir,
    )
    .await?;
    let pool =
        schema::prepare_with(&url, config::POOL_CONNECTIONS_MAX, settings.db_liveness()).await?;

    let timeout = Duration::from_millis(args.spot_timeout_ms);
    let (spot_addr, spot_token, child) = match &args.spot_url {
        Some(given) => (config::spot_addr(given)?, settings.spot_core_token()?, None),
        None => {
            let token_file = args.data_dir.join(SPOT_TOKEN_FILE);
            let token = stored_or_generated_spot_token(&token_file)?;
            let child = SpotChild::start(
                &args.data_dir.join("spot"),
                args.assets.as_deref(),
                &token_file,
                &args.spot_storage,
            )
            .await?;
            (child.addr.clone(), Some(token), Some(child))
        }
    };
    let spot = SpotAdapter::with_liveness(
        spot_addr.clone(),
        timeout,
        spot_token,
        settings.spot_liveness(),
    );
    spot.ping()
        .await
        .map_err(|e| anyhow!("spot-core at {spot_addr} does not answer: {e}"))?;

    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let (state, serving) = configured(settings, pool, spot, assets, &secret, args.relay.config())?;
    let metrics = bind_metrics(settings).await?;

    print_banner(&Banner {
        base: format!("http://{local}"),
        metrics: match &metrics {
            Some(l) => format!("http://{}/metrics", l.local_addr()?),
            None if serving.metrics_on_api => format!("http://{local}/metrics"),
            None => "not served (see the warning above)".to_owned(),
        },
        database: config::redact_url(&url),
        spot: match &child {
            Some(_) => format!(
                "{spot_addr} (child process, data in {})",
                args.data_dir.join("spot").display()
            ),
            None => format!("{spot_addr} (already running)"),
        },
        secret: &secret,
    });
    run_until_stopped(listener, metrics, state, serving, child).await
}

struct Banner<'a> {
    base: String,
    metrics: String,
    database: String,
    spot: String,
    secret: &'a JwtSecret,
}

fn print_banner(b: &Banner<'_>) {
    let ttl = config::TOKEN_TTL_DEFAULT;
    let hours = ttl.as_secs() / 3600;
    let user_one = UserId::new(1).expect("1 is a valid user id");
    let admin = mint(&b.secret.bytes, user_one, true, ttl);
    let user = mint(&b.secret.bytes, user_one, false, ttl);
    let secret_line = match &b.secret.source {
        SecretSource::Environment => format!("from {}", config::JWT_SECRET_ENV),
        SecretSource::StoredFile(path) => format!(
            "{} is unset; using the secret stored in {}",
            config::JWT_SECRET_ENV,
            path.display()
        ),
        SecretSource::GeneratedFile(path) => format!(
            "{} is unset; generated a random secret and stored it in {} (mode 0600)",
            config::JWT_SECRET_ENV,
            path.display()
        ),
    };
    let base = &b.base;
    println!("ledger is up");
    println!("  API:        {base}");
    println!("  metrics:    {}", b.metrics);
    println!("  database:   {}", b.database);
    println!("  spot-core:  {}", b.spot);
    println!("  JWT secret: {secret_line}");
    println!();
    println!("admin token (user 1, role admin, valid {hours} h):");
    println!("  {admin}");
    println!("user token (user 1, valid {hours} h):");
    println!("  {user}");
    println!();
    println!("try it:");
    println!("  export ADMIN_TOKEN={admin}");
    println!("  export USER_TOKEN={user}");
    println!(
        "  curl -s -X POST {base}/api/v1/admin/deposits -H \"Authorization: Bearer $ADMIN_TOKEN\" \
         -H 'Content-Type: application/json' \
         -d '{{\"user_id\":1,\"asset\":\"USDT\",\"amount\":\"100\",\"external_id\":\"demo-1\"}}'"
    );
    println!(
        "  curl -s -X POST {base}/api/v1/internal_transfer -H \"Authorization: Bearer $USER_TOKEN\" \
         -H 'Content-Type: application/json' \
         -d '{{\"from\":\"FUNDING\",\"to\":\"SPOT\",\"asset\":\"USDT\",\"amount\":\"25\"}}'"
    );
    println!("  curl -s {base}/api/v1/balances -H \"Authorization: Bearer $USER_TOKEN\"");
}

/// The line `ledger serve` and `ledger up` print on stdout when `/metrics` has its own address.
pub const METRICS_READY_PREFIX: &str = "ledger metrics on ";

/// Binds `/metrics`' own address, unless it is served on the API's (`api`). An address the
/// settings name must bind; the default one may be taken (another `ledger` on this host): every
/// figure but `ledger_spot_core_up` is read from the shared database, so that instance's
/// `/metrics` already reports them, and this one warns and serves none.
async fn bind_metrics(settings: &Settings) -> anyhow::Result<Option<TcpListener>> {
    let MetricsListen::Address { addr, explicit } = settings.metrics_listen() else {
        return Ok(None);
    };
    match TcpListener::bind(&addr).await {
        Ok(listener) => {
            println!(
                "{METRICS_READY_PREFIX}http://{}/metrics",
                listener.local_addr()?
            );
            Ok(Some(listener))
        }
        Err(e) if !explicit => {
            tracing::warn!(address = %addr, error = %e, "metrics not served: the default metrics address is taken; set --metrics-listen (LEDGER_METRICS_LISTEN)");
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("metrics listen on {addr}")),
    }
}

/// Serves the API with its background tasks (`startup.rs`, the recovery worker among them) until
/// ctrl-c or SIGTERM (or until the spot-core child dies: the stack is not whole without it), then
/// stops in order: no new requests, requests in progress finish (bounded), the background tasks
/// stop, the child is killed and reaped.
async fn run_until_stopped(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    state: AppState,
    serving: Serving,
    mut child: Option<SpotChild>,
) -> anyhow::Result<()> {
    // `/metrics` on its own address lives exactly as long as the API server.
    let metrics = metrics.map(|l| {
        let app = crate::metrics::app(state.clone(), serving.target_pending_alert_after());
        tokio::spawn(crate::http_server::serve(
            l,
            app,
            serving.http,
            std::future::pending(),
        ))
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(serve_with_shutdown(listener, state, serving, async move {
        let _ = stop_rx.await;
    }));

    let outcome = tokio::select! {
        () = shutdown_signal() => {
            tracing::info!("shutting down");
            Ok(())
        }
        ended = &mut server => Err(match ended {
            Ok(Ok(())) => anyhow!("the API server stopped unexpectedly"),
            Ok(Err(e)) => e.context("the API server failed"),
            Err(e) => anyhow!("the API server task ended abnormally: {e}"),
        }),
        status = child_exit(&mut child) => Err(anyhow!("spot-core exited unexpectedly ({status})")),
    };

    let _ = stop_tx.send(());
    if !server.is_finished()
        && tokio::time::timeout(config::SHUTDOWN_GRACE, &mut server)
            .await
            .is_err()
    {
        tracing::warn!("requests still in progress after the grace period; stopping anyway");
        server.abort();
    }
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    if let Some(child) = child {
        child.stop().await;
    }
    outcome
}

async fn child_exit(child: &mut Option<SpotChild>) -> String {
    match child {
        Some(c) => match c.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => format!("cannot wait for it: {e}"),
        },
        None => std::future::pending().await,
    }
}

/// A spot-core engine running as a child of `ledger up`.
struct SpotChild {
    child: Child,
    addr: String,
    /// The write end of the child's stdin, never written: when this process ends, however it
    /// ends, the kernel closes it and the child (`--exit-with-stdin`) stops too.
    _lifeline: ChildStdin,
    /// Copies the child's stdout to stderr (a full pipe would block the engine). Owned by the
    /// child: it ends with the pipe, and is aborted when this value is dropped.
    drain: tokio::task::JoinHandle<()>,
}

impl Drop for SpotChild {
    fn drop(&mut self) {
        self.drain.abort();
    }
}

impl SpotChild {
    /// The command that runs spot-core on an ephemeral port with these settings: the `spot-core`
    /// binary beside this executable if there is one, else this executable's hidden `spot-core`
    /// subcommand; its stdin and stdout piped, killed if dropped.
    fn command(
        data_dir: &Path,
        assets: Option<&Path>,
        token_file: &Path,
        storage: &SpotStorage,
    ) -> anyhow::Result<ChildCommand> {
        let exe = std::env::current_exe().context("locate the ledger executable")?;
        let beside = exe.with_file_name("spot-core");
        let mut command = if beside.is_file() {
            ChildCommand::new(&beside)
        } else {
            let mut c = ChildCommand::new(&exe);
            c.arg("spot-core");
            c
        };
        command
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--token-file")
            .arg(token_file)
            .arg("--exit-with-stdin")
            // The file is the one token; an inherited variable must not stand in for it.
            .env_remove(spot_core::TOKEN_ENV);
        if let Some(assets) = assets {
            command.arg("--assets").arg(assets);
        }
        command.args(storage.args());
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Any early return below (or a panic) must not leave an orphan engine running.
            .kill_on_drop(true);
        Ok(command)
    }

    /// Starts spot-core on an ephemeral port: the `spot-core` binary beside this executable if
    /// there is one, else this executable's hidden `spot-core` subcommand. Returns once the child
    /// has printed its ready line, or fails after [`config::SPOT_START_TIMEOUT`].
    async fn start(
        data_dir: &Path,
        assets: Option<&Path>,
        token_file: &Path,
        storage: &SpotStorage,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("create spot-core data dir {}", data_dir.display()))?;
        let mut command = Self::command(data_dir, assets, token_file, storage)?;
        let mut child = command.spawn().context("start spot-core")?;
        let lifeline = child
            .stdin
            .take()
            .context("spot-core's stdin was not captured")?;
        let stdout = child
            .stdout
            .take()
            .context("spot-core's stdout was not captured")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix(SPOT_READY_PREFIX) {
                    return Ok(addr.trim().to_owned());
                }
                eprintln!("spot-core: {line}");
            }
            bail!("spot-core exited before saying where it listens")
        };
        let addr = tokio::time::timeout(config::SPOT_START_TIMEOUT, ready)
            .await
            .map_err(|_| {
                anyhow!(
                    "spot-core did not say where it listens within {} s",
                    config::SPOT_START_TIMEOUT.as_secs()
                )
            })??;
        // Keep draining its stdout: a full pipe would block the engine.
        let drain = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("spot-core: {line}");
            }
        });
        tracing::info!(%addr, data_dir = %data_dir.display(), "spot-core child started");
        Ok(Self {
            child,
            addr,
            _lifeline: lifeline,
            drain,
        })
    }

    /// Kills the engine and reaps it. Killing is safe by design: spot-core acknowledges nothing
    /// before its WAL record is fsynced, and replays the WAL on the next start.
    async fn stop(mut self) {
        match self.child.kill().await {
            Ok(()) => tracing::info!("spot-core child stopped"),
            Err(e) => tracing::warn!(error = %e, "could not stop the spot-core child"),
        }
    }
}

/// The token `ledger up` shares with its spot-core child: the one stored in `path`, or a new
/// random one (32 bytes as 64 hex digits) stored there with mode 0600.
fn stored_or_generated_spot_token(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => {
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("make {} private", path.display()))?;
            }
            return Ok(text.trim().to_owned());
        }
        Ok(_) => std::fs::remove_file(path)
            .with_context(|| format!("remove empty {}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    }
    config::generate_secret_file(path)?
        .with_context(|| format!("{} was created by someone else meanwhile", path.display()))
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
    fn the_spot_token_is_generated_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ledger-spot-token-{}", ulid_like()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(SPOT_TOKEN_FILE);
        let token = stored_or_generated_spot_token(&path).unwrap();
        assert_eq!(token.len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(stored_or_generated_spot_token(&path).unwrap(), token);
        // spot-core reads the same file and gets the same token.
        let args = <spot_core::Args as clap::Parser>::try_parse_from([
            "spot-core".as_ref(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--data-dir".as_ref(),
            dir.as_os_str(),
            "--token-file".as_ref(),
            path.as_os_str(),
        ])
        .unwrap();
        assert_eq!(spot_core::resolve_token(&args).unwrap(), Some(token));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn ulid_like() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("{}-{nanos}", std::process::id())
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
}
