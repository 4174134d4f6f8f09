//! The one `Settings` of the `ledger` binary: everything configurable, read once at start from
//! the command line and the environment (clap's `env` attributes; the variable names are the
//! contract the README and the tests use) and passed explicitly to whatever needs it. No library
//! crate reads the environment; this is the only place that does (with `spot_core::Args` for the
//! engine's own binary).

use std::time::Duration;

use application::horizon::{self, HorizonConfig};
use application::FailPoints;
use recovery::{RecoveryConfig, RecoveryOverrides};

use crate::config::{self, JwtSecret, SecretSource};
use crate::ratelimit::LimitsConfig;

/// How often the periodic conservation check runs, unless configured otherwise.
pub const AUDIT_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// Where `/metrics` is served unless configured otherwise: loopback only, the port Prometheus
/// exporters conventionally use for an application's own metrics.
pub const METRICS_LISTEN_DEFAULT: &str = "127.0.0.1:9464";

/// Where `/metrics` is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsListen {
    /// On the API's own address (`--metrics-listen api`), as before there was a choice.
    Api,
    /// On an address of its own and not on the API's; `explicit` when the setting named it (a
    /// failed bind is then an error; the default's only a warning, see `cli.rs`).
    Address { addr: String, explicit: bool },
}

/// Settings shared by every `ledger` command. Each may be given as a flag or in its environment
/// variable; an empty variable counts as unset.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Settings {
    /// PostgreSQL URL; the local default when unset.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Where `ledger up` finds PostgreSQL when `DATABASE_URL` is unset (`private_pg.rs`).
    #[command(flatten)]
    pub pg_search: crate::private_pg::PgSearch,
    /// The HS256 secret tokens are signed with (at least 32 bytes).
    #[arg(long, global = true, env = config::JWT_SECRET_ENV, hide = true, hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// The token a spot-core client presents (`hello`).
    #[arg(long, global = true, env = spot_core::TOKEN_ENV, hide = true, hide_env_values = true)]
    pub spot_core_token: Option<String>,
    /// Transfer requests per second per user; `0` or `off` turns the limit off.
    #[arg(long, global = true, env = crate::ratelimit::RATE_PER_SECOND_ENV)]
    pub rate_per_second: Option<String>,
    /// Transfers per user and UTC day; `0` or `off` turns the limit off.
    #[arg(long, global = true, env = crate::ratelimit::DAILY_COUNT_MAX_ENV)]
    pub daily_count_max: Option<String>,
    /// Amount per user, asset and UTC day, as a JSON object `{"USDT": "1000000", ...}`.
    #[arg(long, global = true, env = crate::ratelimit::DAILY_AMOUNT_MAX_ENV)]
    pub daily_amount_max: Option<String>,
    /// The most transfers one `POST /api/v1/internal_transfers` may carry (1,000 by default; see
    /// `application::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT` for why); a larger batch is
    /// refused whole.
    #[arg(long, global = true, env = "LEDGER_BULK_TRANSFERS_MAX", value_parser = bulk_max)]
    pub bulk_transfers_max: Option<usize>,
    /// How long (ms) a transfer sits unchanged before the recovery worker touches it.
    #[arg(long, global = true, env = "LEDGER_RECOVERY_STALE_MS")]
    pub recovery_stale_ms: Option<String>,
    /// Time (ms) between recovery passes.
    #[arg(long, global = true, env = "LEDGER_RECOVERY_INTERVAL_MS")]
    pub recovery_interval_ms: Option<String>,
    /// How long (ms) a recovery claim holds without renewal.
    #[arg(long, global = true, env = "LEDGER_RECOVERY_LEASE_MS")]
    pub recovery_lease_ms: Option<String>,
    /// Most transfers claimed in one recovery pass.
    #[arg(long, global = true, env = "LEDGER_RECOVERY_BATCH_MAX")]
    pub recovery_batch_max: Option<String>,
    /// First retry delay (ms) after an unknown outcome.
    #[arg(long, global = true, env = "LEDGER_RETRY_BACKOFF_MS_BASE")]
    pub retry_backoff_ms_base: Option<String>,
    /// Longest retry delay (ms).
    #[arg(long, global = true, env = "LEDGER_RETRY_BACKOFF_MS_MAX")]
    pub retry_backoff_ms_max: Option<String>,
    /// MON-001: a transfer in TARGET_PENDING longer than this (ms) raises a CRITICAL alert.
    #[arg(long, global = true, env = "LEDGER_ALERT_TARGET_PENDING_MS")]
    pub alert_target_pending_ms: Option<String>,
    /// Seconds between periodic conservation checks (default 60).
    #[arg(long, global = true, env = "LEDGER_INVARIANT_INTERVAL_SECS")]
    pub invariant_interval_secs: Option<String>,
    /// How long (s) spot-core remembers a req_id at least (the idempotency horizon's retention;
    /// default 604800, at least 1).
    #[arg(long, global = true, env = "LEDGER_IDEMPOTENCY_RETENTION_SECS")]
    pub idempotency_retention_secs: Option<String>,
    /// Time (ms) between two advances of spot-core's idempotency horizon (default 60000).
    #[arg(long, global = true, env = "LEDGER_HORIZON_INTERVAL_MS")]
    pub horizon_interval_ms: Option<String>,
    /// Longest wait (ms) for a request's headers, new or idle connection alike (default 10000).
    #[arg(long, global = true, env = "LEDGER_HTTP_HEADER_TIMEOUT_MS")]
    pub http_header_timeout_ms: Option<u64>,
    /// Longest a request may take to be received and answered, body included (ms, default
    /// 30000).
    #[arg(long, global = true, env = "LEDGER_HTTP_REQUEST_TIMEOUT_MS")]
    pub http_request_timeout_ms: Option<u64>,
    /// Connections open at once (default 4096).
    #[arg(long, global = true, env = "LEDGER_HTTP_CONNECTIONS_MAX")]
    pub http_connections_max: Option<usize>,
    /// Connections open at once from one IP address (default 256).
    #[arg(long, global = true, env = "LEDGER_HTTP_CONNECTIONS_PER_ADDRESS_MAX")]
    pub http_connections_per_address_max: Option<usize>,
    /// Where `/metrics` is served: HOST:PORT (not on the API's address then), or `api` for the
    /// API's address (default 127.0.0.1:9464).
    #[arg(long, global = true, env = "LEDGER_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// MON-004: transfer requests per user in a sliding minute above which a WARNING alert is
    /// raised (default 300; `0` or `off`: none).
    #[arg(long, global = true, env = "LEDGER_ALERT_REQUESTS_PER_MINUTE")]
    pub alert_requests_per_minute: Option<String>,
    /// MON-004: rate-limit refusals per user in a sliding minute above which a WARNING alert is
    /// raised (default 30; `0` or `off`: none).
    #[arg(long, global = true, env = "LEDGER_ALERT_REFUSALS_PER_MINUTE")]
    pub alert_refusals_per_minute: Option<String>,
    /// Idle time (ms) before a spot-core or PostgreSQL connection is probed by TCP keepalive
    /// (default 4000; unanswered probes end it once `TCP_USER_TIMEOUT` passed).
    #[arg(long, global = true, env = "LEDGER_TCP_KEEPALIVE_MS")]
    pub tcp_keepalive_ms: Option<u64>,
    /// How long (ms) sent data may stay unacknowledged before the connection is given up
    /// (`TCP_USER_TIMEOUT`, default 10000).
    #[arg(long, global = true, env = "LEDGER_TCP_USER_TIMEOUT_MS")]
    pub tcp_user_timeout_ms: Option<u64>,
    /// PostgreSQL ends a session idle inside a transaction this long (ms, default 60000).
    #[arg(long, global = true, env = "LEDGER_DB_IDLE_IN_TRANSACTION_MS")]
    pub db_idle_in_transaction_ms: Option<u64>,
    /// The crash tests' fail point to arm (CRA-001..006).
    #[arg(long, global = true, env = "LEDGER_FAILPOINT", hide = true)]
    pub failpoint: Option<String>,
}

