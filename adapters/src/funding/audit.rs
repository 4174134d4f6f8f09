//! The funding ledger's side of the fund-conservation audit: balances, external deposits and the
//! applied movements of the journal, all read in one snapshot.

use domain::AccountType;
use rust_decimal::Decimal;

use super::{FundingError, FundingLedger};
use crate::audit::{AppliedMovement, FundingSnapshot};

impl FundingLedger {
    /// Balances and deposits per asset and every applied movement, from one REPEATABLE READ
    /// snapshot, so balances and journal agree with each other.
    pub async fn audit_snapshot(&self) -> Result<FundingSnapshot, FundingError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let balances: Vec<(String, Decimal)> =
            sqlx::query_as("SELECT asset, SUM(balance) FROM funding_accounts GROUP BY asset")
                .fetch_all(&mut *tx)
                .await?;
        let deposits: Vec<(String, Decimal)> =
            sqlx::query_as("SELECT asset, SUM(amount) FROM external_deposits GROUP BY asset")
                .fetch_all(&mut *tx)
                .await?;
        let journal: Vec<(String, String, i64, String, Decimal)> = sqlx::query_as(
            "SELECT req_id, operation, user_id, asset, amount FROM funding_journal
             WHERE outcome = 'APPLIED'",
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let applied = journal
            .into_iter()
            .map(|(req_id, op, user_id, asset, amount)| AppliedMovement {
                req_id,
                system: AccountType::Funding,
                operation: super::operation_from_journal(&op),
                user_id,
                asset,
                amount,
            })
            .collect();
        Ok(FundingSnapshot {
            balances: balances.into_iter().collect(),
            deposits: deposits.into_iter().collect(),
            applied,
        })
    }
}
