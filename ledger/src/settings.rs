//! The one `Settings` of the `ledger` binary: everything configurable, read once at start-up
//! from the command line and the environment (`flags.rs`, clap's `env`: the variable names are
//! the contract the README and the tests use) into typed values grouped by concern
//! (`parse.rs`; a value that does not parse stops the process with an error naming its
//! variable), and handed to each command as the groups it needs. No library crate reads the
//! environment; the binary's command line is the only place that does (with `spot_core::Args`
//! for the engine's own binary). The per-command options (`options.rs`: where to listen, which
//! spot-core, the relay's and the spot-core child's storage options) are typed by clap as it
//! parses them.

mod flags;
pub mod options;
mod parse;

use std::time::Duration;

use crate::config::JwtSecret;
use application::alerts::FrequencyConfig;
use application::{FailPoints, HorizonConfig};
use edge::http_server::HttpLimits;
use edge::ratelimit::LimitsConfig;
use liveness::TcpLiveness;
use recovery::RecoveryConfig;

pub use flags::{
    CellFlags, DatabaseFlags, Flags, LogFlags, OtelFlags, SecretFlags, ServerFlags, ServingFlags,
    CELL_IN_FLIGHT_MAX_ENV, CELL_MAP_ENV, DAILY_AMOUNT_MAX_ENV, DAILY_COUNT_MAX_ENV,
    RATE_PER_SECOND_ENV,
};

/// How often the periodic conservation check runs, unless configured otherwise.
pub const AUDIT_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// Where `/metrics` is served unless configured otherwise: loopback only, the port Prometheus
/// exporters conventionally use for an application's own metrics.
pub const METRICS_LISTEN_DEFAULT: &str = "127.0.0.1:9464";

/// Where `/metrics` is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsListen {
    /// On the API's own address (`--metrics-listen api`).
    Api,
    /// On an address of its own and not on the API's; `explicit` when the setting named it (a
    /// failed bind is then an error; the default's only a warning, see `cli.rs`).
    Address { addr: String, explicit: bool },
}

/// Everything configurable, typed, read once at start-up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The cell map (ADR 0017); `None`: one cell, `database` and the given spot-core.
    pub cells: Option<cells::CellMap>,
    pub database: DatabaseSettings,
    pub secrets: SecretSettings,
    pub limits: LimitSettings,
    pub background: BackgroundSettings,
    pub http: HttpSettings,
    /// The keepalive and `TCP_USER_TIMEOUT` of spot-core connections.
    pub spot_liveness: TcpLiveness,
    /// The tamper-evident log: its signing key and checkpoint cadence.
    pub log: LogSettings,
    /// Where and how traces are exported (the `OTEL_*` variables); `None`: they are not.
    pub traces: Option<telemetry::Export>,
    /// The crash tests' armed fail point, if any.
    pub failpoints: FailPoints,
    /// FUNDING's calls in transactions of their own, apart from their events (ADR 0024's
    /// "before", for measuring).
    pub funding_apart: bool,
}

/// `service.name` of the ledger's spans unless `OTEL_SERVICE_NAME` says otherwise.
pub const TRACES_SERVICE_NAME: &str = "ledger";

/// The tamper-evident log's settings (`docs/adr/0016-tamper-evident-log.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// `LEDGER_LOG_SIGNING_KEY_FILE`; `None` (unset or empty): the log is not kept.
    pub signing_key_file: Option<std::path::PathBuf>,
    /// A checkpoint at least every this many events.
    pub checkpoint_events: u64,
    /// ... or this often while the log grows.
    pub checkpoint_interval: Duration,
}

/// The database: where it is and how its connections are kept alive.
#[derive(Debug, Clone)]
pub struct DatabaseSettings {
    /// `DATABASE_URL`, or the local default when unset.
    pub url: String,
    /// Whether `DATABASE_URL` was given (`ledger up` otherwise looks for one: `pg_search`).
    pub url_given: bool,
    /// Where `ledger up` finds PostgreSQL when `DATABASE_URL` is unset.
    pub pg_search: crate::private_pg::PgSearch,
    /// Keepalive, `TCP_USER_TIMEOUT` and the server's idle-in-transaction bound.
    pub liveness: schema::DbLiveness,
}

/// The secrets given in the environment.
#[derive(Clone)]
pub struct SecretSettings {
    /// `LEDGER_JWT_SECRET` (at least 32 bytes), if set.
    pub jwt: Option<JwtSecret>,
    /// `SPOT_CORE_TOKEN`, if set (set but empty is refused: it would turn authentication off).
    pub spot_core_token: Option<String>,
}