/// A value that is set and not blank.
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.trim().is_empty())
}

impl Settings {
    /// `DATABASE_URL`, or the local default when unset.
    pub fn database_url(&self) -> String {
        given(&self.database_url)
            .map_or_else(|| schema::DEFAULT_DATABASE_URL.to_owned(), str::to_owned)
    }

    /// `LEDGER_JWT_SECRET`, if set.
    pub fn jwt_secret(&self) -> anyhow::Result<Option<JwtSecret>> {
        given(&self.jwt_secret)
            .map(|value| {
                Ok(JwtSecret {
                    bytes: config::checked_secret(value, config::JWT_SECRET_ENV)?,
                    source: SecretSource::Environment,
                })
            })
            .transpose()
    }

    /// `SPOT_CORE_TOKEN`, if set. Set but empty is an error: it would silently turn
    /// authentication off.
    pub fn spot_core_token(&self) -> anyhow::Result<Option<String>> {
        self.spot_core_token
            .as_deref()
            .map(|v| spot_core::checked_token(v, spot_core::TOKEN_ENV))
            .transpose()
    }

    /// The seed defaults (10 requests per second, 100 transfers a day), overridden by the limit
    /// settings.
    pub fn limits(&self) -> anyhow::Result<LimitsConfig> {
        LimitsConfig::from_settings(
            given(&self.rate_per_second),
            given(&self.daily_count_max),
            given(&self.daily_amount_max),
        )
    }

