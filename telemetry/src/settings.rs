//! The standard `OTEL_*` variables, as each binary's command line read them (the ledger's one
//! `Settings`, spot-core's `Args`), checked into what the exporter is built from. No library
//! reads them on its own: the pipeline (`export.rs`) is given every value explicitly.

use std::time::Duration;

/// How spans travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `grpc`: the OTLP TraceService over HTTP/2 (tonic).
    Grpc,
    /// `http/protobuf`: `POST <endpoint>/v1/traces` with a protobuf body (the OTLP default).
    HttpProtobuf,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    AlwaysOn,
    AlwaysOff,
    /// A share of the traces, 0 to 1, decided by the trace id.
    Ratio(f64),
    /// As the caller's `traceparent` says when there is one, else the inner rule.
    ParentBased(Box<Sampling>),
}

/// An OTLP export, as the settings configured it.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The full URL spans are sent to (for HTTP, with its `/v1/traces` path).
    pub endpoint: String,
    pub protocol: Protocol,
    /// `service.name` of every span this process exports.
    pub service_name: String,
    pub sampling: Sampling,
    /// Longest an export call may take (`OTEL_EXPORTER_OTLP_TIMEOUT`, ms; default 10 s).
    pub timeout: Duration,
    /// Longest a finished span waits before it is sent (`OTEL_BSP_SCHEDULE_DELAY`, ms; default
    /// 1 s).
    pub schedule_delay: Duration,
}

