//! spot-core: the SPOT account engine (RAM balances made durable by a segmented, checksummed
//! WAL and periodic snapshots), served over TCP, plus the client and wire types other crates use
//! to talk to it.

pub mod assets;
pub mod client;
pub mod engine;
pub mod invariant;
pub mod journal;
pub mod partition;
pub mod protocol;
pub mod replica;
pub mod server;
pub mod snapshot;
pub mod storage;
pub mod traces;
pub mod ulid;
pub mod wal;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::net::TcpListener;

pub use client::{ClientError, SpotClient};
pub use protocol::{Request, Response};

use assets::Assets;
use engine::Engine;
use storage::FailPoints;
use wal::{EngineHandle, StorageOptions, Wal};

/// Command line of the `spot-core` binary (and of anything embedding it).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "spot-core",
    about = "SPOT account engine: RAM balances, durable WAL, newline-delimited JSON over TCP"
)]
pub struct Args {
    /// Address to listen on, e.g. 127.0.0.1:7400 (port 0 picks a free one).
    #[arg(long)]
    pub listen: String,
    /// Directory holding the WAL segments, snapshots and the LOCK file (created if missing).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Asset config JSON (the format of config/assets.json); the built-in default when absent.
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// File holding the shared token every connection must present in a `hello` first
    /// (surrounding whitespace ignored). Without it, the SPOT_CORE_TOKEN environment variable
    /// is used; with neither, there is no authentication and only loopback addresses are
    /// allowed.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Stop when standard input reaches its end. A parent that starts spot-core with a pipe on
    /// its stdin and never writes to it is then followed even when it is killed outright: the
    /// kernel closes the pipe, and no orphan engine keeps the port and the WAL.
    #[arg(long)]
    pub exit_with_stdin: bool,
    /// The shared token itself, when `--token-file` is absent (normally from `SPOT_CORE_TOKEN`).
    #[arg(long, env = TOKEN_ENV, hide = true, hide_env_values = true)]
    pub token: Option<String>,
    /// The cell this engine is (ADR 0017), 1 to 65535: a client whose `hello` names another
    /// cell is refused. Without it, any client is accepted (no cell map).
    #[arg(long, env = CELL_ID_ENV, value_parser = clap::value_parser!(u16).range(1..))]
    pub cell_id: Option<u16>,
    /// Crash-test hooks, comma-separated (normally from `SPOT_CORE_FAILPOINT`).
    #[arg(long, env = FailPoints::ENV, hide = true)]
    pub failpoints: Option<String>,
    /// Segments, snapshots and the archive.
    #[command(flatten)]
    pub storage: StorageOptions,
    /// Traces over OTLP (the standard `OTEL_*` variables).
    #[command(flatten)]
    pub traces: traces::TraceArgs,
    /// One of a cell's three replicas (docs/adr/0020-high-availability.md).
    #[command(flatten)]
    pub replica: replica::ReplicaArgs,
}

/// Environment variable holding the shared token when `--token-file` is absent.
pub const TOKEN_ENV: &str = "SPOT_CORE_TOKEN";

/// Environment variable holding this engine's cell id when `--cell-id` is absent.
pub const CELL_ID_ENV: &str = "SPOT_CORE_CELL_ID";

/// The token from `--token-file`, else the one given (`SPOT_CORE_TOKEN`), else none. An empty
/// token is an error, not "no token": it would silently turn authentication off.
pub fn resolve_token(args: &Args) -> anyhow::Result<Option<String>> {
    let (text, origin) = match (&args.token_file, &args.token) {
        (Some(path), _) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("reading token file {}", path.display()))?,
            path.display().to_string(),
        ),
        (None, Some(token)) => (token.clone(), TOKEN_ENV.to_owned()),
        (None, None) => return Ok(None),
    };
    checked_token(&text, &origin).map(Some)
}

/// A token as given, trimmed; empty is an error (clients check theirs with this too).
pub fn checked_token(text: &str, origin: &str) -> anyhow::Result<String> {
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("the spot-core token from {origin} is empty");
    }
    Ok(token.to_string())
}

