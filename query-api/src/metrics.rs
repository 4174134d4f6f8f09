//! `GET /metrics`: OpenMetrics text exposition (MON-001, MON-002, the periodic conservation
//! check's health), encoded by `prometheus-client`.
//! Every figure is read from PostgreSQL at scrape time, so all `ledger serve` instances report
//! the same cluster-wide values and nothing is lost when a process restarts; the idempotency
//! horizon is read from spot-core, which holds it. The exception is the rounds of single
//! requests (`ledger_rounds_total` and its two siblings, ADR 0019): they describe how this
//! process shares its own work, so they are its own counts from its start. Gathering
//! (`TransferView::metric_figures`, the SQL) and encoding (`Snapshot`'s `Collector`) are kept
//! apart.

use std::time::Duration;

use application::reads::{MetricFigures as Figures, RelayStatus};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::Router;
use domain::TransferState;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::gauges::encode_gauges;

use edge::error::ApiError;
use edge::routes::Routes;
use edge::state::AppState;

/// The OpenMetrics text format's media type, what `prometheus_client::encoding::text` writes.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The routes of this module, merged into the app by `build_app` when metrics are served on the
/// API's address. `target_pending_alert_after` is MON-001's threshold (`Serving`), reported as a
/// gauge.
pub fn routes(target_pending_alert_after: Duration) -> Routes {
    Routes::new().page(Method::GET, "/metrics", move |state: State<AppState>| {
        metrics(state, target_pending_alert_after)
    })
}

/// The metrics-only application served on `--metrics-listen`: `/metrics` and nothing else.
pub fn app(state: AppState, target_pending_alert_after: Duration) -> Router {
    routes(target_pending_alert_after)
        .into_router()
        .fallback(edge::health::not_found)
        .with_state(state)
}

/// Everything one scrape reports.
#[derive(Debug, Default)]
struct Snapshot {
    /// Transfer counts by state name; a state absent here is reported as 0.
    by_state: Vec<(String, i64)>,
    figures: Figures,
    /// The JetStream relay of each stream that ever ran (`relay_checkpoint`).
    relays: Vec<RelayStatus>,
    /// The periodic conservation check (`audit_status`).
    audit: application::audit::status::AuditHealth,
    /// spot-core's idempotency horizon (Unix ms), read from spot-core itself; `None` when it did
    /// not answer (the gauge is left out rather than reported wrong).
    horizon_ms: Option<u64>,
    /// The recovery worker's last pass and the projector's lag (`ops_metrics.rs`).
    ops: crate::ops_metrics::OpsFigures,
    /// The alerts' own figures: spot-core's health, the halt flag, MON-004's count.
    health: Health,
    /// This process's rounds of single requests (ADR 0019).
    rounds: application::round::RoundStats,
    /// The cell under HA: synchronous standbys, acknowledging replicas, leaderless time.
    ha: edge::cluster::HaFigures,
}

/// `ledger_spot_core_up`, `ledger_halted` and `ledger_alerts_request_frequency_total`.
#[derive(Debug, Default, Clone, Copy)]
struct Health {
    /// spot-core answered this scrape's `status` call (one round trip, the horizon's read).
    spot_core_up: bool,
    /// The MON-003 halt flag (new transfers refused).
    halted: bool,
    /// MON-004 alerts ever raised (`alert_totals`).
    request_frequency_alerts: i64,
    /// MON-001's threshold this process applies (`LEDGER_ALERT_TARGET_PENDING_MS`), so the
    /// shipped rule compares the age with the same value the log line uses.
    target_pending_threshold_seconds: f64,
}

