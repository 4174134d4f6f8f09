//! spot-core's own reading of the standard `OTEL_*` variables (its binary has its own `Args`;
//! no library reads them): with an endpoint set, its spans (each traced request's WAL append,
//! each batch's sync) go over OTLP as `service.name` `spot-core` unless `OTEL_SERVICE_NAME` says
//! otherwise. See `docs/adr/0018-traces.md`.

/// `service.name` unless `OTEL_SERVICE_NAME` is set.
pub const SERVICE_NAME: &str = "spot-core";

/// The `OTEL_*` variables spot-core reads (flags `--otlp-*` for tests and tools).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TraceArgs {
    #[arg(long = "otlp-sdk-disabled", env = "OTEL_SDK_DISABLED", hide = true)]
    pub otlp_sdk_disabled: Option<String>,
    #[arg(
        long = "otlp-traces-exporter",
        env = "OTEL_TRACES_EXPORTER",
        hide = true
    )]
    pub otlp_traces_exporter: Option<String>,
    /// The OTLP collector's base URL; unset: no traces are exported.
    #[arg(long = "otlp-endpoint", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// The OTLP traces URL itself (wins over the base URL).
    #[arg(
        long = "otlp-traces-endpoint",
        env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )]
    pub otlp_traces_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (default).
    #[arg(long = "otlp-protocol", env = "OTEL_EXPORTER_OTLP_PROTOCOL")]
    pub otlp_protocol: Option<String>,
    #[arg(
        long = "otlp-traces-protocol",
        env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        hide = true
    )]
    pub otlp_traces_protocol: Option<String>,
    /// `service.name` of the exported spans (default `spot-core`).
    #[arg(long = "otlp-service-name", env = "OTEL_SERVICE_NAME")]
    pub otlp_service_name: Option<String>,
    #[arg(long = "otlp-sampler", env = "OTEL_TRACES_SAMPLER", hide = true)]
    pub otlp_sampler: Option<String>,
    #[arg(
        long = "otlp-sampler-arg",
        env = "OTEL_TRACES_SAMPLER_ARG",
        hide = true
    )]
    pub otlp_sampler_arg: Option<String>,
    #[arg(
        long = "otlp-timeout-ms",
        env = "OTEL_EXPORTER_OTLP_TIMEOUT",
        hide = true
    )]
    pub otlp_timeout_ms: Option<String>,
    #[arg(
        long = "otlp-schedule-delay-ms",
        env = "OTEL_BSP_SCHEDULE_DELAY",
        hide = true
    )]
    pub otlp_schedule_delay_ms: Option<String>,
}

impl TraceArgs {
    /// The export these variables configure, if any.
    pub fn export(&self) -> anyhow::Result<Option<telemetry::Export>> {
        telemetry::OtelVars {
            sdk_disabled: self.otlp_sdk_disabled.clone(),
            traces_exporter: self.otlp_traces_exporter.clone(),
            endpoint: self.otlp_endpoint.clone(),
            traces_endpoint: self.otlp_traces_endpoint.clone(),
            protocol: self.otlp_protocol.clone(),
            traces_protocol: self.otlp_traces_protocol.clone(),
            service_name: self.otlp_service_name.clone(),
            sampler: self.otlp_sampler.clone(),
            sampler_arg: self.otlp_sampler_arg.clone(),
            timeout_ms: self.otlp_timeout_ms.clone(),
            schedule_delay_ms: self.otlp_schedule_delay_ms.clone(),
        }
        .export(SERVICE_NAME)
        .map_err(anyhow::Error::msg)
    }
}