impl std::fmt::Debug for SecretSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSettings")
            .field("jwt", &self.jwt)
            .field(
                "spot_core_token",
                &self.spot_core_token.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

/// What a user may send: the rate and daily limits, MON-004's thresholds, the bulk maximum.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSettings {
    pub limits: LimitsConfig,
    pub frequency: FrequencyConfig,
    /// The most transfers one `POST /api/v1/internal_transfers` may carry.
    pub bulk_max: usize,
}

/// The background work's timing: the recovery worker, the conservation check, the horizon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundSettings {
    pub recovery: RecoveryConfig,
    pub audit_interval: Duration,
    pub horizon: HorizonConfig,
    /// Under a cell map, probes of a cell between two reads of its stored map version
    /// (`LEDGER_MAP_RELOAD_PROBES`; 0: only a write refused at the partition fence reloads).
    pub map_reload_probes: u32,
}

/// The HTTP server's timeouts and caps, and where `/metrics` is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    pub limits: HttpLimits,
    pub metrics: MetricsListen,
    /// `LEDGER_CELL_IN_FLIGHT_MAX`: each cell's bulkhead under a cell map, when given; see
    /// [`HttpSettings::cell_in_flight_max`].
    pub cell_in_flight: Option<usize>,
}

impl HttpSettings {
    /// Under a map of `cells` cells, the requests one cell may have in flight in this process
    /// before its next ones are refused (ADR 0017 §7a): `LEDGER_CELL_IN_FLIGHT_MAX`, or the
    /// connections cap shared evenly (`LEDGER_HTTP_CONNECTIONS_MAX / cells`, at least 1).
    pub fn cell_in_flight_max(&self, cells: usize) -> usize {
        self.cell_in_flight
            .unwrap_or(self.limits.connections_max / cells.max(1))
            .max(1)
    }
}

impl Settings {
    /// Reads every setting once into its typed value; the first that does not parse is the
    /// error, naming its variable.
    pub fn from_flags(flags: &Flags) -> anyhow::Result<Self> {
        Ok(Self {
            cells: flags.cell_map()?,
            database: DatabaseSettings {
                url: flags.database_url(),
                url_given: (flags.database.database_url.as_deref())
                    .is_some_and(|u| !u.trim().is_empty()),
                pg_search: flags.pg_search.clone(),
                liveness: flags.db_liveness(),
            },
            secrets: SecretSettings {
                jwt: flags.jwt_secret()?,
                spot_core_token: flags.spot_core_token()?,
            },
            limits: LimitSettings {
                limits: flags.limits()?,
                frequency: flags.frequency()?,
                bulk_max: flags
                    .server
                    .bulk_transfers_max
                    .unwrap_or(application::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT),
            },
            background: BackgroundSettings {
                recovery: flags.recovery()?,
                audit_interval: flags.audit_interval()?,
                horizon: flags.horizon()?,
                map_reload_probes: flags.server.map_reload_probes.unwrap_or(1),
            },
            http: HttpSettings {
                limits: flags.http_limits()?,
                metrics: flags.metrics_listen(),
                cell_in_flight: flags.cell_in_flight_max()?,
            },
            spot_liveness: flags.spot_liveness(),
            log: LogSettings {
                signing_key_file: flags
                    .log
                    .log_signing_key_file
                    .clone()
                    .filter(|p| !p.as_os_str().is_empty()),
                checkpoint_events: flags
                    .server
                    .log_checkpoint_events
                    .unwrap_or(tlog_follower::follower::CHECKPOINT_EVENTS_DEFAULT),
                checkpoint_interval: flags
                    .server
                    .log_checkpoint_ms
                    .map(Duration::from_millis)
                    .unwrap_or(tlog_follower::follower::CHECKPOINT_INTERVAL_DEFAULT),
            },
            traces: flags
                .otel
                .vars()
                .export(TRACES_SERVICE_NAME)
                .map_err(anyhow::Error::msg)?,
            failpoints: flags.failpoints()?,
            funding_apart: flags.server.funding_apart,
        })
    }
}