async fn metrics(
    State(state): State<AppState>,
    target_pending_alert_after: Duration,
) -> Result<Response, ApiError> {
    fn internal(e: impl std::fmt::Display) -> ApiError {
        ApiError::Internal(format!("metrics: {e}"))
    }
    let (by_state, figures) = state
        .reads
        .transfers()
        .metric_figures()
        .await
        .map_err(internal)?;
    let relays = state.reads.relay_status().await.map_err(internal)?;
    let audit = state.queries.audit_health().await.map_err(internal)?;
    let status = state.queries.spot_status().await.ok();
    let horizon_ms = status.as_ref().map(|c| c.horizon_ms);
    let ha = state.cluster.figures(status.as_ref()).await;
    let ops = crate::ops_metrics::gather(&state.reads)
        .await
        .map_err(internal)?;
    let health = Health {
        spot_core_up: horizon_ms.is_some(),
        halted: state.queries.is_halted().await.map_err(internal)?,
        request_frequency_alerts: state
            .queries
            .alerts_total(application::alerts::MON_004)
            .await
            .map_err(internal)?,
        target_pending_threshold_seconds: target_pending_alert_after.as_secs_f64(),
    };
    let snapshot = Snapshot {
        by_state,
        figures,
        relays,
        audit,
        horizon_ms,
        ops,
        health,
        rounds: state.ledger.round_stats(),
        ha,
    };
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
        encode_by_state(&self.by_state, &mut encoder)?;
        encode_figures(&self.figures, &mut encoder)?;
        encode_audit(&self.audit, &mut encoder)?;
        encode_health(self.health, &mut encoder)?;
        encode_rounds(self.rounds, &mut encoder)?;
        if let Some(ms) = self.horizon_ms {
            let gauge = ConstGauge::new(i64::try_from(ms).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(
                "ledger_idempotency_horizon_ms",
                "spot-core's idempotency horizon (Unix ms): req_ids created before it are forgotten and refused (0: none yet).",
                None,
                gauge.metric_type(),
            )?)?;
        }
        crate::ops_metrics::encode(&self.ops, &mut encoder)?;
        crate::ha_metrics::encode(&self.ha, &mut encoder)?;
        encode_relays(&self.relays, &mut encoder)
    }
}

