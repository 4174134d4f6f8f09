//! The serving commands: `ledger up` (the whole stack here, spot-core as a child process when
//! no `--spot-url` is given, ready-to-use tokens printed) and `ledger serve` (the API and the
//! background work against an existing database and spot-core). Each wires the core from the
//! settings (`wiring.rs`), binds the API and `/metrics`, and runs until ctrl-c or SIGTERM, then
//! stops in order.

use std::path::PathBuf;

use crate::config::{self, JwtSecret, SecretSource};
use adapters::SpotAdapter;
use anyhow::{anyhow, Context};
use clap::Args;
use domain::UserId;
use edge::auth::mint;
use tokio::net::TcpListener;

use crate::private_pg::PgSearch;
use crate::router::serve_with_shutdown;
use crate::settings::options::{spot_address, Millis, RelayOptions, SpotStorage};
use crate::settings::{MetricsListen, ServingFlags, Settings};
use crate::spot_child::{child_exit, stored_or_generated_spot_token, SpotChild, SPOT_TOKEN_FILE};
use crate::startup::{shutdown_signal, Background, LogDatabase, Serving};
use crate::wiring::{Assembled, Wiring};

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Address the API listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Where the JWT secret and spot-core's data live.
    #[arg(long, default_value = "./.ledger")]
    pub data_dir: PathBuf,
    /// A spot-core already running (HOST:PORT); when absent one is started as a child process.
    #[arg(long, value_parser = spot_address)]
    pub spot_url: Option<String>,
    /// Start N cells here (ADR 0017): N databases on the PostgreSQL of DATABASE_URL, named
    /// after its database (`ledger_cell1`, ...), and N spot-core children.
    #[arg(long, conflicts_with = "spot_url")]
    pub cells: Option<u16>,
    /// Run the cell under HA (docs/adr/0020-high-availability.md): an etcd cluster of three,
    /// PostgreSQL under Patroni (a synchronous pair, failover automatic) and three spot-core
    /// replicas, as child processes under `<data-dir>/ha`; `<data-dir>/members.json` names them.
    /// With `--cells N`, every cell gets all of this.
    #[arg(long, conflicts_with = "spot_url")]
    pub ha: bool,
    /// Asset configuration (JSON array); the shipped default when absent.
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// How long one spot-core call may take before its outcome counts as unknown.
    #[arg(long = "spot-timeout-ms", default_value_t = Millis(config::SPOT_TIMEOUT_DEFAULT))]
    pub spot_timeout: Millis,
    /// The event relay to NATS JetStream, run in-process when `--nats` is given.
    #[command(flatten)]
    pub relay: RelayOptions,
    /// Passed to the spot-core child: its snapshot and WAL settings.
    #[command(flatten)]
    pub spot_storage: SpotStorage,
    #[command(flatten)]
    pub pg_search: PgSearch,
    #[command(flatten)]
    pub settings: ServingFlags,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// The spot-core to use (HOST:PORT); with a cell map (`serve --cell-map FILE` or
    /// LEDGER_CELL_MAP), each cell's is in the map instead.
    #[arg(long, value_parser = spot_address, required_unless_present = "cell_map")]
    pub spot_url: Option<String>,
    /// Asset configuration (JSON array); the shipped default when absent.
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// How long one spot-core call may take before its outcome counts as unknown.
    #[arg(long = "spot-timeout-ms", default_value_t = Millis(config::SPOT_TIMEOUT_DEFAULT))]
    pub spot_timeout: Millis,
    /// The event relay to NATS JetStream, run in-process when `--nats` is given.
    #[command(flatten)]
    pub relay: RelayOptions,
    #[command(flatten)]
    pub settings: ServingFlags,
}

