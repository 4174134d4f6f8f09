//! What `/metrics` reports of a cell under HA (ADR 0020, `edge::cluster::HaFigures`), each
//! family written only where it means something, so that a plain deployment never pages:
//!
//! - `ledger_pg_sync_standbys` (gauge): synchronous standbys the primary names
//!   (`pg_stat_replication`, `sync_state` sync or quorum); only when the database URL names
//!   Patroni or several hosts;
//! - `ledger_spot_core_replicas_acknowledging` (gauge): replicas holding everything
//!   acknowledged, the leader's `status` → `replication.acknowledging`, at most the replicas
//!   that answer a `hello` now (0 when no leader answered); only for a replicated spot-core;
//! - `ledger_failover_leaderless_seconds{kind}` (gauge): how long this process has found no
//!   leader of `kind` (`postgres`, `spot-core`), 0 while it has one; for each kind it follows.

use edge::cluster::HaFigures;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::gauges::encode_gauges;

/// Writes them into the exposition.
pub fn encode(figures: &HaFigures, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    if let Some(n) = figures.pg_sync_standbys {
        encode_gauges(
            encoder,
            &[(
                "ledger_pg_sync_standbys",
                "Synchronous PostgreSQL standbys the primary names (pg_stat_replication); 0: commits are not protected by a second copy.",
                n,
            )],
        )?;
    }
    if let Some(n) = figures.spot_acknowledging {
        encode_gauges(
            encoder,
            &[(
                "ledger_spot_core_replicas_acknowledging",
                "spot-core replicas holding everything acknowledged, the leader included (3 whole, 2 no spare, below 2 nothing is acknowledged).",
                i64::from(n),
            )],
        )?;
    }
    if figures.leaderless_seconds.is_empty() {
        return Ok(());
    }
    let mut d = encoder.encode_descriptor(
        "ledger_failover_leaderless_seconds",
        "How long this process has found no leader of kind (postgres, spot-core); 0 while it has one.",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (kind, seconds) in &figures.leaderless_seconds {
        ConstGauge::new(*seconds).encode(d.encode_family(&[("kind", *kind)])?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Only(HaFigures);

    impl Collector for Only {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode(&self.0, &mut encoder)
        }
    }

    fn text(f: HaFigures) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Only(f)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn a_cell_under_ha_reports_its_standbys_replicas_and_leaderless_time() {
        let t = text(HaFigures {
            pg_sync_standbys: Some(1),
            spot_acknowledging: Some(2),
            leaderless_seconds: vec![("postgres", 0.0), ("spot-core", 12.5)],
        });
        for line in [
            "# TYPE ledger_pg_sync_standbys gauge",
            "ledger_pg_sync_standbys 1",
            "ledger_spot_core_replicas_acknowledging 2",
            "# TYPE ledger_failover_leaderless_seconds gauge",
            "ledger_failover_leaderless_seconds{kind=\"postgres\"} 0.0",
            "ledger_failover_leaderless_seconds{kind=\"spot-core\"} 12.5",
        ] {
            assert!(t.lines().any(|l| l == line), "{line:?} in\n{t}");
        }
    }

    #[test]
    fn a_plain_deployment_reports_none_of_them() {
        let t = text(HaFigures::default());
        assert!(!t.contains("ledger_pg_sync"), "{t}");
        assert!(!t.contains("acknowledging"), "{t}");
        assert!(!t.contains("leaderless"), "{t}");
    }
}
