//! `GET /metrics`: OpenMetrics text exposition (MON-001, MON-002), encoded by `prometheus-client`.
//! Every figure is read from PostgreSQL at scrape time, so all `ledger serve` instances report
//! the same cluster-wide values and nothing is lost when a process restarts. Gathering
//! (`TransferView::metric_figures`, the SQL) and encoding (`Snapshot`'s `Collector`) are kept
//! apart.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use domain::TransferState;
use projections::transfers::MetricFigures as Figures;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::app::AppState;
use crate::error::ApiError;

/// The OpenMetrics text format's media type, what `prometheus_client::encoding::text` writes.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

/// Everything one scrape reports.
#[derive(Debug, Default)]
struct Snapshot {
    /// Transfer counts by state name; a state absent here is reported as 0.
    by_state: Vec<(String, i64)>,
    figures: Figures,
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let (by_state, figures) = state
        .view
        .metric_figures()
        .await
        .map_err(|e| ApiError::Internal(format!("metrics: {e}")))?;
    let snapshot = Snapshot { by_state, figures };
    Ok(([(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], render(snapshot)).into_response())
}

/// The exposition of one snapshot, ending with OpenMetrics' `# EOF`.
fn render(snapshot: Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut out = String::new();
    // Writing to a String cannot fail; a collector error is only a write error.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Descriptors are written as they stand (a collector's help gets no added period). A counter's
/// family name has no `_total`: OpenMetrics adds it to the sample, so the series scraped are
/// the same names as always (`ledger_transfer_retries_total` and so on).
impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = &self.figures;
        let mut by_state = encoder.encode_descriptor(
            "ledger_transfers",
            "Transfers by current state.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for state in TransferState::ALL {
            let count = self
                .by_state
                .iter()
                .find(|(s, _)| s == state.as_str())
                .map_or(0, |(_, n)| *n);
            let labels = [("state", state.as_str())];
            ConstGauge::new(count).encode(by_state.encode_family(&labels)?)?;
        }
        let gauges: [(&str, &str, i64); 3] = [
            (
                "ledger_oldest_stuck_transfer_age_seconds",
                "Age of the oldest transfer in a non-terminal state (0 when none).",
                f.oldest_open_age_seconds,
            ),
            (
                "ledger_oldest_target_pending_age_seconds",
                "Age of the oldest transfer in TARGET_PENDING (MON-001; 0 when none).",
                f.oldest_target_pending_age_seconds,
            ),
            (
                "ledger_recovery_leases_held",
                "Transfers a recovery worker is driving right now.",
                f.leased,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let counters: [(&str, &str, i64); 4] = [
            (
                "ledger_transfer_retries",
                "Recovery attempts made on open transfers.",
                f.retries_total,
            ),
            (
                "ledger_refund_failures",
                "Refund attempts of compensating transfers that did not succeed.",
                f.refund_failures_total,
            ),
            (
                "ledger_alerts_target_pending",
                "CRITICAL MON-001 alerts raised (transfers stuck in TARGET_PENDING).",
                f.stuck_alerts_total,
            ),
            (
                "ledger_alerts_refund_failures",
                "CRITICAL MON-002 alerts raised (refund failed 3 times).",
                f.refund_alerts_total,
            ),
        ];
        for (name, help, value) in counters {
            // Sums and counts of rows are never negative; 0 if the database ever said otherwise.
            let counter = ConstCounter::new(u64::try_from(value).unwrap_or(0));
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_reported_even_at_zero() {
        let text = render(Snapshot {
            by_state: vec![("TARGET_PENDING".into(), 2)],
            figures: Figures::default(),
        });
        assert!(text.contains("ledger_transfers{state=\"TARGET_PENDING\"} 2"));
        assert!(text.contains("ledger_transfers{state=\"COMMITTED\"} 0"));
        // OpenMetrics names a counter's family without `_total`; the sample carries it.
        assert!(text.contains("# TYPE ledger_transfer_retries counter"));
        assert!(text.contains("\nledger_transfer_retries_total 0\n"));
        assert!(text.contains("ledger_refund_failures_total 0"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn names_types_and_help_are_those_scrapers_know() {
        let text = render(Snapshot::default());
        for line in [
            "# HELP ledger_transfers Transfers by current state.",
            "# TYPE ledger_transfers gauge",
            "# TYPE ledger_oldest_stuck_transfer_age_seconds gauge",
            "ledger_oldest_stuck_transfer_age_seconds 0",
            "# TYPE ledger_oldest_target_pending_age_seconds gauge",
            "ledger_oldest_target_pending_age_seconds 0",
            "# TYPE ledger_recovery_leases_held gauge",
            "ledger_recovery_leases_held 0",
            "# HELP ledger_alerts_target_pending CRITICAL MON-001 alerts raised (transfers stuck in TARGET_PENDING).",
            "ledger_alerts_target_pending_total 0",
            "ledger_alerts_refund_failures_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
    }
}
