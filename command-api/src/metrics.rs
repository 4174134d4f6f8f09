//! `GET /metrics`: Prometheus text exposition (MON-001, MON-002). Every figure is read from
//! PostgreSQL at scrape time, so all `ledger serve` instances report the same cluster-wide values
//! and nothing is lost when a process restarts.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use domain::TransferState;
use projections::transfers::MetricFigures as Figures;

use crate::app::AppState;
use crate::error::ApiError;

/// The routes of this module, merged into the app by `build_app`.
pub fn routes() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let internal = |e: sqlx::Error| ApiError::Internal(format!("metrics: {e}"));
    let (by_state, figures) = state.view.metric_figures().await.map_err(internal)?;
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        render(&by_state, &figures),
    )
        .into_response())
}

fn render(by_state: &[(String, i64)], f: &Figures) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail; the results are ignored for that reason only.
    let _ = writeln!(
        out,
        "# HELP ledger_transfers Transfers by current state.\n# TYPE ledger_transfers gauge"
    );
    for state in TransferState::ALL {
        let count = by_state
            .iter()
            .find(|(s, _)| s == state.as_str())
            .map_or(0, |(_, n)| *n);
        let _ = writeln!(out, "ledger_transfers{{state=\"{state}\"}} {count}");
    }
    let gauges: [(&str, &str, &str, i64); 7] = [
        (
            "ledger_oldest_stuck_transfer_age_seconds",
            "gauge",
            "Age of the oldest transfer in a non-terminal state (0 when none).",
            f.oldest_open_age_seconds,
        ),
        (
            "ledger_oldest_target_pending_age_seconds",
            "gauge",
            "Age of the oldest transfer in TARGET_PENDING (MON-001; 0 when none).",
            f.oldest_target_pending_age_seconds,
        ),
        (
            "ledger_transfer_retries_total",
            "counter",
            "Recovery attempts made on open transfers.",
            f.retries_total,
        ),
        (
            "ledger_refund_failures_total",
            "counter",
            "Refund attempts of compensating transfers that did not succeed.",
            f.refund_failures_total,
        ),
        (
            "ledger_alerts_target_pending_total",
            "counter",
            "CRITICAL MON-001 alerts raised (transfers stuck in TARGET_PENDING).",
            f.stuck_alerts_total,
        ),
        (
            "ledger_alerts_refund_failures_total",
            "counter",
            "CRITICAL MON-002 alerts raised (refund failed 3 times).",
            f.refund_alerts_total,
        ),
        (
            "ledger_recovery_leases_held",
            "gauge",
            "Transfers a recovery worker is driving right now.",
            f.leased,
        ),
    ];
    for (name, kind, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_reported_even_at_zero() {
        let text = render(&[("TARGET_PENDING".into(), 2)], &Figures::default());
        assert!(text.contains("ledger_transfers{state=\"TARGET_PENDING\"} 2"));
        assert!(text.contains("ledger_transfers{state=\"COMMITTED\"} 0"));
        assert!(text.contains("# TYPE ledger_transfer_retries_total counter"));
        assert!(text.contains("ledger_refund_failures_total 0"));
    }
}
