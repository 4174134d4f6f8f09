//! spot-core's side of the conservation check over spot-core's protocol: its totals and the
//! journal after a seq that produced exactly them (streamed page by page into the caller's sink,
//! so no record count bounds the check), and `retain`, which tells spot-core the conservation check has
//! consumed its journal up to a seq so that compaction may drop what is before it.

use std::collections::BTreeMap;

use domain::AccountType;
use rust_decimal::Decimal;
use spot_core::protocol::{
    CoreStatus, ErrorCode, JournalRecord, Outcome, Request, Response, MAX_JOURNAL_LIMIT,
};

use super::{SpotAdapter, SpotError};
use crate::applied::AppliedMovement;
use crate::audit::{SpotRead, SpotReadError};

/// How many times the totals are re-read when operations keep arriving between the journal and
/// the totals.
const SNAPSHOT_ATTEMPTS_MAX: usize = 20;

impl SpotAdapter {
    /// Totals, and every applied movement of the journal after `after_seq` up to the seq that
    /// produced exactly those totals, handed to `sink` as read. spot-core applies operations one
    /// at a time, so totals read with no journal record after the last one read belong to it.
    pub async fn audit_read(
        &self,
        after_seq: u64,
        sink: &mut (dyn FnMut(AppliedMovement) + Send),
    ) -> Result<SpotRead, SpotReadError> {
        let started = std::time::Instant::now();
        let mut records = 0;
        let mut moved = BTreeMap::new();
        let mut seq = self
            .journal_after(after_seq, sink, &mut records, &mut moved)
            .await?;
        for attempt in 0..SNAPSHOT_ATTEMPTS_MAX {
            let totals = match self
                .client
                .call(&Request::Totals {})
                .await
                .map_err(SpotError::from)?
            {
                Response::Ok {
                    totals: Some(totals),
                    ..
                } => totals,
                other => return Err(SpotError::Unexpected(format!("{other:?}")).into()),
            };
            let before = records;
            seq = self
                .journal_after(seq, sink, &mut records, &mut moved)
                .await?;
            if records == before {
                tracing::debug!(
                    attempts = attempt + 1,
                    records,
                    took_ms = started.elapsed().as_millis(),
                    "the conservation check's spot-core read"
                );
                return Ok(SpotRead {
                    totals: totals
                        .into_iter()
                        .map(|t| (t.asset, t.sum))
                        .collect::<BTreeMap<_, _>>(),
                    last_seq: seq,
                    records,
                    moved,
                });
            }
        }
        Err(
            SpotError::Unexpected("spot-core kept changing while its totals were read".into())
                .into(),
        )
    }

    /// Tells spot-core the conservation check consumed its journal up to `after_seq` (durably, in the
    /// audit's checkpoint): records up to there may be compacted.
    pub async fn retain(&self, after_seq: u64) -> Result<Option<CoreStatus>, SpotError> {
        match self.client.call(&Request::Retain { after_seq }).await? {
            Response::Ok { core, .. } => Ok(core),
            other => Err(SpotError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Streams the journal after `after_seq` into `sink`, counting records and adding up the
    /// balances partition moves brought in (positive) or took out (negative) per asset; returns
    /// the last sequence read.
    async fn journal_after(
        &self,
        mut after_seq: u64,
        sink: &mut (dyn FnMut(AppliedMovement) + Send),
        count: &mut u64,
        moved: &mut BTreeMap<String, Decimal>,
    ) -> Result<u64, SpotReadError> {
        loop {
            let request = Request::Journal {
                after_seq,
                limit: MAX_JOURNAL_LIMIT,
            };
            let records = match self.client.call(&request).await.map_err(SpotError::from)? {
                Response::Ok {
                    records: Some(records),
                    ..
                } => records,
                Response::Error {
                    code: ErrorCode::JournalCompacted,
                    message,
                } => return Err(SpotReadError::JournalCompacted { after_seq, message }),
                other => return Err(SpotError::Unexpected(format!("{other:?}")).into()),
            };
            let Some(last) = records.last() else {
                return Ok(after_seq);
            };
            after_seq = last.seq();
            // The conservation check's own `retain` marks are not work to check: counting them would make
            // every run find one new record (its predecessor's mark) and send a mark again.
            *count += records
                .iter()
                .filter(|r| !matches!(r, JournalRecord::Retain(_)))
                .count() as u64;
            for movement in records.iter().filter_map(applied) {
                sink(movement);
            }
            for record in &records {
                add_moved(record, moved);
            }
        }
    }
}

/// A partition move's balances, per asset: a `move_in` adds them, a `move_out` takes them away.
fn add_moved(record: &JournalRecord, moved: &mut BTreeMap<String, Decimal>) {
    let (record, sign) = match record {
        JournalRecord::MoveIn(m) => (m, Decimal::ONE),
        JournalRecord::MoveOut(m) => (m, Decimal::NEGATIVE_ONE),
        _ => return,
    };
    for account in &record.payload.accounts {
        *moved.entry(account.asset.clone()).or_default() += sign * account.available;
    }
}

fn applied(record: &JournalRecord) -> Option<AppliedMovement> {
    let (op, m) = record.as_movement()?;
    if m.outcome != Outcome::Applied {
        return None;
    }
    Some(AppliedMovement {
        req_id: m.req_id.clone(),
        system: AccountType::Spot,
        operation: super::operation_of(op),
        user_id: i64::try_from(m.user_id).unwrap_or(i64::MAX),
        asset: m.asset.clone(),
        amount: m.amount,
    })
}
