//! Each group of the settings read from the flags (`flags.rs`) into its typed value, with a
//! clear error naming the variable for a value that does not parse. `Settings::from_flags`
//! calls each of these once, at start-up.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{self, JwtSecret, SecretSource};
use anyhow::{bail, Context};
use application::horizon::{self, HorizonConfig};
use domain::{Amount, AssetSymbol};
use edge::ratelimit::LimitsConfig;
use recovery::{RecoveryConfig, RecoveryOverrides};

use super::flags::{
    Flags, CELL_IN_FLIGHT_MAX_ENV, CELL_MAP_ENV, DAILY_AMOUNT_MAX_ENV, DAILY_COUNT_MAX_ENV,
    RATE_PER_SECOND_ENV,
};
use super::{MetricsListen, AUDIT_INTERVAL_DEFAULT, METRICS_LISTEN_DEFAULT};

/// A value that is set and not blank.
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.trim().is_empty())
}

impl Flags {
    /// `DATABASE_URL`, or the local default when unset.
    pub(super) fn database_url(&self) -> String {
        given(&self.database.database_url)
            .map_or_else(|| schema::DEFAULT_DATABASE_URL.to_owned(), str::to_owned)
    }

    /// The cell map `LEDGER_CELL_MAP` names, read and validated; `None` when unset (one cell).
    pub(super) fn cell_map(&self) -> anyhow::Result<Option<cells::CellMap>> {
        let Some(path) = self
            .cells
            .cell_map
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
        else {
            return Ok(None);
        };
        let format = cells::MapFormat::of_path(path).context(CELL_MAP_ENV)?;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{CELL_MAP_ENV}: reading {}", path.display()))?;
        let map = cells::CellMap::parse(&text, format)
            .with_context(|| format!("{CELL_MAP_ENV}: {}", path.display()))?;
        Ok(Some(map))
    }

    /// `LEDGER_JWT_SECRET`, if set.
    pub(super) fn jwt_secret(&self) -> anyhow::Result<Option<JwtSecret>> {
        given(&self.secrets.jwt_secret)
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
    pub(super) fn spot_core_token(&self) -> anyhow::Result<Option<String>> {
        self.secrets
            .spot_core_token
            .as_deref()
            .map(|v| spot_core::checked_token(v, spot_core::TOKEN_ENV))
            .transpose()
    }

    /// The defaults of contract §5.4 (10 requests per second, 100 transfers a day), overridden by the limit
    /// settings.
    pub(super) fn limits(&self) -> anyhow::Result<LimitsConfig> {
        let mut limits = LimitsConfig::seed_defaults();
        if let Some(v) = given(&self.server.rate_per_second) {
            limits.requests_per_second = parse_limit(v, RATE_PER_SECOND_ENV)?;
        }
        if let Some(v) = given(&self.server.daily_count_max) {
            limits.daily.count_max = parse_limit::<u64>(v, DAILY_COUNT_MAX_ENV)?;
        }
        if let Some(v) = given(&self.server.daily_amount_max) {
            limits.daily.amount_max = parse_amounts(v)?;
        }
        Ok(limits)
    }

    /// The recovery worker's configuration: the defaults, overridden by the recovery settings
    /// (`RecoveryConfig::with_overrides` clamps each to its bounds). A value that is not a whole
    /// number is an error: a typo must not leave a default in force unseen.
    pub(super) fn recovery(&self) -> anyhow::Result<RecoveryConfig> {
        let ms = |name: &str, value: &Option<String>| -> anyhow::Result<Option<u64>> {
            given(value)
                .map(|text| {
                    text.trim().parse::<u64>().map_err(|_| {
                        anyhow::anyhow!(
                            "{name} must be a whole number of milliseconds, not {text:?}"
                        )
                    })
                })
                .transpose()
        };
        Ok(RecoveryConfig::with_overrides(&RecoveryOverrides {
            stale_ms: ms("LEDGER_RECOVERY_STALE_MS", &self.server.recovery_stale_ms)?,
            interval_ms: ms(
                "LEDGER_RECOVERY_INTERVAL_MS",
                &self.server.recovery_interval_ms,
            )?,
            lease_ms: ms("LEDGER_RECOVERY_LEASE_MS", &self.server.recovery_lease_ms)?,
            batch_max: ms("LEDGER_RECOVERY_BATCH_MAX", &self.server.recovery_batch_max)?,
            backoff_ms_base: ms(
                "LEDGER_RETRY_BACKOFF_MS_BASE",
                &self.server.retry_backoff_ms_base,
            )?,
            backoff_ms_max: ms(
                "LEDGER_RETRY_BACKOFF_MS_MAX",
                &self.server.retry_backoff_ms_max,
            )?,
            alert_target_pending_ms: ms(
                "LEDGER_ALERT_TARGET_PENDING_MS",
                &self.server.alert_target_pending_ms,
            )?,
        }))
    }

    /// Time between periodic conservation checks: the setting's whole seconds, the default
    /// when unset or `0`; anything else is an error.
    pub(super) fn audit_interval(&self) -> anyhow::Result<Duration> {
        let Some(text) = given(&self.server.invariant_interval_secs) else {
            return Ok(AUDIT_INTERVAL_DEFAULT);
        };
        let secs = text.trim().parse::<u64>().map_err(|_| {
            anyhow::anyhow!("LEDGER_INVARIANT_INTERVAL_SECS must be a whole number, not {text:?}")
        })?;
        Ok(match secs {
            0 => AUDIT_INTERVAL_DEFAULT,
            secs => Duration::from_secs(secs),
        })
    }

    /// The idempotency horizon's retention and interval: the defaults, overridden by the
    /// settings. A malformed value, a retention under `horizon::RETENTION_MIN` or a zero
    /// interval is an error (a typo must not forget keys early or never advance).
    pub(super) fn horizon(&self) -> anyhow::Result<HorizonConfig> {
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
            &self.server.idempotency_retention_secs,
        )? {
            config.retention = Duration::from_secs(secs);
            anyhow::ensure!(
                config.retention >= horizon::RETENTION_MIN,
                "LEDGER_IDEMPOTENCY_RETENTION_SECS must be at least {} s: it must exceed the time \
                 from a req_id's generation to its transfer's creation",
                horizon::RETENTION_MIN.as_secs()
            );
        }
        if let Some(ms) = number(
            "LEDGER_HORIZON_INTERVAL_MS",
            &self.server.horizon_interval_ms,
        )? {
            anyhow::ensure!(ms > 0, "LEDGER_HORIZON_INTERVAL_MS must be positive");
            config.interval = Duration::from_millis(ms);
        }
        Ok(config)
    }

