//! The `ledger` settings as the command line and the environment give them (clap's `env`
//! attributes: the variable names are the contract the README, the operations guide and the
//! tests use), before they are read into typed values (`settings.rs`). The one place the
//! `ledger` binary names an environment variable of its settings. Each command flattens only
//! the groups it reads (`cli.rs`), so its `--help` shows only those; the `OTEL_*` group is
//! global (every command reports traces).

use crate::config;
use application::{FailPoint, FailPoints};

/// The cell map file (ADR 0017).
pub const CELL_MAP_ENV: &str = "LEDGER_CELL_MAP";
/// Under a cell map, each cell's requests in flight at most (its bulkhead, ADR 0017 §7a).
pub const CELL_IN_FLIGHT_MAX_ENV: &str = "LEDGER_CELL_IN_FLIGHT_MAX";
/// Transfer requests per second per user; `0` or `off` turns the limit off.
pub const RATE_PER_SECOND_ENV: &str = "LEDGER_RATE_PER_SECOND";
/// Transfers per user and UTC day; `0` or `off` turns the limit off.
pub const DAILY_COUNT_MAX_ENV: &str = "LEDGER_DAILY_COUNT_MAX";
/// Amount per user, asset and UTC day, as a JSON object `{"USDT": "1000000", ...}`.
pub const DAILY_AMOUNT_MAX_ENV: &str = "LEDGER_DAILY_AMOUNT_MAX";

/// Every setting, as the command line and the environment give them, in groups: each command
/// declares (flattens) the groups it reads, so its `--help` lists only those, and each setting
/// is declared once, in its group. A group the command does not take stays at its default
/// (unset). [`super::Settings::from_flags`] reads them once into typed values; an empty
/// variable counts as unset.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub cells: CellFlags,
    pub database: DatabaseFlags,
    /// Where `ledger up` finds PostgreSQL when `DATABASE_URL` is unset (`private_pg.rs`).
    pub pg_search: crate::private_pg::PgSearch,
    pub secrets: SecretFlags,
    pub server: ServerFlags,
    pub log: LogFlags,
    /// Traces over OTLP: the standard `OTEL_*` variables (`docs/adr/0018-traces.md`), which
    /// every command reads.
    pub otel: OtelFlags,
}

/// What `up` and `serve` read besides their own options: every group but `ledger up`'s
/// PostgreSQL search.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServingFlags {
    #[command(flatten)]
    pub cell_map: CellFlags,
    #[command(flatten)]
    pub database: DatabaseFlags,
    #[command(flatten)]
    pub secrets: SecretFlags,
    #[command(flatten)]
    pub server: ServerFlags,
    #[command(flatten)]
    pub log: LogFlags,
}

impl Flags {
    /// A serving command's settings, with the global `OTEL_*` ones.
    pub fn serving(serving: &ServingFlags, otel: &OtelFlags) -> Self {
        Self {
            cells: serving.cell_map.clone(),
            database: serving.database.clone(),
            secrets: serving.secrets.clone(),
            server: serving.server.clone(),
            log: serving.log.clone(),
            otel: otel.clone(),
            ..Self::default()
        }
    }
}

/// The cell map, for every command that reaches a cell's database, stream or log.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CellFlags {
    /// The cell map (ADR 0017), a `.toml` or `.json` file naming each cell's database and
    /// spot-core and each partition's cell; without one the ledger is one cell, as ever.
    #[arg(long, env = CELL_MAP_ENV)]
    pub cell_map: Option<std::path::PathBuf>,
}

/// The database, and how connections (to PostgreSQL, and to spot-core where a command reaches it) are kept alive.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DatabaseFlags {
    /// PostgreSQL URL; the local default when unset.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Idle time (ms) before a spot-core or PostgreSQL connection is probed by TCP keepalive
    /// (default 4000; unanswered probes end it once `TCP_USER_TIMEOUT` passed).
    #[arg(long, env = "LEDGER_TCP_KEEPALIVE_MS")]
    pub tcp_keepalive_ms: Option<u64>,
    /// How long (ms) sent data may stay unacknowledged before the connection is given up
    /// (`TCP_USER_TIMEOUT`, default 10000).
    #[arg(long, env = "LEDGER_TCP_USER_TIMEOUT_MS")]
    pub tcp_user_timeout_ms: Option<u64>,
    /// PostgreSQL ends a session idle inside a transaction this long (ms, default 60000).
    #[arg(long, env = "LEDGER_DB_IDLE_IN_TRANSACTION_MS")]
    pub db_idle_in_transaction_ms: Option<u64>,
}

