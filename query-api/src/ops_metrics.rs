//! The operations figures `/metrics` adds to its snapshot (gathered here, encoded here, so
//! `metrics.rs` only calls in): when a recovery worker last finished a pass, and how far the
//! read models' projector lags behind the event log.
//!
//! - `ledger_recovery_last_pass_timestamp_seconds` (gauge, Unix seconds; 0: no pass yet)
//! - `ledger_projector_lag_positions` (gauge: events appended, not yet applied)
//! - `ledger_projector_lag_seconds` (gauge: age of the oldest event not yet applied; 0 when none)
//! - with the tamper-evident log kept (its tree ever signed): `ledger_log_tree_size`,
//!   `ledger_log_lag_positions` (feed entries not yet in the tree) and `ledger_log_lag_seconds`
//!   (age of the oldest of them; 0 when none)

use edge::reads::ReadSide;
use prometheus_client::encoding::DescriptorEncoder;

use crate::gauges::encode_gauges;

/// The figures of one scrape.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OpsFigures {
    pub recovery_last_pass_epoch_seconds: f64,
    pub projector_lag_positions: i64,
    pub projector_lag_seconds: f64,
    /// The tamper-evident log's tree against the feed; `None` when no log is kept.
    pub log: Option<application::reads::LogLag>,
}

/// Reads them: the worker's heartbeat row and the projector's lag (two one-row tables and one
/// event by its feed position).
pub async fn gather(reads: &ReadSide) -> Result<OpsFigures, application::StoreError> {
    let heartbeat = reads.heartbeat().await?;
    let lag = reads.admin().projector_lag().await?;
    let log = reads.log().lag().await?;
    Ok(OpsFigures {
        recovery_last_pass_epoch_seconds: heartbeat.map_or(0.0, |h| h.last_pass_epoch_seconds),
        projector_lag_positions: lag.positions,
        projector_lag_seconds: lag.seconds,
        log,
    })
}

/// Writes them into the exposition.
pub fn encode(
    figures: &OpsFigures,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    encode_gauges(
        encoder,
        &[
            (
                "ledger_recovery_last_pass_timestamp_seconds",
                "When a recovery worker last finished a pass (Unix time; 0: none yet).",
                figures.recovery_last_pass_epoch_seconds,
            ),
            (
                "ledger_projector_lag_seconds",
                "Age of the oldest event the read models' projector has not applied yet (0 when none).",
                figures.projector_lag_seconds,
            ),
        ],
    )?;
    encode_gauges(
        encoder,
        &[(
            "ledger_projector_lag_positions",
            "Events appended to the log and not yet applied by the read models' projector.",
            figures.projector_lag_positions,
        )],
    )?;
    let Some(log) = figures.log else {
        return Ok(());
    };
    encode_gauges(
        encoder,
        &[
            (
                "ledger_log_tree_size",
                "Entries in the tamper-evident log's Merkle tree.",
                log.tree_size,
            ),
            (
                "ledger_log_lag_positions",
                "Feed entries not yet in the tamper-evident log's tree (nor under any new checkpoint).",
                log.positions,
            ),
        ],
    )?;
    encode_gauges(
        encoder,
        &[(
            "ledger_log_lag_seconds",
            "Age of the oldest feed entry not yet in the tamper-evident log's tree (0 when none).",
            log.seconds,
        )],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Only(OpsFigures);

    impl Collector for Only {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode(&self.0, &mut encoder)
        }
    }

    #[test]
    fn mon_the_operations_figures_are_reported() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Only(OpsFigures {
            recovery_last_pass_epoch_seconds: 1_700_000_000.5,
            projector_lag_positions: 7,
            projector_lag_seconds: 1.25,
            log: Some(application::reads::LogLag {
                tree_size: 40,
                positions: 2,
                seconds: 0.5,
            }),
        })));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE ledger_recovery_last_pass_timestamp_seconds gauge",
            "ledger_recovery_last_pass_timestamp_seconds 1700000000.5",
            "ledger_projector_lag_positions 7",
            "ledger_projector_lag_seconds 1.25",
            "# TYPE ledger_log_lag_seconds gauge",
            "ledger_log_tree_size 40",
            "ledger_log_lag_positions 2",
            "ledger_log_lag_seconds 0.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
    }

    #[test]
    fn without_a_log_kept_there_is_no_log_series() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Only(OpsFigures::default())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("ledger_log_"), "{text}");
    }
}