    /// The HTTP server's timeouts and caps: the defaults, with the HTTP settings laid over them.
    pub(super) fn http_limits(&self) -> anyhow::Result<edge::http_server::HttpLimits> {
        let positive = |name: &str, value: Option<u64>| -> anyhow::Result<Option<u64>> {
            match value {
                Some(0) => anyhow::bail!("{name} must be a positive integer"),
                other => Ok(other),
            }
        };
        let mut limits = edge::http_server::HttpLimits::default();
        if let Some(ms) = positive(
            "LEDGER_HTTP_HEADER_TIMEOUT_MS",
            self.server.http_header_timeout_ms,
        )? {
            limits.header_read_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = positive(
            "LEDGER_HTTP_REQUEST_TIMEOUT_MS",
            self.server.http_request_timeout_ms,
        )? {
            limits.request_timeout = Duration::from_millis(ms);
        }
        let count = |v: Option<usize>| v.map(|n| n as u64);
        if let Some(n) = positive(
            "LEDGER_HTTP_CONNECTIONS_MAX",
            count(self.server.http_connections_max),
        )? {
            limits.connections_max = usize::try_from(n)?;
        }
        let per_address = count(self.server.http_connections_per_address_max);
        if let Some(n) = positive("LEDGER_HTTP_CONNECTIONS_PER_ADDRESS_MAX", per_address)? {
            limits.connections_per_address_max = usize::try_from(n)?;
        }
        Ok(limits)
    }

    /// Each cell's bulkhead under a cell map, when given (`None`: the connections cap shared
    /// evenly, `HttpSettings::cell_in_flight_max`); 0 is refused.
    pub(super) fn cell_in_flight_max(&self) -> anyhow::Result<Option<usize>> {
        match self.server.cell_in_flight_max {
            Some(0) => anyhow::bail!("{CELL_IN_FLIGHT_MAX_ENV} must be a positive integer"),
            other => Ok(other),
        }
    }

    /// Where `/metrics` is served (`METRICS_LISTEN_DEFAULT` when unset).
    pub(super) fn metrics_listen(&self) -> MetricsListen {
        match given(&self.server.metrics_listen).map(str::trim) {
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
    pub(super) fn frequency(&self) -> anyhow::Result<application::alerts::FrequencyConfig> {
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
                &self.server.alert_requests_per_minute,
                defaults.requests_per_minute,
            )?,
            refusals_per_minute: threshold(
                "LEDGER_ALERT_REFUSALS_PER_MINUTE",
                &self.server.alert_refusals_per_minute,
                defaults.refusals_per_minute,
            )?,
        })
    }