/// Refuse to serve an unauthenticated protocol (anyone who connects can move money) on
/// anything but loopback.
async fn check_listen_address(listen: &str, has_token: bool) -> anyhow::Result<()> {
    if has_token {
        return Ok(());
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen)
        .await
        .with_context(|| format!("resolving {listen}"))?
        .collect();
    if addrs.is_empty() || addrs.iter().any(|a| !a.ip().is_loopback()) {
        anyhow::bail!(
            "refusing to listen on {listen} without a token: only loopback addresses may be \
             used unauthenticated; pass --token-file or set {TOKEN_ENV}"
        );
    }
    Ok(())
}

/// A replayed engine with its listener bound, not yet serving.
#[derive(Debug)]
pub struct Bound {
    pub local_addr: SocketAddr,
    listener: TcpListener,
    engine: EngineHandle,
    access: server::Access,
}

impl Bound {
    /// Serve until the process ends.
    pub async fn serve(self) -> anyhow::Result<()> {
        server::serve(self.listener, self.engine, self.access).await?;
        Ok(())
    }
}

/// Load the assets, replay the WAL, start the engine thread and bind the listener.
pub async fn bind(args: &Args) -> anyhow::Result<Bound> {
    let token = resolve_token(args)?;
    check_listen_address(&args.listen, token.is_some()).await?;
    let assets = match &args.assets {
        Some(path) => Assets::load(path)?,
        None => Assets::builtin(),
    };
    let data_dir = args.data_dir.clone();
    let storage = args.storage.clone();
    if args.replica.replica.is_some() {
        replica::follower::swap_in_rebuild(&data_dir)?;
    }
    let (engine, wal) =
        tokio::task::spawn_blocking(move || open_engine_with(assets, &data_dir, &storage))
            .await
            .context("replay task failed")??;
    let fail = FailPoints::parse(args.failpoints.as_deref().unwrap_or_default());
    if fail != FailPoints::default() {
        tracing::warn!(?fail, "fail points enabled");
    }
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let local_addr = listener.local_addr()?;
    let mut access = server::Access {
        token: token.clone().map(server::Token::new),
        cell: args.cell_id,
        role: None,
    };
    let engine = match &args.replica.replica {
        None => {
            wal::spawn_committer(engine, wal, fail)
                .context("starting the engine thread")?
                .0
        }
        Some(name) => {
            let (handle, role) =
                start_replica(args, name, token.clone(), engine, wal, fail, local_addr).await?;
            access.role = Some(role);
            handle
        }
    };
    tracing::info!(
        authentication = if token.is_some() {
            "token"
        } else {
            "none (loopback only)"
        },
        cell = args.cell_id,
        replica = args.replica.replica.as_deref(),
        "access control"
    );
    Ok(Bound {
        local_addr,
        listener,
        engine,
        access,
    })
}

/// A replica's engine thread (following until it leads), its replication listener and its
/// campaign loop (docs/adr/0020-high-availability.md §3).
// long: a replica's wiring in start-up order (its listener, epochs, fence, context, engine thread, tasks).
async fn start_replica(
    args: &Args,
    name: &str,
    token: Option<String>,
    engine: Engine,
    wal: Wal,
    fail: FailPoints,
    local_addr: SocketAddr,
) -> anyhow::Result<(EngineHandle, std::sync::Arc<replica::Role>)> {
    use std::sync::Arc;
    let repl_listen = args
        .replica
        .repl_listen
        .as_deref()
        .context("--replica needs --repl-listen")?;
    let repl = TcpListener::bind(repl_listen)
        .await
        .with_context(|| format!("binding {repl_listen}"))?;
    let mut epochs = replica::history::Epochs::load(&args.data_dir, engine.last_seq())?;
    let etcd = replica::lease::Etcd::new(
        args.replica
            .etcd
            .as_deref()
            .context("--replica needs --etcd")?,
        args.cell_id.unwrap_or(0),
    )?;
    if engine.last_seq() == 0 {
        replica::fence_blank(&mut epochs, &etcd).await?;
    }
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(1024);
    let progress = Arc::new(wal::Progress::default());
    let info = replica::lease::LeaderInfo {
        name: name.to_owned(),
        client: args
            .replica
            .advertise
            .clone()
            .unwrap_or_else(|| local_addr.to_string()),
        repl: repl.local_addr()?.to_string(),
    };
    let ctx = Arc::new(replica::ReplicaCtx::new(
        &args.replica,
        name.to_owned(),
        token,
        args.cell_id,
        args.data_dir.clone(),
        wal.catalog().clone(),
        progress.clone(),
        jobs_tx,
        info,
    )?);
    let runtime = tokio::runtime::Handle::current();
    let lead_ctx = ctx.clone();
    let parts = wal::ReplicaParts {
        epochs,
        jobs: jobs_rx,
        progress,
        lead: Box::new(move |epoch, start, history| {
            replica::leader::start_shipping(lead_ctx, runtime, epoch, start, history)
        }),
    };
    let (handle, _thread) = wal::spawn_replica_committer(engine, wal, fail, parts)
        .context("starting the engine thread")?;
    tokio::spawn(replica::follower::listen(repl, ctx.clone()));
    tokio::spawn(replica::run(ctx.clone()));
    tracing::info!(
        replica = name,
        repl = repl_listen,
        "replica started; following until it leads"
    );
    Ok((handle, ctx.role.clone()))
}