    /// The recovery worker's configuration: the defaults, overridden by the recovery settings. A
    /// malformed value is ignored with a warning.
    pub fn recovery(&self) -> RecoveryConfig {
        let ms = |name: &str, value: &Option<String>| -> Option<u64> {
            let text = given(value)?;
            match text.trim().parse::<u64>() {
                Ok(v) => Some(v),
                Err(_) => {
                    tracing::warn!(%name, value = %text, "ignoring malformed setting");
                    None
                }
            }
        };
        RecoveryConfig::with_overrides(&RecoveryOverrides {
            stale_ms: ms("LEDGER_RECOVERY_STALE_MS", &self.recovery_stale_ms),
            interval_ms: ms("LEDGER_RECOVERY_INTERVAL_MS", &self.recovery_interval_ms),
            lease_ms: ms("LEDGER_RECOVERY_LEASE_MS", &self.recovery_lease_ms),
            batch_max: ms("LEDGER_RECOVERY_BATCH_MAX", &self.recovery_batch_max),
            backoff_ms_base: ms("LEDGER_RETRY_BACKOFF_MS_BASE", &self.retry_backoff_ms_base),
            backoff_ms_max: ms("LEDGER_RETRY_BACKOFF_MS_MAX", &self.retry_backoff_ms_max),
            alert_target_pending_ms: ms(
                "LEDGER_ALERT_TARGET_PENDING_MS",
                &self.alert_target_pending_ms,
            ),
        })
    }

    /// Time between periodic conservation checks: the setting when it is a positive number
    /// of seconds, else the default.
    pub fn audit_interval(&self) -> Duration {
        given(&self.invariant_interval_secs)
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map_or(AUDIT_INTERVAL_DEFAULT, Duration::from_secs)
    }