    /// The keepalive and `TCP_USER_TIMEOUT` of spot-core connections.
    pub(super) fn spot_liveness(&self) -> liveness::TcpLiveness {
        let default = liveness::TcpLiveness::DEFAULT;
        liveness::TcpLiveness {
            keepalive: self
                .database
                .tcp_keepalive_ms
                .map_or(default.keepalive, Duration::from_millis),
            user_timeout: (self.database.tcp_user_timeout_ms)
                .map_or(default.user_timeout, Duration::from_millis),
        }
    }

    /// The same for PostgreSQL connections, with the server's idle-in-transaction bound.
    pub(super) fn db_liveness(&self) -> schema::DbLiveness {
        schema::DbLiveness {
            tcp: self.spot_liveness(),
            idle_in_transaction: (self.database.db_idle_in_transaction_ms).map_or(
                schema::DbLiveness::DEFAULT.idle_in_transaction,
                Duration::from_millis,
            ),
        }
    }
}

/// A per-second or daily count limit: a whole number (`0` turns it off) or `off`.
fn parse_limit<T: std::str::FromStr + PartialEq + Default>(
    text: &str,
    name: &str,
) -> anyhow::Result<Option<T>> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let Ok(n) = text.parse::<T>() else {
        bail!("{name} must be a non-negative integer or `off`, got {text:?}");
    };
    Ok((n != T::default()).then_some(n))
}

