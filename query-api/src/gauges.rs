//! The unlabelled gauges `/metrics` writes (`metrics.rs`, `ops_metrics.rs`), one helper below
//! both.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// Writes one unlabelled gauge per `(name, help, value)`.
pub(crate) fn encode_gauges<N>(
    encoder: &mut DescriptorEncoder,
    gauges: &[(&str, &str, N)],
) -> Result<(), std::fmt::Error>
where
    N: prometheus_client::encoding::EncodeGaugeValue + Copy + std::fmt::Debug,
{
    for &(name, help, value) in gauges {
        let gauge = ConstGauge::new(value);
        gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
    }
    Ok(())
}