/// The core wired with everything the settings configure (limits, the fail point, the
/// idempotency retention), and how to serve it: the recovery worker, the conservation check's
/// interval, the idempotency horizon, the HTTP limits, where `/metrics` is served, the relay
/// when `relay` is given, and `database_url` (`pool`'s database) for the log follower's own pool.
pub(crate) fn configured(
    settings: &Settings,
    pool: sqlx::PgPool,
    spot: SpotAdapter,
    assets: domain::AssetRegistry,
    secret: &JwtSecret,
    relay: Option<relay::RelayConfig>,
    database_url: &str,
) -> anyhow::Result<(Assembled, Serving)> {
    let background = &settings.background;
    let limits = &settings.limits;
    let assembled = Wiring::new(pool, spot, assets, &secret.bytes)
        .with_idempotency_retention(background.horizon.retention)
        .with_bulk_max(limits.bulk_max)
        .with_watched_limits(limits.limits.clone(), limits.frequency)
        .with_failpoints(settings.failpoints)
        .with_funding_apart(settings.funding_apart)
        .assemble()
        .with_cluster(database_url);
    let log = crate::log_cli::follower_config(settings)?;
    let checkpoints = crate::log_cli::checkpoint_target(relay.as_ref(), log.as_ref(), None)?;
    let serving = Serving {
        background: Background {
            recovery: Some(background.recovery.clone()),
            audit_interval: background.audit_interval,
            relay,
            horizon: Some(background.horizon),
            log,
            checkpoints,
            log_database: Some(LogDatabase {
                url: database_url.to_owned(),
                liveness: settings.database.liveness,
            }),
        },
        http: settings.http.limits,
        metrics_on_api: settings.http.metrics == MetricsListen::Api,
    };
    Ok((assembled, serving))
}

pub(crate) async fn serve(args: ServeArgs, settings: &Settings) -> anyhow::Result<()> {
    let spot_addr = args
        .spot_url
        .clone()
        .context("`ledger serve` needs --spot-url without a cell map")?;
    let secret = settings.secrets.jwt.clone().with_context(|| {
        format!(
            "`ledger serve` needs {} (shared by every instance)",
            config::JWT_SECRET_ENV
        )
    })?;
    let assets = config::load_assets(args.assets.as_deref())?;
    let pool = settings.database.pool(config::POOL_CONNECTIONS_MAX).await?;
    schema::cell_identity::check_no_map(&pool).await?;
    // Optional: a spot-core on loopback may run without a token.
    let spot = SpotAdapter::with_liveness(
        spot_addr.clone(),
        args.spot_timeout.0,
        settings.secrets.spot_core_token.clone(),
        settings.spot_liveness,
    );
    // Serving while spot-core is down is allowed: transfers wait and the recovery worker retries.
    if let Err(e) = spot.ping().await {
        tracing::warn!(spot = %spot_addr, error = %e, "spot-core does not answer yet");
    }
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let (assembled, serving) = configured(
        settings,
        pool,
        spot,
        assets,
        &secret,
        args.relay.config(),
        &settings.database.url,
    )?;
    let metrics = bind_metrics(&settings.http.metrics).await?;
    println!("ledger serving on http://{local} (spot-core at {spot_addr})");
    run_until_stopped(listener, metrics, assembled, serving, None).await
}

/// What every `up` does first: the assets, the data dir, the JWT secret kept there, and the
/// settings with the log's key from the data dir.
pub(crate) fn up_prelude(
    args: &UpArgs,
    settings: &Settings,
) -> anyhow::Result<(domain::AssetRegistry, JwtSecret, Settings)> {
    let assets = config::load_assets(args.assets.as_deref())?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let secret = config::secret_for_data_dir(settings.secrets.jwt.clone(), &args.data_dir)?;
    let settings = crate::log_cli::with_data_dir_key(settings, &args.data_dir)?;
    Ok((assets, secret, settings))
}

/// One cell's `up` once its database and spot-core answer: what it serves with and how the
/// banner names them.
pub(crate) struct UpStack {
    pub assets: domain::AssetRegistry,
    pub secret: JwtSecret,
    pub pool: sqlx::PgPool,
    pub spot: SpotAdapter,
    pub url: String,
    /// The banner's spot-core line.
    pub spot_line: String,
    pub child: Option<SpotChild>,
    /// The cell's members under HA, for the cells view (empty without HA).
    pub members: Vec<cells::MemberSpec>,
    /// A line printed after the banner.
    pub after_banner: Option<String>,
}