/// The daily amount limits: a JSON object of asset to amount string.
fn parse_amounts(text: &str) -> anyhow::Result<BTreeMap<AssetSymbol, rust_decimal::Decimal>> {
    let raw: BTreeMap<String, String> = serde_json::from_str(text).with_context(|| {
        format!("{DAILY_AMOUNT_MAX_ENV} must be a JSON object of asset to amount string")
    })?;
    let mut out = BTreeMap::new();
    for (asset, amount) in raw {
        let symbol = AssetSymbol::parse(&asset)
            .map_err(|_| anyhow::anyhow!("{DAILY_AMOUNT_MAX_ENV}: bad asset {asset:?}"))?;
        let amount = Amount::parse(&amount)
            .map_err(|c| anyhow::anyhow!("{DAILY_AMOUNT_MAX_ENV}: {asset}: {c}"))?;
        out.insert(symbol, amount.value());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::flags::{DatabaseFlags, ServerFlags};
    use application::FailPoints;

    #[test]
    fn blank_values_count_as_unset() {
        let settings = Flags {
            database: DatabaseFlags {
                database_url: Some("  ".into()),
                ..DatabaseFlags::default()
            },
            server: ServerFlags {
                invariant_interval_secs: Some("0".into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        assert_eq!(settings.database_url(), schema::DEFAULT_DATABASE_URL);
        assert_eq!(settings.audit_interval().unwrap(), AUDIT_INTERVAL_DEFAULT);
        assert_eq!(settings.failpoints().unwrap(), FailPoints::default());
    }

    #[test]
    fn horizon_settings_default_override_and_refuse_nonsense() {
        assert_eq!(
            Flags::default().horizon().unwrap(),
            HorizonConfig::default()
        );
        let settings = Flags {
            server: ServerFlags {
                idempotency_retention_secs: Some("5".into()),
                horizon_interval_ms: Some(" 500 ".into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        assert_eq!(
            settings.horizon().unwrap(),
            HorizonConfig {
                retention: Duration::from_secs(5),
                interval: Duration::from_millis(500),
            }
        );
        for (retention, interval) in [("0", "1"), ("x", "1"), ("5", "0"), ("5", "-1")] {
            let settings = Flags {
                server: ServerFlags {
                    idempotency_retention_secs: Some(retention.into()),
                    horizon_interval_ms: Some(interval.into()),
                    ..ServerFlags::default()
                },
                ..Flags::default()
            };
            assert!(settings.horizon().is_err(), "{retention} {interval}");
        }
    }

    #[test]
    fn metrics_listen_defaults_to_loopback_and_takes_api_or_an_address() {
        assert_eq!(
            Flags::default().metrics_listen(),
            MetricsListen::Address {
                addr: METRICS_LISTEN_DEFAULT.into(),
                explicit: false
            }
        );
        let with = |v: &str| Flags {
            server: ServerFlags {
                metrics_listen: Some(v.into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
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
        let defaults = Flags::default().frequency().unwrap();
        assert_eq!(defaults, application::alerts::FrequencyConfig::default());
        let settings = Flags {
            server: ServerFlags {
                alert_requests_per_minute: Some("5".into()),
                alert_refusals_per_minute: Some("off".into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        let config = settings.frequency().unwrap();
        assert_eq!(config.requests_per_minute, Some(5));
        assert_eq!(config.refusals_per_minute, None);
        let bad = Flags {
            server: ServerFlags {
                alert_requests_per_minute: Some("-1".into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        assert!(bad.frequency().is_err());
    }

    #[test]
    fn recovery_settings_override_clamp_and_refuse_nonsense() {
        let settings = Flags {
            server: ServerFlags {
                recovery_interval_ms: Some("1".into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        let config = settings.recovery().unwrap();
        assert_eq!(config.interval, Duration::from_millis(10));
        assert_eq!(
            config.backoff_ms_base,
            RecoveryConfig::default().backoff_ms_base
        );
        let nonsense = Flags {
            server: ServerFlags {
                retry_backoff_ms_base: Some("nonsense".into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        let refused = nonsense.recovery().unwrap_err().to_string();
        assert!(
            refused.contains("LEDGER_RETRY_BACKOFF_MS_BASE"),
            "{refused}"
        );
    }

    #[test]
    fn the_audit_interval_takes_seconds_and_refuses_nonsense() {
        let with = |v: &str| Flags {
            server: ServerFlags {
                invariant_interval_secs: Some(v.into()),
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        assert_eq!(with("5").audit_interval().unwrap(), Duration::from_secs(5));
        assert!(with("five").audit_interval().is_err());
    }

    #[test]
    fn limits_parse_from_text() {
        assert_eq!(parse_limit::<u32>("10", "X").unwrap(), Some(10));
        assert_eq!(parse_limit::<u32>("0", "X").unwrap(), None);
        assert_eq!(parse_limit::<u32>("off", "X").unwrap(), None);
        assert!(parse_limit::<u32>("-1", "X").is_err());
        let amounts = parse_amounts(r#"{"USDT": "1000.5"}"#).unwrap();
        assert_eq!(amounts.len(), 1);
        assert!(parse_amounts(r#"{"USDT": 1000}"#).is_err());
        assert!(parse_amounts(r#"{"usdt": "1"}"#).is_err());
    }

    #[test]
    fn a_fail_point_needs_a_known_name_and_the_opt_in() {
        use application::FailPoint;
        let armed = |name: &str, allow: bool| Flags {
            server: ServerFlags {
                failpoint: Some(name.into()),
                allow_failpoints: allow,
                ..ServerFlags::default()
            },
            ..Flags::default()
        };
        let unknown = armed("after_int", true).failpoints().unwrap_err();
        assert!(
            unknown.to_string().contains("unknown fail point"),
            "{unknown}"
        );
        let refused = armed("target_after_call", false).failpoints().unwrap_err();
        assert!(
            refused.to_string().contains("--allow-failpoints"),
            "{refused}"
        );
        let point = armed("target_after_call", true).failpoints().unwrap();
        assert!(point.is_armed(FailPoint::TargetAfterCall));
    }

    #[test]
    fn the_fail_point_opt_in_is_a_flag() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            flags: ServerFlags,
        }
        let parsed = Cli::try_parse_from(["ledger", "--allow-failpoints"]).unwrap();
        assert!(parsed.flags.allow_failpoints);
        let parsed = Cli::try_parse_from(["ledger"]).unwrap();
        assert!(!parsed.flags.allow_failpoints);
    }
}
