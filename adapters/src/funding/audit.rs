//! The funding ledger's side of the conservation check: balances (whole, live), and the
//! external deposits and applied journal movements written after a snapshot watermark, all read
//! in one REPEATABLE READ snapshot so that balances and rows agree with each other. Under a cell
//! map (ADR 0023 §5) the balances are the owned partitions', the rows a move copied in are left
//! out, and what the switches moved is read live beside the balances.

use domain::AccountType;
use futures_util::TryStreamExt;
use rust_decimal::Decimal;

use super::{FundingError, FundingLedger};
use crate::applied::AppliedMovement;
use crate::audit::{FundingItem, FundingRead};

impl FundingLedger {
    /// Balances per asset, and every external deposit and applied movement whose transaction
    /// id is at or above `since` (0: all of them), handed to `sink` as they stream in. The
    /// answer's `watermark` is the snapshot's `pg_snapshot_xmin`: each row is marked consumed
    /// when its transaction is below it. No row below the watermark can commit after this read
    /// (its transaction has ended), so a caller that stores `watermark` and later reads from it
    /// again misses nothing and reads nothing twice (docs/adr/0006-incremental-audit.md).
    pub async fn audit_read(
        &self,
        since: u64,
        sink: &mut (dyn FnMut(FundingItem) + Send),
    ) -> Result<FundingRead, FundingError> {
        let started = std::time::Instant::now();
        let (mut tx, watermark) = crate::audit::begin_snapshot(&self.pool, since).await?;
        let (balances, moved) = owned_balances(&mut tx).await?;
        let balances_ms = started.elapsed().as_millis();
        let deposits: Vec<(String, bool, Decimal, i64)> = sqlx::query_as(
            "SELECT asset, tx_id < $2::text::xid8, SUM(amount), COUNT(*) FROM external_deposits
             WHERE tx_id >= $1::text::xid8 AND move_id IS NULL GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(since.to_string())
        .bind(watermark.to_string())
        .fetch_all(&mut *tx)
        .await?;
        let mut deposit_rows = 0;
        for (asset, consumed, sum, rows) in deposits {
            let rows = u64::try_from(rows).unwrap_or(0);
            deposit_rows += rows;
            sink(FundingItem::Deposits {
                asset,
                sum,
                rows,
                consumed,
            });
        }
        let mut journal_rows = 0;
        {
            let mut rows = sqlx::query_as::<_, (String, String, i64, String, Decimal, bool)>(
                "SELECT req_id, operation, user_id, asset, amount, tx_id < $2::text::xid8
                 FROM funding_journal
                 WHERE tx_id >= $1::text::xid8 AND outcome = 'APPLIED' AND move_id IS NULL",
            )
            .bind(since.to_string())
            .bind(watermark.to_string())
            .fetch(&mut *tx);
            while let Some((req_id, op, user_id, asset, amount, consumed)) = rows.try_next().await?
            {
                journal_rows += 1;
                let operation = super::operation_from_journal(&op)?;
                sink(FundingItem::Applied {
                    movement: AppliedMovement {
                        req_id,
                        system: AccountType::Funding,
                        operation,
                        user_id,
                        asset,
                        amount,
                    },
                    consumed,
                });
            }
        }
        tx.commit().await?;
        tracing::debug!(
            balances_ms,
            took_ms = started.elapsed().as_millis(),
            journal_rows,
            "the conservation check's FUNDING read"
        );
        Ok(FundingRead {
            balances: balances.into_iter().collect(),
            watermark,
            journal_rows,
            deposit_rows,
            moved: moved.into_iter().collect(),
        })
    }
}

/// Per asset, the FUNDING balances of the partitions this cell owns (ADR 0023 §5: under a cell
/// map, not another cell's, a partition moved out and its rows kept, nor one being copied in),
/// and what the switches moved in minus out, in the caller's snapshot.
async fn owned_balances(
    tx: &mut sqlx::PgConnection,
) -> Result<(Vec<(String, Decimal)>, Vec<(String, Decimal)>), sqlx::Error> {
    let balances = sqlx::query_as(
        "SELECT asset, SUM(balance) FROM funding_accounts
         WHERE partition <> ALL (ARRAY(
             SELECT cp.partition FROM cell_partitions cp, cell_identity ci
             WHERE cp.cell_id <> ci.cell_id OR cp.state = 'INCOMING'))
         GROUP BY asset",
    )
    .fetch_all(&mut *tx)
    .await?;
    let moved = sqlx::query_as(
        "SELECT asset, SUM(CASE direction WHEN 'IN' THEN funding ELSE -funding END)
         FROM partition_switches GROUP BY asset",
    )
    .fetch_all(&mut *tx)
    .await?;
    Ok((balances, moved))
}