    /// The idempotency horizon's retention and interval: the defaults, overridden by the
    /// settings. A malformed value, a retention under `horizon::RETENTION_MIN` or a zero
    /// interval is an error (a typo must not forget keys early or never advance).
    pub fn horizon(&self) -> anyhow::Result<HorizonConfig> {
        let number = |name: &str, value: &Option<String>| -> anyhow::Result<Option<u64>> {
            given(value)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| anyhow::anyhow!("{name} must be a whole number, not {v:?}"))
                })
                .transpose()
        };
        let mut config = HorizonConfig::default();
        if let Some(secs) = number(
            "LEDGER_IDEMPOTENCY_RETENTION_SECS",
            &self.idempotency_retention_secs,
        )? {
            config.retention = Duration::from_secs(secs);
            anyhow::ensure!(
                config.retention >= horizon::RETENTION_MIN,
                "LEDGER_IDEMPOTENCY_RETENTION_SECS must be at least {} s: it must exceed the time \
                 from a req_id's generation to its transfer's creation",
                horizon::RETENTION_MIN.as_secs()
            );
        }
        if let Some(ms) = number("LEDGER_HORIZON_INTERVAL_MS", &self.horizon_interval_ms)? {
            anyhow::ensure!(ms > 0, "LEDGER_HORIZON_INTERVAL_MS must be positive");
            config.interval = Duration::from_millis(ms);
        }
        Ok(config)
    }

    /// The HTTP server's timeouts and caps: the defaults, with the HTTP settings laid over them.
    pub fn http_limits(&self) -> anyhow::Result<crate::http_server::HttpLimits> {
        let positive = |name: &str, value: Option<u64>| -> anyhow::Result<Option<u64>> {
            match value {
                Some(0) => anyhow::bail!("{name} must be a positive integer"),
                other => Ok(other),
            }
        };
        let mut limits = crate::http_server::HttpLimits::default();
        if let Some(ms) = positive("LEDGER_HTTP_HEADER_TIMEOUT_MS", self.http_header_timeout_ms)? {
            limits.header_read_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = positive(
            "LEDGER_HTTP_REQUEST_TIMEOUT_MS",
            self.http_request_timeout_ms,
        )? {
            limits.request_timeout = Duration::from_millis(ms);
        }
        let count = |v: Option<usize>| v.map(|n| n as u64);
        if let Some(n) = positive(
            "LEDGER_HTTP_CONNECTIONS_MAX",
            count(self.http_connections_max),
        )? {
            limits.connections_max = usize::try_from(n)?;
        }
        let per_address = count(self.http_connections_per_address_max);
        if let Some(n) = positive("LEDGER_HTTP_CONNECTIONS_PER_ADDRESS_MAX", per_address)? {
            limits.connections_per_address_max = usize::try_from(n)?;
        }
        Ok(limits)
    }

    /// Where `/metrics` is served (`METRICS_LISTEN_DEFAULT` when unset).
    pub fn metrics_listen(&self) -> MetricsListen {
        match given(&self.metrics_listen).map(str::trim) {
            Some(v) if v.eq_ignore_ascii_case("api") => MetricsListen::Api,
            Some(v) => MetricsListen::Address {
                addr: v.to_owned(),
                explicit: true,
            },
            None => MetricsListen::Address {
                addr: METRICS_LISTEN_DEFAULT.to_owned(),
                explicit: false,
            },
        }
    }

    /// MON-004's thresholds: the defaults, overridden by the alert settings (`0` or `off` turns
    /// one off); anything else is an error.
    pub fn frequency(&self) -> anyhow::Result<application::alerts::FrequencyConfig> {
        let threshold = |name: &str,
                         value: &Option<String>,
                         default: Option<u32>|
         -> anyhow::Result<Option<u32>> {
            let Some(text) = given(value).map(str::trim) else {
                return Ok(default);
            };
            if text.eq_ignore_ascii_case("off") {
                return Ok(None);
            }
            let n: u32 = text.parse().map_err(|_| {
                anyhow::anyhow!("{name} must be a whole number or `off`, not {text:?}")
            })?;
            Ok((n > 0).then_some(n))
        };
        let defaults = application::alerts::FrequencyConfig::default();
        Ok(application::alerts::FrequencyConfig {
            requests_per_minute: threshold(
                "LEDGER_ALERT_REQUESTS_PER_MINUTE",
                &self.alert_requests_per_minute,
                defaults.requests_per_minute,
            )?,
            refusals_per_minute: threshold(
                "LEDGER_ALERT_REFUSALS_PER_MINUTE",
                &self.alert_refusals_per_minute,
                defaults.refusals_per_minute,
            )?,
        })
    }

    /// The armed fail point, if any.
    pub fn failpoints(&self) -> FailPoints {
        FailPoints::armed(self.failpoint.as_deref())
    }

    /// The keepalive and `TCP_USER_TIMEOUT` of spot-core connections.
    pub fn spot_liveness(&self) -> spot_core::tcp::TcpLiveness {
        let default = spot_core::tcp::TcpLiveness::DEFAULT;
        spot_core::tcp::TcpLiveness {
            keepalive: self
                .tcp_keepalive_ms
                .map_or(default.keepalive, Duration::from_millis),
            user_timeout: (self.tcp_user_timeout_ms)
                .map_or(default.user_timeout, Duration::from_millis),
        }
    }

    /// The same for PostgreSQL connections, with the server's idle-in-transaction bound.
    pub fn db_liveness(&self) -> schema::DbLiveness {
        let spot = self.spot_liveness();
        schema::DbLiveness {
            keepalive: spot.keepalive,
            user_timeout: spot.user_timeout,
            idle_in_transaction: (self.db_idle_in_transaction_ms).map_or(
                schema::DbLiveness::DEFAULT.idle_in_transaction,
                Duration::from_millis,
            ),
        }
    }

    /// The database pool for `connections_max` connections, migrated.
    pub async fn pool(&self, connections_max: u32) -> anyhow::Result<sqlx::PgPool> {
        schema::prepare_with(&self.database_url(), connections_max, self.db_liveness()).await
    }
}