/// Binds the API and `/metrics`, wires the core, prints the banner and serves until stopped:
/// the part of `up` every kind of cell shares.
pub(crate) async fn serve_up(
    args: &UpArgs,
    settings: &Settings,
    stack: UpStack,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    let (assembled, serving) = configured(
        settings,
        stack.pool,
        stack.spot,
        stack.assets,
        &stack.secret,
        args.relay.config(),
        &stack.url,
    )?;
    if !stack.members.is_empty() {
        // The cells view and the failover records name members as the cell does (r1, node0).
        assembled.state.cluster.set_members(stack.members);
    }
    let metrics = bind_metrics(&settings.http.metrics).await?;
    print_banner(&Banner {
        base: format!("http://{local}"),
        metrics: match &metrics {
            Some(l) => format!("http://{}/metrics", l.local_addr()?),
            None if serving.metrics_on_api => format!("http://{local}/metrics"),
            None => "not served (see the warning above)".to_owned(),
        },
        database: config::redact_url(&stack.url),
        spot: stack.spot_line,
        secret: &stack.secret,
    });
    if let Some(line) = stack.after_banner {
        println!("{line}");
    }
    run_until_stopped(listener, metrics, assembled, serving, stack.child).await
}

pub(crate) async fn up(args: UpArgs, settings: &Settings) -> anyhow::Result<()> {
    let (assets, secret, settings) = up_prelude(&args, settings)?;
    let settings = &settings;
    // Kept until `up` returns: dropping it stops a private cluster.
    let database = &settings.database;
    let (url, _private_pg) = crate::private_pg::database_for_up(
        database.url_given.then_some(database.url.as_str()),
        &database.pg_search,
        &args.data_dir,
    )
    .await?;
    let pool = schema::prepare_with(&url, config::POOL_CONNECTIONS_MAX, database.liveness).await?;
    schema::cell_identity::check_no_map(&pool).await?;

    let timeout = args.spot_timeout.0;
    let (spot_addr, spot_token, child) = spot_for_up(&args, settings).await?;
    let spot = SpotAdapter::with_liveness(
        spot_addr.clone(),
        timeout,
        spot_token,
        settings.spot_liveness,
    );
    spot.ping()
        .await
        .map_err(|e| anyhow!("spot-core at {spot_addr} does not answer: {e}"))?;
    let spot_line = match &child {
        Some(_) => format!(
            "{spot_addr} (child process, data in {})",
            args.data_dir.join("spot").display()
        ),
        None => format!("{spot_addr} (already running)"),
    };
    let stack = UpStack {
        assets,
        secret,
        pool,
        spot,
        url,
        spot_line,
        child,
        members: Vec::new(),
        after_banner: None,
    };
    serve_up(&args, settings, stack).await
}

/// The spot-core `up` serves with: the one `--spot-url` names (with the configured token), or a
/// child process started under the data dir with the token stored there.
async fn spot_for_up(
    args: &UpArgs,
    settings: &Settings,
) -> anyhow::Result<(String, Option<String>, Option<SpotChild>)> {
    Ok(match &args.spot_url {
        Some(given) => (
            given.clone(),
            settings.secrets.spot_core_token.clone(),
            None,
        ),
        None => {
            let token_file = args.data_dir.join(SPOT_TOKEN_FILE);
            let token = stored_or_generated_spot_token(&token_file)?;
            let child = SpotChild::start(
                &args.data_dir.join("spot"),
                args.assets.as_deref(),
                &token_file,
                &args.spot_storage,
                None,
            )
            .await?;
            (child.addr.clone(), Some(token), Some(child))
        }
    })
}

pub(crate) struct Banner<'a> {
    pub(crate) base: String,
    pub(crate) metrics: String,
    pub(crate) database: String,
    pub(crate) spot: String,
    pub(crate) secret: &'a JwtSecret,
}

pub(crate) fn print_banner(b: &Banner<'_>) {
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
pub(crate) async fn bind_metrics(metrics: &MetricsListen) -> anyhow::Result<Option<TcpListener>> {
    let MetricsListen::Address { addr, explicit } = metrics.clone() else {
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
pub(crate) async fn run_until_stopped(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    assembled: Assembled,
    serving: Serving,
    mut child: Option<SpotChild>,
) -> anyhow::Result<()> {
    // `/metrics` on its own address lives exactly as long as the API server.
    let metrics = metrics.map(|l| {
        let state = assembled.state.clone();
        let app = query_api::metrics::app(state, serving.target_pending_alert_after());
        tokio::spawn(edge::http_server::serve(
            l,
            app,
            serving.http,
            std::future::pending(),
        ))
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(serve_with_shutdown(
        listener,
        assembled,
        serving,
        async move {
            let _ = stop_rx.await;
        },
    ));

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