/// The secrets given in the environment (hidden from --help: a secret belongs in the environment, not on a command line).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SecretFlags {
    /// The HS256 secret tokens are signed with (at least 32 bytes).
    #[arg(long, env = config::JWT_SECRET_ENV, hide = true, hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// The token a spot-core client presents (`hello`).
    #[arg(long, env = spot_core::TOKEN_ENV, hide = true, hide_env_values = true)]
    pub spot_core_token: Option<String>,
}

/// What only a serving process (`up`, `serve`) reads: the limits, the background work's timing, the HTTP server, `/metrics` and the crash tests' fail point.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerFlags {
    /// Transfer requests per second per user; `0` or `off` turns the limit off.
    #[arg(long, env = RATE_PER_SECOND_ENV)]
    pub rate_per_second: Option<String>,
    /// Transfers per user and UTC day; `0` or `off` turns the limit off.
    #[arg(long, env = DAILY_COUNT_MAX_ENV)]
    pub daily_count_max: Option<String>,
    /// Amount per user, asset and UTC day, as a JSON object `{"USDT": "1000000", ...}`.
    #[arg(long, env = DAILY_AMOUNT_MAX_ENV)]
    pub daily_amount_max: Option<String>,
    /// The most transfers one `POST /api/v1/internal_transfers` may carry (1,000 by default; see
    /// `application::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT` for why); a larger batch is
    /// refused whole.
    #[arg(long, env = "LEDGER_BULK_TRANSFERS_MAX", value_parser = bulk_max)]
    pub bulk_transfers_max: Option<usize>,
    /// How long (ms) a transfer sits unchanged before the recovery worker touches it.
    #[arg(long, env = "LEDGER_RECOVERY_STALE_MS")]
    pub recovery_stale_ms: Option<String>,
    /// Time (ms) between recovery passes.
    #[arg(long, env = "LEDGER_RECOVERY_INTERVAL_MS")]
    pub recovery_interval_ms: Option<String>,
    /// How long (ms) a recovery claim holds without renewal.
    #[arg(long, env = "LEDGER_RECOVERY_LEASE_MS")]
    pub recovery_lease_ms: Option<String>,
    /// Most transfers claimed in one recovery pass.
    #[arg(long, env = "LEDGER_RECOVERY_BATCH_MAX")]
    pub recovery_batch_max: Option<String>,
    /// First retry delay (ms) after an unknown outcome.
    #[arg(long, env = "LEDGER_RETRY_BACKOFF_MS_BASE")]
    pub retry_backoff_ms_base: Option<String>,
    /// Longest retry delay (ms).
    #[arg(long, env = "LEDGER_RETRY_BACKOFF_MS_MAX")]
    pub retry_backoff_ms_max: Option<String>,
    /// MON-001: a transfer in TARGET_PENDING longer than this (ms) raises a CRITICAL alert.
    #[arg(long, env = "LEDGER_ALERT_TARGET_PENDING_MS")]
    pub alert_target_pending_ms: Option<String>,
    /// Seconds between periodic conservation checks (default 60).
    #[arg(long, env = "LEDGER_INVARIANT_INTERVAL_SECS")]
    pub invariant_interval_secs: Option<String>,
    /// How long (s) spot-core remembers a req_id at least (the idempotency horizon's retention;
    /// default 604800, at least 1).
    #[arg(long, env = "LEDGER_IDEMPOTENCY_RETENTION_SECS")]
    pub idempotency_retention_secs: Option<String>,
    /// Time (ms) between two advances of spot-core's idempotency horizon (default 60000).
    #[arg(long, env = "LEDGER_HORIZON_INTERVAL_MS")]
    pub horizon_interval_ms: Option<String>,
    /// Longest wait (ms) for a request's headers, new or idle connection alike (default 10000).
    #[arg(long, env = "LEDGER_HTTP_HEADER_TIMEOUT_MS")]
    pub http_header_timeout_ms: Option<u64>,
    /// Longest a request may take to be received and answered, body included (ms, default
    /// 30000).
    #[arg(long, env = "LEDGER_HTTP_REQUEST_TIMEOUT_MS")]
    pub http_request_timeout_ms: Option<u64>,
    /// Connections open at once (default 4096).
    #[arg(long, env = "LEDGER_HTTP_CONNECTIONS_MAX")]
    pub http_connections_max: Option<usize>,
    /// Connections open at once from one IP address (default 256).
    #[arg(long, env = "LEDGER_HTTP_CONNECTIONS_PER_ADDRESS_MAX")]
    pub http_connections_per_address_max: Option<usize>,
    /// Under a cell map, requests one cell may have in flight in this process before its next
    /// ones are refused (503 naming the cell), its bulkhead (default: the connections cap
    /// divided by the number of cells).
    #[arg(long, env = CELL_IN_FLIGHT_MAX_ENV)]
    pub cell_in_flight_max: Option<usize>,
    /// Under a cell map, probes of each cell (one a second) between two reads of its stored map
    /// version; a version higher than the one routed by reloads the map (ADR 0023 §1; default
    /// 1: every probe; 0: only when a cell refuses a write at the partition fence).
    #[arg(long, env = "LEDGER_MAP_RELOAD_PROBES")]
    pub map_reload_probes: Option<u32>,
    /// Where `/metrics` is served: HOST:PORT (not on the API's address then), or `api` for the
    /// API's address (default 127.0.0.1:9464).
    #[arg(long, env = "LEDGER_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// MON-004: transfer requests per user in a sliding minute above which a WARNING alert is
    /// raised (default 300; `0` or `off`: none).
    #[arg(long, env = "LEDGER_ALERT_REQUESTS_PER_MINUTE")]
    pub alert_requests_per_minute: Option<String>,
    /// MON-004: rate-limit refusals per user in a sliding minute above which a WARNING alert is
    /// raised (default 30; `0` or `off`: none).
    #[arg(long, env = "LEDGER_ALERT_REFUSALS_PER_MINUTE")]
    pub alert_refusals_per_minute: Option<String>,
    /// The crash tests' fail point to arm (CRA-001..006): the process aborts there on purpose.
    /// Honoured only with `--allow-failpoints`; an unknown name refuses start-up.
    #[arg(long, env = "LEDGER_FAILPOINT", hide = true)]
    pub failpoint: Option<String>,
    /// The explicit opt-in a set `LEDGER_FAILPOINT` needs (crash tests only); without it the
    /// process refuses to start.
    #[arg(
        long,
        env = "LEDGER_ALLOW_FAILPOINTS",
        hide = true,
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub allow_failpoints: bool,
    /// Calls FUNDING in its own transactions, apart from the events announcing and recording
    /// each call, as before ADR 0024 (for measuring the two side by side); by default a call
    /// of this cell's FUNDING is made in the transaction of its events.
    #[arg(
        long,
        env = "LEDGER_FUNDING_APART",
        hide = true,
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub funding_apart: bool,
    /// A signed checkpoint of the log at least every this many events (10,000 by default)...
    #[arg(long, env = "LEDGER_LOG_CHECKPOINT_EVENTS")]
    pub log_checkpoint_events: Option<u64>,
    /// ... or every this many milliseconds when the log grew (10,000 by default).
    #[arg(long, env = "LEDGER_LOG_CHECKPOINT_MS")]
    pub log_checkpoint_ms: Option<u64>,
}

