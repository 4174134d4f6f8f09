//! spot-core's side of the fund-conservation audit: its totals and the journal that produced
//! exactly them, over spot-core's protocol.

use domain::{AccountType, Operation};
use spot_core::protocol::{
    JournalRecord, MovementOp, Outcome, Request, Response, MAX_JOURNAL_LIMIT,
};

use super::{SpotAdapter, SpotError};
use crate::audit::{AppliedMovement, SpotSnapshot};

/// How many times the totals are re-read when operations keep arriving between the journal and
/// the totals.
const SNAPSHOT_ATTEMPTS_MAX: usize = 20;

/// The most journal records one snapshot reads (bounds memory).
const JOURNAL_RECORDS_MAX: usize = 10_000_000;

impl SpotAdapter {
    /// Totals and the applied movements that produced exactly them. spot-core applies operations
    /// one at a time, so totals read with no journal record after the last one read belong to
    /// it.
    pub async fn audit_snapshot(&self) -> Result<SpotSnapshot, SpotError> {
        let mut records = Vec::new();
        let mut seq = self.journal_after(0, &mut records).await?;
        for _ in 0..SNAPSHOT_ATTEMPTS_MAX {
            let totals = match self.client.call(&Request::Totals {}).await? {
                Response::Ok {
                    totals: Some(totals),
                    ..
                } => totals,
                other => return Err(SpotError::Unexpected(format!("{other:?}"))),
            };
            let before = records.len();
            seq = self.journal_after(seq, &mut records).await?;
            if records.len() == before {
                return Ok(SpotSnapshot {
                    totals: totals.into_iter().map(|t| (t.asset, t.sum)).collect(),
                    applied: applied(&records),
                });
            }
        }
        Err(SpotError::Unexpected(
            "spot-core kept changing while its totals were read".into(),
        ))
    }

    /// Appends the journal after `after_seq` to `into`; returns the last sequence read.
    async fn journal_after(
        &self,
        mut after_seq: u64,
        into: &mut Vec<JournalRecord>,
    ) -> Result<u64, SpotError> {
        loop {
            let request = Request::Journal {
                after_seq,
                limit: MAX_JOURNAL_LIMIT,
            };
            let records = match self.client.call(&request).await? {
                Response::Ok {
                    records: Some(records),
                    ..
                } => records,
                other => return Err(SpotError::Unexpected(format!("{other:?}"))),
            };
            let Some(last) = records.last() else {
                return Ok(after_seq);
            };
            after_seq = last.seq();
            into.extend(records);
            if into.len() > JOURNAL_RECORDS_MAX {
                return Err(SpotError::Unexpected(
                    "journal larger than the audit reads".into(),
                ));
            }
        }
    }
}

fn applied(records: &[JournalRecord]) -> Vec<AppliedMovement> {
    records
        .iter()
        .filter_map(JournalRecord::as_movement)
        .filter(|(_, m)| m.outcome == Outcome::Applied)
        .map(|(op, m)| AppliedMovement {
            req_id: m.req_id.clone(),
            system: AccountType::Spot,
            operation: match op {
                MovementOp::Withdraw => Operation::Withdraw,
                MovementOp::Deposit => Operation::Deposit,
                MovementOp::Refund => Operation::Refund,
            },
            user_id: i64::try_from(m.user_id).unwrap_or(i64::MAX),
            asset: m.asset.clone(),
            amount: m.amount,
        })
        .collect()
}