/// The `OTEL_*` variables as given (unset or blank: `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelVars {
    /// `OTEL_SDK_DISABLED`: `true` turns export off whatever else is set.
    pub sdk_disabled: Option<String>,
    /// `OTEL_TRACES_EXPORTER`: `otlp` (the default when an endpoint is set) or `none`.
    pub traces_exporter: Option<String>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector's base URL.
    pub endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: the traces URL itself (wins over `endpoint`).
    pub traces_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or `http/protobuf` (default).
    pub protocol: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (wins over `protocol`).
    pub traces_protocol: Option<String>,
    /// `OTEL_SERVICE_NAME`.
    pub service_name: Option<String>,
    /// `OTEL_TRACES_SAMPLER`.
    pub sampler: Option<String>,
    /// `OTEL_TRACES_SAMPLER_ARG`.
    pub sampler_arg: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` (ms).
    pub timeout_ms: Option<String>,
    /// `OTEL_BSP_SCHEDULE_DELAY` (ms).
    pub schedule_delay_ms: Option<String>,
}

const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
const SCHEDULE_DELAY_DEFAULT: Duration = Duration::from_secs(1);

fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

impl OtelVars {
    /// The export these variables configure, `None` when nothing is to be exported (no endpoint
    /// set, `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`); an error names the variable
    /// whose value is not understood. `default_service` is the binary's own name.
    pub fn export(&self, default_service: &str) -> Result<Option<Export>, String> {
        if given(&self.sdk_disabled).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match given(&self.traces_exporter) {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER: `{other}` is not supported (`otlp` or `none`)"
                ))
            }
        }
        let protocol = match given(&self.traces_protocol).or(given(&self.protocol)) {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL: `{other}` is not supported (`grpc` or \
                     `http/protobuf`)"
                ))
            }
        };
        let endpoint = match (given(&self.traces_endpoint), given(&self.endpoint)) {
            (Some(url), _) => checked_url(url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?.to_owned(),
            (None, Some(base)) => {
                let base = checked_url(base, "OTEL_EXPORTER_OTLP_ENDPOINT")?;
                match protocol {
                    Protocol::Grpc => base.to_owned(),
                    // The specification: the signal's path is appended to the base URL.
                    Protocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
                }
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(Export {
            endpoint,
            protocol,
            service_name: given(&self.service_name)
                .unwrap_or(default_service)
                .to_owned(),
            sampling: self.sampling()?,
            timeout: millis(&self.timeout_ms, "OTEL_EXPORTER_OTLP_TIMEOUT")?
                .unwrap_or(TIMEOUT_DEFAULT),
            schedule_delay: millis(&self.schedule_delay_ms, "OTEL_BSP_SCHEDULE_DELAY")?
                .unwrap_or(SCHEDULE_DELAY_DEFAULT),
        }))
    }

    fn sampling(&self) -> Result<Sampling, String> {
        let ratio = || -> Result<f64, String> {
            match given(&self.sampler_arg) {
                None => Ok(1.0),
                Some(text) => text
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        format!("OTEL_TRACES_SAMPLER_ARG: `{text}` is not a ratio from 0 to 1")
                    }),
            }
        };
        let parent = |inner| Sampling::ParentBased(Box::new(inner));
        Ok(match given(&self.sampler) {
            None | Some("parentbased_always_on") => parent(Sampling::AlwaysOn),
            Some("always_on") => Sampling::AlwaysOn,
            Some("always_off") => Sampling::AlwaysOff,
            Some("traceidratio") => Sampling::Ratio(ratio()?),
            Some("parentbased_always_off") => parent(Sampling::AlwaysOff),
            Some("parentbased_traceidratio") => parent(Sampling::Ratio(ratio()?)),
            Some(other) => return Err(format!("OTEL_TRACES_SAMPLER: `{other}` is not supported")),
        })
    }
}

fn checked_url<'a>(url: &'a str, variable: &str) -> Result<&'a str, String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(url)
    } else {
        Err(format!(
            "{variable}: `{url}` is not an http:// or https:// URL"
        ))
    }
}

fn millis(value: &Option<String>, variable: &str) -> Result<Option<Duration>, String> {
    given(value)
        .map(|text| {
            text.parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| format!("{variable}: `{text}` is not a number of milliseconds"))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_set_exports_nothing() {
        assert_eq!(OtelVars::default().export("ledger"), Ok(None));
        let disabled = OtelVars {
            endpoint: Some("http://127.0.0.1:4318".into()),
            sdk_disabled: Some("true".into()),
            ..OtelVars::default()
        };
        assert_eq!(disabled.export("ledger"), Ok(None));
    }

    #[test]
    fn endpoints_follow_the_specification() {
        let http = OtelVars {
            endpoint: Some("http://collector:4318/".into()),
            ..OtelVars::default()
        };
        let export = http.export("ledger").unwrap().unwrap();
        assert_eq!(export.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(export.protocol, Protocol::HttpProtobuf);
        assert_eq!(export.service_name, "ledger");
        assert_eq!(
            export.sampling,
            Sampling::ParentBased(Box::new(Sampling::AlwaysOn))
        );
        let grpc = OtelVars {
            endpoint: Some("http://collector:4317".into()),
            protocol: Some("grpc".into()),
            service_name: Some("payments".into()),
            ..OtelVars::default()
        };
        let export = grpc.export("ledger").unwrap().unwrap();
        assert_eq!(export.endpoint, "http://collector:4317");
        assert_eq!(export.service_name, "payments");
        let signal = OtelVars {
            endpoint: Some("http://a:4318".into()),
            traces_endpoint: Some("http://b:9999/custom".into()),
            ..OtelVars::default()
        };
        assert_eq!(
            signal.export("x").unwrap().unwrap().endpoint,
            "http://b:9999/custom"
        );
    }

    #[test]
    fn values_not_understood_name_their_variable() {
        let bad = |vars: OtelVars, variable: &str| {
            let refused = vars.export("ledger").unwrap_err();
            assert!(refused.contains(variable), "{refused}");
        };
        let base = OtelVars {
            endpoint: Some("http://c:4318".into()),
            ..OtelVars::default()
        };
        bad(
            OtelVars {
                protocol: Some("http/json".into()),
                ..base.clone()
            },
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        );
        bad(
            OtelVars {
                sampler: Some("traceidratio".into()),
                sampler_arg: Some("2".into()),
                ..base.clone()
            },
            "OTEL_TRACES_SAMPLER_ARG",
        );
        bad(
            OtelVars {
                endpoint: Some("c:4318".into()),
                ..OtelVars::default()
            },
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        );
    }
}