/// The tamper-evident log's signing key (its checkpoint cadence is a serving process's).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogFlags {
    /// The tamper-evident log's signing key file (`ledger log-key --generate`; `ledger up`
    /// keeps one in its data dir). Unset: the log is not kept.
    #[arg(long, env = "LEDGER_LOG_SIGNING_KEY_FILE")]
    pub log_signing_key_file: Option<std::path::PathBuf>,
}

impl Flags {
    /// The armed fail point, if any: an unknown name, or a fail point without the explicit
    /// opt-in (`--allow-failpoints`, `LEDGER_ALLOW_FAILPOINTS=1`), refuses start-up; an armed
    /// one is logged loudly (`FailPoints::armed`).
    pub fn failpoints(&self) -> anyhow::Result<FailPoints> {
        let Some(name) = self
            .server
            .failpoint
            .as_deref()
            .filter(|n| !n.trim().is_empty())
        else {
            return Ok(FailPoints::default());
        };
        let point: FailPoint = name
            .parse()
            .map_err(|e| anyhow::anyhow!("LEDGER_FAILPOINT: {e}"))?;
        anyhow::ensure!(
            self.server.allow_failpoints,
            "LEDGER_FAILPOINT={point} would abort this process on purpose; fail points are for \
             crash tests only and need --allow-failpoints (LEDGER_ALLOW_FAILPOINTS=1)"
        );
        Ok(FailPoints::armed(point))
    }
}