impl DatabaseSettings {
    /// The database pool for `connections_max` connections, migrated.
    pub async fn pool(&self, connections_max: u32) -> anyhow::Result<sqlx::PgPool> {
        schema::prepare_with(&self.url, connections_max, self.liveness).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_flags_read_into_the_defaults() {
        let settings = Settings::from_flags(&Flags::default()).unwrap();
        assert!(settings.cells.is_none());
        assert_eq!(settings.database.url, schema::DEFAULT_DATABASE_URL);
        assert!(settings.secrets.jwt.is_none());
        assert_eq!(settings.limits.limits, LimitsConfig::seed_defaults());
        assert_eq!(settings.limits.frequency, FrequencyConfig::default());
        assert_eq!(
            settings.limits.bulk_max,
            application::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT
        );
        assert_eq!(settings.background.recovery, RecoveryConfig::default());
        assert_eq!(settings.background.audit_interval, AUDIT_INTERVAL_DEFAULT);
        assert_eq!(settings.background.horizon, HorizonConfig::default());
        assert_eq!(settings.http.limits, HttpLimits::default());
        assert_eq!(settings.spot_liveness, TcpLiveness::DEFAULT);
        assert_eq!(settings.failpoints, FailPoints::default());
        assert_eq!(settings.traces, None);
    }

    #[test]
    fn an_otlp_endpoint_turns_traces_on() {
        let flags = Flags {
            otel: flags::OtelFlags {
                otel_exporter_otlp_endpoint: Some("http://127.0.0.1:4317".into()),
                otel_exporter_otlp_protocol: Some("grpc".into()),
                ..flags::OtelFlags::default()
            },
            ..Flags::default()
        };
        let export = Settings::from_flags(&flags).unwrap().traces.unwrap();
        assert_eq!(export.protocol, telemetry::Protocol::Grpc);
        assert_eq!(export.endpoint, "http://127.0.0.1:4317");
        assert_eq!(export.service_name, TRACES_SERVICE_NAME);
        let flags = Flags {
            otel: flags::OtelFlags {
                otel_exporter_otlp_endpoint: Some("http://127.0.0.1:4318".into()),
                otel_exporter_otlp_protocol: Some("http/json".into()),
                ..flags::OtelFlags::default()
            },
            ..Flags::default()
        };
        let refused = Settings::from_flags(&flags).unwrap_err().to_string();
        assert!(refused.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{refused}");
    }

    #[test]
    fn a_cell_map_is_read_and_validated_at_start_up() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("cells.json");
        std::fs::write(
            &good,
            r#"{"partitions": 256, "cells": [{"id": 1, "database_url": "postgres://h/c1",
                "spot": "127.0.0.1:7400", "partitions": ["0-255"]}]}"#,
        )
        .unwrap();
        let flags = Flags {
            cells: CellFlags {
                cell_map: Some(good),
            },
            ..Flags::default()
        };
        let map = Settings::from_flags(&flags).unwrap().cells.unwrap();
        assert_eq!(map.cells().len(), 1);

        let gap = dir.path().join("gap.toml");
        std::fs::write(
            &gap,
            "partitions = 256\n[[cells]]\nid = 1\ndatabase_url = \"d\"\nspot = \"s\"\n\
             partitions = [\"0-254\"]\n",
        )
        .unwrap();
        let flags = Flags {
            cells: CellFlags {
                cell_map: Some(gap),
            },
            ..Flags::default()
        };
        let refused = format!("{:#}", Settings::from_flags(&flags).unwrap_err());
        assert!(refused.contains(CELL_MAP_ENV), "{refused}");
        assert!(
            refused.contains("partition 255 is assigned to no cell"),
            "{refused}"
        );
    }

    #[test]
    fn each_cells_bulkhead_is_a_setting_with_todays_share_as_default() {
        let server = |server: ServerFlags| Flags {
            server,
            ..Flags::default()
        };
        let shared = Settings::from_flags(&server(ServerFlags {
            http_connections_max: Some(300),
            ..ServerFlags::default()
        }))
        .unwrap();
        assert_eq!(shared.http.cell_in_flight_max(3), 100);
        assert_eq!(
            Settings::from_flags(&Flags::default())
                .unwrap()
                .http
                .cell_in_flight_max(3),
            HttpLimits::default().connections_max / 3
        );
        let set = Settings::from_flags(&server(ServerFlags {
            http_connections_max: Some(300),
            cell_in_flight_max: Some(7),
            ..ServerFlags::default()
        }))
        .unwrap();
        assert_eq!(set.http.cell_in_flight_max(3), 7);
        let refused = Settings::from_flags(&server(ServerFlags {
            cell_in_flight_max: Some(0),
            ..ServerFlags::default()
        }))
        .unwrap_err()
        .to_string();
        assert!(refused.contains(CELL_IN_FLIGHT_MAX_ENV), "{refused}");
    }

    #[test]
    fn a_value_that_does_not_parse_names_its_variable() {
        let flags = Flags {
            server: ServerFlags {
                rate_per_second: Some("ten".into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        let refused = Settings::from_flags(&flags).unwrap_err().to_string();
        assert!(refused.contains(RATE_PER_SECOND_ENV), "{refused}");
    }
}