/// Open `data_dir` with the default storage options (see `open_engine_with`).
pub fn open_engine(assets: Assets, data_dir: &Path) -> anyhow::Result<(Engine, Wal)> {
    open_engine_with(assets, data_dir, &StorageOptions::default())
}

/// Load the newest valid snapshot of `data_dir` and replay the WAL after it.
pub fn open_engine_with(
    assets: Assets,
    data_dir: &Path,
    storage: &StorageOptions,
) -> anyhow::Result<(Engine, Wal)> {
    let started = std::time::Instant::now();
    let (engine, wal, report) = wal::open(assets, data_dir, storage)?;
    tracing::info!(
        path = %wal.path().display(),
        snapshot_seq = report.snapshot_seq,
        snapshot_ms = report.snapshot_ms,
        records = report.records,
        dropped_bytes = report.dropped_bytes,
        last_seq = engine.last_seq(),
        remembered = engine.remembered(),
        ms = started.elapsed().as_millis() as u64,
        "snapshot loaded and WAL replayed"
    );
    Ok((engine, wal))
}

/// Run the engine until SIGINT/SIGTERM. Prints `spot-core listening on <addr>` to stdout once
/// connections are accepted, so a parent that asked for port 0 can learn the port.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let bound = bind(&args).await?;
    let addr = bound.local_addr;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "spot-core listening on {addr}")?;
        out.flush()?;
    }
    tracing::info!(%addr, data_dir = %args.data_dir.display(), "spot-core listening");
    // Stopping abruptly is safe: every acknowledged change is already synced, and a request
    // caught mid-batch was never acknowledged.
    tokio::select! {
        r = bound.serve() => r,
        s = shutdown_signal() => {
            s?;
            tracing::info!("shutting down");
            Ok(())
        }
        r = stdin_closed(), if args.exit_with_stdin => {
            r?;
            tracing::info!("standard input closed (the parent is gone); shutting down");
            Ok(())
        }
    }
}

/// Reads standard input to its end, discarding what comes.
async fn stdin_closed() -> anyhow::Result<()> {
    tokio::io::copy(&mut tokio::io::stdin(), &mut tokio::io::sink())
        .await
        .context("reading standard input")?;
    Ok(())
}

async fn shutdown_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await?;
        Ok(())
    }
}

/// Log to stderr (stdout carries the "listening on" line), filtered by RUST_LOG, default info.
pub fn init_tracing() {
    let _ = telemetry::init(None);
}

/// Log as `init_tracing` does and, when `args` configure an OTLP export, export spans; keep the
/// returned guard while serving.
pub fn init_tracing_with(args: &Args) -> anyhow::Result<Option<telemetry::Guard>> {
    let export = args.traces.export()?;
    telemetry::init(export.as_ref()).map_err(anyhow::Error::msg)
}

/// Everything `main` does once it has parsed the command line (and with it the environment):
/// set up logging (and traces), run.
pub fn main_entry(args: Args) -> anyhow::Result<()> {
    let traces = init_tracing_with(&args)?;
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?
        .block_on(run(args));
    // The last spans are sent before the process ends.
    drop(traces);
    served
}