/// `LEDGER_BULK_TRANSFERS_MAX`: 1 to 100,000.
fn bulk_max(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!("must be an integer from 1 to 100000, got {text:?}")),
    }
}

/// The standard OpenTelemetry variables the ledger reads (`telemetry::OtelVars` checks them);
/// with no endpoint set, nothing is exported.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OtelFlags {
    /// `true`: export nothing, whatever else is set.
    #[arg(long, global = true, env = "OTEL_SDK_DISABLED", hide = true)]
    pub otel_sdk_disabled: Option<String>,
    /// `otlp` (the default when an endpoint is set) or `none`.
    #[arg(long, global = true, env = "OTEL_TRACES_EXPORTER", hide = true)]
    pub otel_traces_exporter: Option<String>,
    /// The OTLP collector's base URL (`http://host:4317` for grpc, `http://host:4318` for
    /// http/protobuf); unset: no traces are exported.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otel_exporter_otlp_endpoint: Option<String>,
    /// The OTLP traces URL itself (wins over the base URL).
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")]
    pub otel_exporter_otlp_traces_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (the default).
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_PROTOCOL")]
    pub otel_exporter_otlp_protocol: Option<String>,
    /// The protocol for traces alone (wins over OTEL_EXPORTER_OTLP_PROTOCOL).
    #[arg(
        long,
        global = true,
        env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        hide = true
    )]
    pub otel_exporter_otlp_traces_protocol: Option<String>,
    /// `service.name` of the ledger's spans (default `ledger`; spot-core reports its own).
    #[arg(long, global = true, env = "OTEL_SERVICE_NAME")]
    pub otel_service_name: Option<String>,
    /// `parentbased_always_on` (default), `always_on`, `always_off`, `traceidratio`,
    /// `parentbased_always_off`, `parentbased_traceidratio`.
    #[arg(long, global = true, env = "OTEL_TRACES_SAMPLER")]
    pub otel_traces_sampler: Option<String>,
    /// The ratio of the `traceidratio` samplers, 0 to 1 (default 1).
    #[arg(long, global = true, env = "OTEL_TRACES_SAMPLER_ARG")]
    pub otel_traces_sampler_arg: Option<String>,
    /// Longest an export call may take (ms, default 10000).
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_TIMEOUT", hide = true)]
    pub otel_exporter_otlp_timeout: Option<String>,
    /// Longest a finished span waits before it is sent (ms, default 1000).
    #[arg(long, global = true, env = "OTEL_BSP_SCHEDULE_DELAY", hide = true)]
    pub otel_bsp_schedule_delay: Option<String>,
}

impl OtelFlags {
    /// The variables as given, for `telemetry::OtelVars::export`.
    pub fn vars(&self) -> telemetry::OtelVars {
        telemetry::OtelVars {
            sdk_disabled: self.otel_sdk_disabled.clone(),
            traces_exporter: self.otel_traces_exporter.clone(),
            endpoint: self.otel_exporter_otlp_endpoint.clone(),
            traces_endpoint: self.otel_exporter_otlp_traces_endpoint.clone(),
            protocol: self.otel_exporter_otlp_protocol.clone(),
            traces_protocol: self.otel_exporter_otlp_traces_protocol.clone(),
            service_name: self.otel_service_name.clone(),
            sampler: self.otel_traces_sampler.clone(),
            sampler_arg: self.otel_traces_sampler_arg.clone(),
            timeout_ms: self.otel_exporter_otlp_timeout.clone(),
            schedule_delay_ms: self.otel_bsp_schedule_delay.clone(),
        }
    }
}
