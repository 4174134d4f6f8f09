//! The funding accounts: money arriving from outside (external deposits, idempotent by
//! `external_id`, each with its entry in the event log), an account's status, whether it exists
//! (remembered once seen), and balances.

use domain::{Amount, AssetSymbol, UserId};
use rust_decimal::Decimal;

use super::{AccountStatus, DepositReceipt, FundingBalance, FundingError, FundingLedger};

/// Most accounts `known` remembers; past it, existence is asked of the database every time.
const KNOWN_ACCOUNTS_MAX: usize = 1_000_000;

/// The most a funding balance may hold, the column's own bound (numeric(38,18)).
fn balance_ceiling() -> Decimal {
    Decimal::from_i128_with_scale(100_000_000_000_000_000_000, 0)
}

impl FundingLedger {
    /// Credits money arriving from outside, once per `external_id`. A repeat with the same
    /// details changes nothing; a repeat with other details is refused.
    pub async fn external_deposit(
        &self,
        external_id: &str,
        user_id: UserId,
        asset: &AssetSymbol,
        amount: Amount,
    ) -> Result<DepositReceipt, FundingError> {
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO external_deposits (external_id, user_id, asset, amount)
             VALUES ($1, $2, $3, $4) ON CONFLICT (external_id) DO NOTHING",
        )
        .bind(external_id)
        .bind(user_id.as_i64())
        .bind(asset.as_str())
        .bind(amount.value())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            let (u, a, amt): (i64, String, Decimal) = sqlx::query_as(
                "SELECT user_id, asset, amount FROM external_deposits WHERE external_id = $1",
            )
            .bind(external_id)
            .fetch_one(&mut *tx)
            .await?;
            tx.rollback().await?;
            if u != user_id.as_i64() || a != asset.as_str() || amt != amount.value() {
                return Err(FundingError::ExternalIdReused);
            }
            let balance = self.balance(user_id, asset).await?.unwrap_or_default();
            return Ok(DepositReceipt {
                applied_now: false,
                balance,
            });
        }
        let balance: Decimal = sqlx::query_scalar(
            "INSERT INTO funding_accounts (user_id, asset, balance) VALUES ($1, $2, $3)
             ON CONFLICT (user_id, asset)
             DO UPDATE SET balance = funding_accounts.balance + EXCLUDED.balance, updated_at = now()
             RETURNING balance",
        )
        .bind(user_id.as_i64())
        .bind(asset.as_str())
        .bind(amount.value())
        .fetch_one(&mut *tx)
        .await
        .map_err(map_overflow)?;
        if balance >= balance_ceiling() {
            tx.rollback().await?;
            return Err(FundingError::Overflow);
        }
        append_entry(&mut tx, external_id).await?;
        tx.commit().await?;
        Ok(DepositReceipt {
            applied_now: true,
            balance,
        })
    }

    /// Sets an existing account's status.
    pub async fn set_status(
        &self,
        user_id: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), FundingError> {
        let n = sqlx::query(
            "UPDATE funding_accounts SET status = $3, updated_at = now()
             WHERE user_id = $1 AND asset = $2",
        )
        .bind(user_id.as_i64())
        .bind(asset.as_str())
        .bind(status.as_str())
        .execute(&self.pool)
        .await?
        .rows_affected();
        if n == 0 {
            return Err(FundingError::AccountNotFound);
        }
        Ok(())
    }

    /// Whether the account exists. A yes is remembered (accounts are never deleted), so a
    /// SPOT→FUNDING transfer's check of its target costs a round trip only the first time.
    pub async fn account_exists(
        &self,
        user_id: UserId,
        asset: &AssetSymbol,
    ) -> Result<bool, FundingError> {
        let key = (user_id.as_i64(), asset.as_str().to_owned());
        // A poisoned lock means a writer panicked mid-insert into a plain set that is still whole.
        if self
            .known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&key)
        {
            return Ok(true);
        }
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM funding_accounts WHERE user_id = $1 AND asset = $2)",
        )
        .bind(key.0)
        .bind(asset.as_str())
        .fetch_one(&self.pool)
        .await?;
        if exists {
            let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
            if known.len() < KNOWN_ACCOUNTS_MAX {
                known.insert(key);
            }
        }
        Ok(exists)
    }

    pub async fn balance(
        &self,
        user_id: UserId,
        asset: &AssetSymbol,
    ) -> Result<Option<Decimal>, FundingError> {
        Ok(sqlx::query_scalar(
            "SELECT balance FROM funding_accounts WHERE user_id = $1 AND asset = $2",
        )
        .bind(user_id.as_i64())
        .bind(asset.as_str())
        .fetch_optional(&self.pool)
        .await?)
    }

    pub async fn balances(&self, user_id: UserId) -> Result<Vec<FundingBalance>, FundingError> {
        let rows: Vec<(String, Decimal, String)> = sqlx::query_as(
            "SELECT asset, balance, status FROM funding_accounts WHERE user_id = $1 ORDER BY asset",
        )
        .bind(user_id.as_i64())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(asset, balance, status)| FundingBalance {
                asset,
                balance: balance.normalize(),
                status,
            })
            .collect())
    }
}

/// Appends the deposit's entry to the event table, and so to the feed and the tamper-evident log
/// (migration 0025, `docs/adr/0016-tamper-evident-log.md`), in the deposit's transaction: the row,
/// the balance and the entry commit together or not at all, and a repeat of the external_id never
/// gets here, so each deposit has exactly one entry.
///
/// The feed's lock (`feed_take()`, held until the commit) is taken here, last, after the
/// account's row lock that the balance's upsert holds. No lock cycle can pass through it: every
/// other holder of the feed's lock is an event append (`event_store`'s one statement), which takes
/// it as its last lock too and touches no funding account, and the funding movements
/// (`funding_fresh_movements`) lock accounts but never the feed. Taken the other way round, a
/// deposit waiting for an account that a funding batch holds would hold every event append in the
/// ledger behind that batch.
async fn append_entry(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    external_id: &str,
) -> Result<(), FundingError> {
    let position: Option<i64> = sqlx::query_scalar("SELECT deposit_entries_append(ARRAY[$1])")
        .bind(external_id)
        .fetch_one(&mut **tx)
        .await?;
    // The row was inserted by this transaction, so the function finds it; were it ever not to,
    // the deposit is refused (rolled back with `tx`), never credited without its entry.
    match position {
        Some(_) => Ok(()),
        None => Err(FundingError::Database(sqlx::Error::RowNotFound)),
    }
}

fn map_overflow(e: sqlx::Error) -> FundingError {
    // numeric_value_out_of_range: the sum no longer fits numeric(38,18).
    if e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "22003")
    {
        return FundingError::Overflow;
    }
    FundingError::Database(e)
}