/// `LEDGER_BULK_TRANSFERS_MAX`: 1 to 100,000.
fn bulk_max(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!("must be an integer from 1 to 100000, got {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_values_count_as_unset() {
        let settings = Settings {
            database_url: Some("  ".into()),
            invariant_interval_secs: Some("0".into()),
            ..Settings::default()
        };
        assert_eq!(settings.database_url(), schema::DEFAULT_DATABASE_URL);
        assert_eq!(settings.audit_interval(), AUDIT_INTERVAL_DEFAULT);
        assert_eq!(settings.failpoints(), FailPoints::default());
    }

    #[test]
    fn horizon_settings_default_override_and_refuse_nonsense() {
        assert_eq!(
            Settings::default().horizon().unwrap(),
            HorizonConfig::default()
        );
        let settings = Settings {
            idempotency_retention_secs: Some("5".into()),
            horizon_interval_ms: Some(" 500 ".into()),
            ..Settings::default()
        };
        assert_eq!(
            settings.horizon().unwrap(),
            HorizonConfig {
                retention: Duration::from_secs(5),
                interval: Duration::from_millis(500),
            }
        );
        for (retention, interval) in [("0", "1"), ("x", "1"), ("5", "0"), ("5", "-1")] {
            let settings = Settings {
                idempotency_retention_secs: Some(retention.into()),
                horizon_interval_ms: Some(interval.into()),
                ..Settings::default()
            };
            assert!(settings.horizon().is_err(), "{retention} {interval}");
        }
    }

    #[test]
    fn metrics_listen_defaults_to_loopback_and_takes_api_or_an_address() {
        assert_eq!(
            Settings::default().metrics_listen(),
            MetricsListen::Address {
                addr: METRICS_LISTEN_DEFAULT.into(),
                explicit: false
            }
        );
        let with = |v: &str| Settings {
            metrics_listen: Some(v.into()),
            ..Settings::default()
        };
        assert_eq!(with(" API ").metrics_listen(), MetricsListen::Api);
        assert_eq!(
            with("10.0.0.5:9100").metrics_listen(),
            MetricsListen::Address {
                addr: "10.0.0.5:9100".into(),
                explicit: true
            }
        );
    }

    #[test]
    fn mon_004_thresholds_default_override_and_turn_off() {
        let defaults = Settings::default().frequency().unwrap();
        assert_eq!(defaults, application::alerts::FrequencyConfig::default());
        let settings = Settings {
            alert_requests_per_minute: Some("5".into()),
            alert_refusals_per_minute: Some("off".into()),
            ..Settings::default()
        };
        let config = settings.frequency().unwrap();
        assert_eq!(config.requests_per_minute, Some(5));
        assert_eq!(config.refusals_per_minute, None);
        let bad = Settings {
            alert_requests_per_minute: Some("-1".into()),
            ..Settings::default()
        };
        assert!(bad.frequency().is_err());
    }

    #[test]
    fn recovery_settings_override_and_clamp() {
        let settings = Settings {
            recovery_interval_ms: Some("1".into()),
            retry_backoff_ms_base: Some("nonsense".into()),
            ..Settings::default()
        };
        let config = settings.recovery();
        assert_eq!(config.interval, Duration::from_millis(10));
        assert_eq!(
            config.backoff_ms_base,
            RecoveryConfig::default().backoff_ms_base
        );
    }
}