/// `ledger_transfers`: one series per state, 0 for a state no transfer is in.
fn encode_by_state(
    by_state: &[(String, i64)],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "ledger_transfers",
        "Transfers by current state.",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for state in TransferState::ALL {
        let count = by_state
            .iter()
            .find(|(s, _)| s == state.as_str())
            .map_or(0, |(_, n)| *n);
        let labels = [("state", state.as_str())];
        ConstGauge::new(count).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The open transfers' ages and leases (gauges), and the recovery totals and MON-001/MON-002
/// alert counts (counters).
fn encode_figures(f: &Figures, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
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
    encode_gauges(encoder, &gauges)?;
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
        counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
    }
    Ok(())
}

/// The periodic conservation check's health: a run that cannot decide is an alert
/// (`ledger_audit_up` 0), not only a log line.
fn encode_audit(
    audit: &application::audit::status::AuditHealth,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let up = ConstGauge::new(i64::from(audit.up));
    up.encode(encoder.encode_descriptor(
        "ledger_audit_up",
        "1 when the last periodic conservation check decided, 0 when it could not run.",
        None,
        up.metric_type(),
    )?)?;
    let failures = ConstCounter::new(u64::try_from(audit.failures).unwrap_or(0));
    failures.encode(encoder.encode_descriptor(
        "ledger_audit_failures",
        "Periodic conservation checks that could not run.",
        None,
        failures.metric_type(),
    )?)?;
    let gauges: [(&str, &str, f64); 2] = [
        (
            "ledger_audit_duration_seconds",
            "Duration of the last periodic conservation check.",
            audit.last_duration_seconds,
        ),
        (
            "ledger_audit_last_success_timestamp_seconds",
            "When a periodic conservation check last decided (0: never).",
            audit.last_success_epoch_seconds,
        ),
    ];
    encode_gauges(encoder, &gauges)?;
    Ok(())
}

/// spot-core's health and the halt flag as gauges (what the SPOT_CORE_DOWN and MON-003 rules
/// read), and MON-004's counter.
fn encode_health(health: Health, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let gauges: [(&str, &str, bool); 2] = [
        (
            "ledger_spot_core_up",
            "1 when spot-core answered this scrape's status call, 0 when it did not.",
            health.spot_core_up,
        ),
        (
            "ledger_halted",
            "1 while new transfers are halted after a conservation violation (MON-003).",
            health.halted,
        ),
    ];
    encode_gauges(encoder, &gauges.map(|(n, h, v)| (n, h, i64::from(v))))?;
    let threshold = ConstGauge::new(health.target_pending_threshold_seconds);
    threshold.encode(encoder.encode_descriptor(
        "ledger_alert_target_pending_threshold_seconds",
        "MON-001's threshold (LEDGER_ALERT_TARGET_PENDING_MS) in seconds, what the shipped rule compares the age with.",
        None,
        threshold.metric_type(),
    )?)?;
    let alerts = ConstCounter::new(u64::try_from(health.request_frequency_alerts).unwrap_or(0));
    alerts.encode(encoder.encode_descriptor(
        "ledger_alerts_request_frequency",
        "WARNING MON-004 alerts raised (a user's transfer requests above the configured frequency).",
        None,
        alerts.metric_type(),
    )?)
}

/// This process's rounds of single requests (ADR 0019): rounds, the requests they carried, and
/// those that shared their round with another. Requests per round is the second over the first.
fn encode_rounds(
    rounds: application::round::RoundStats,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let counters: [(&str, &str, u64); 3] = [
        (
            "ledger_rounds",
            "Rounds of single transfer requests this process ran (ADR 0019), from its start.",
            rounds.rounds,
        ),
        (
            "ledger_round_requests",
            "Single transfer requests this process's rounds carried, from its start.",
            rounds.requests,
        ),
        (
            "ledger_round_shared_requests",
            "Single transfer requests carried by a round with at least one other, from this process's start.",
            rounds.shared,
        ),
    ];
    for (name, help, value) in counters {
        let counter = ConstCounter::new(value);
        counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
    }
    Ok(())
}

/// A relay figure: its name, its help, and how to read it from a status row.
type RelayFigure = (&'static str, &'static str, fn(&RelayStatus) -> i64);

/// A leader whose heartbeat is older than this counts as gone.
const RELAY_LEADER_FRESH: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// The relay's figures, one series per stream: lag (positions, seconds), events relayed, a live
/// leader, RELAY-LAG alerts, and the last error (its text as a label, its time as the value).
fn encode_relays(
    relays: &[RelayStatus],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::{Counter, Gauge};
    if relays.is_empty() {
        return Ok(());
    }
    let gauges: [RelayFigure; 2] = [
        (
            "ledger_relay_lag_positions",
            "Feed positions not yet acknowledged by JetStream.",
            |r| r.lag_positions,
        ),
        (
            "ledger_relay_leader",
            "1 while a relay holds the stream's lock and its heartbeat is fresh.",
            |r| {
                i64::from(
                    r.leader.is_some() && chrono::Utc::now() - r.updated_at < RELAY_LEADER_FRESH,
                )
            },
        ),
    ];
    let counters: [RelayFigure; 2] = [
        (
            "ledger_relay_published",
            "Events relayed to JetStream (the last acknowledged feed position); its rate is the publish rate.",
            |r| r.position,
        ),
        (
            "ledger_alerts_relay_lag",
            "CRITICAL RELAY-LAG alerts raised (relay lag over LEDGER_RELAY_LAG_ALERT_MS; logged as MON-004 before it had its own name).",
            |r| r.lag_alerts,
        ),
    ];
    for (name, help, value) in gauges {
        let mut d = encoder.encode_descriptor(name, help, None, Gauge)?;
        for r in relays {
            ConstGauge::new(value(r)).encode(d.encode_family(&[("stream", r.stream.as_str())])?)?;
        }
    }
    for (name, help, value) in counters {
        let mut d = encoder.encode_descriptor(name, help, None, Counter)?;
        for r in relays {
            let v = u64::try_from(value(r)).unwrap_or(0);
            ConstCounter::new(v).encode(d.encode_family(&[("stream", r.stream.as_str())])?)?;
        }
    }
    encode_relay_lag_and_errors(relays, encoder)
}

/// Per stream: the age of the oldest event not relayed, and the last error (its text, made safe
/// for a label, as a label; its time as the value).
fn encode_relay_lag_and_errors(
    relays: &[RelayStatus],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::Gauge;
    let mut d = encoder.encode_descriptor(
        "ledger_relay_lag_seconds",
        "Age of the oldest event not yet relayed to JetStream (0 when none).",
        None,
        Gauge,
    )?;
    for r in relays {
        ConstGauge::new(r.lag_seconds)
            .encode(d.encode_family(&[("stream", r.stream.as_str())])?)?;
    }
    let mut d = encoder.encode_descriptor(
        "ledger_relay_last_error_timestamp_seconds",
        "When the relay last failed (Unix time), its error in the label.",
        None,
        Gauge,
    )?;
    for r in relays {
        if let (Some(error), Some(at)) = (&r.last_error, r.last_error_at) {
            let error = label_safe(error);
            let labels = [("stream", r.stream.as_str()), ("error", error.as_str())];
            ConstGauge::new(at.timestamp()).encode(d.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// At most 200 characters of `text`, with quotes, backslashes and control characters blanked.
fn label_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                ' '
            } else {
                c
            }
        })
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_reports_lag_published_leader_alerts_and_its_last_error() {
        let now = chrono::Utc::now();
        let text = render(Snapshot {
            relays: vec![RelayStatus {
                stream: "LEDGER_EVENTS".into(),
                position: 90,
                stream_sequence: 90,
                head: 100,
                lag_positions: 10,
                lag_seconds: 1.5,
                updated_at: now,
                leader: Some("relay-1".into()),
                leader_since: Some(now),
                last_error: Some("nats: connect \"x\"\nrefused".into()),
                last_error_at: Some(now),
                lag_alerts: 2,
            }],
            ..Snapshot::default()
        });
        for line in [
            "ledger_relay_lag_positions{stream=\"LEDGER_EVENTS\"} 10",
            "ledger_relay_lag_seconds{stream=\"LEDGER_EVENTS\"} 1.5",
            "ledger_relay_published_total{stream=\"LEDGER_EVENTS\"} 90",
            "ledger_relay_leader{stream=\"LEDGER_EVENTS\"} 1",
            "ledger_alerts_relay_lag_total{stream=\"LEDGER_EVENTS\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        assert!(
            text.contains("error=\"nats: connect  x  refused\"} "),
            "{text}"
        );
        // Without a relay, nothing of it is reported.
        assert!(!render(Snapshot::default()).contains("ledger_relay"));
    }

    #[test]
    fn the_rounds_of_single_requests_are_counted() {
        let text = render(Snapshot {
            rounds: application::round::RoundStats {
                rounds: 4,
                requests: 40,
                shared: 38,
            },
            ..Snapshot::default()
        });
        for line in [
            "# TYPE ledger_rounds counter",
            "ledger_rounds_total 4",
            "ledger_round_requests_total 40",
            "ledger_round_shared_requests_total 38",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
    }

    #[test]
    fn the_audit_health_is_reported() {
        let text = render(Snapshot {
            audit: application::audit::status::AuditHealth {
                up: false,
                failures: 3,
                last_duration_seconds: 0.25,
                last_success_epoch_seconds: 1_700_000_000.5,
                ..Default::default()
            },
            ..Snapshot::default()
        });
        for line in [
            "ledger_audit_up 0",
            "ledger_audit_failures_total 3",
            "ledger_audit_duration_seconds 0.25",
            "ledger_audit_last_success_timestamp_seconds 1700000000.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
    }

    #[test]
    fn the_horizon_is_reported_when_spot_core_answered() {
        let text = render(Snapshot {
            horizon_ms: Some(1_700_000_000_000),
            ..Snapshot::default()
        });
        assert!(
            text.contains("# TYPE ledger_idempotency_horizon_ms gauge"),
            "{text}"
        );
        assert!(text
            .lines()
            .any(|l| l == "ledger_idempotency_horizon_ms 1700000000000"));
        assert!(!render(Snapshot::default()).contains("ledger_idempotency_horizon_ms"));
    }

    #[test]
    fn every_state_is_reported_even_at_zero() {
        let text = render(Snapshot {
            by_state: vec![("TARGET_PENDING".into(), 2)],
            figures: Figures::default(),
            relays: Vec::new(),
            audit: Default::default(),
            horizon_ms: None,
            ops: Default::default(),
            health: Health::default(),
            rounds: Default::default(),
            ha: Default::default(),
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
    fn spot_core_health_the_halt_and_mon_004_are_reported() {
        let text = render(Snapshot {
            health: Health {
                spot_core_up: true,
                halted: true,
                request_frequency_alerts: 2,
                target_pending_threshold_seconds: 0.5,
            },
            ..Snapshot::default()
        });
        for line in [
            "ledger_spot_core_up 1",
            "ledger_halted 1",
            "# TYPE ledger_alerts_request_frequency counter",
            "ledger_alerts_request_frequency_total 2",
            "ledger_alert_target_pending_threshold_seconds 0.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        let text = render(Snapshot::default());
        assert!(text.lines().any(|l| l == "ledger_spot_core_up 0"), "{text}");
        assert!(text.lines().any(|l| l == "ledger_halted 0"), "{text}");
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
