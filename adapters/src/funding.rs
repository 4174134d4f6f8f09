//! The funding ledger: balances per (user, asset) in PostgreSQL, every change a journal row keyed
//! by (req_id, operation), each operation one transaction. This module holds the ledger, its
//! `AccountPort` (the movements, their journal, lookup and cancel) and its types; the accounts
//! themselves (external deposits, status, existence, balances) are `accounts.rs`, the group
//! commit of fresh movements `batch.rs`, the conservation check's read `audit.rs`.

use async_trait::async_trait;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use domain::{
    AccountPort, AccountType, AdapterOutcome, AssetRegistry, Movement, Operation, Recorded,
};
use rust_decimal::Decimal;
use sqlx::PgPool;
use tracing::Instrument;

use crate::traced;

mod accounts;
mod audit;
mod batch;
pub(crate) mod together;

pub use application::books::{AccountStatus, DepositReceipt, FundingBalance, JournalEntry};

#[derive(Debug, thiserror::Error)]
pub enum FundingError {
    /// The same external id was already used for a different deposit.
    #[error("external id already used for a different deposit")]
    ExternalIdReused,
    #[error("account not found")]
    AccountNotFound,
    #[error("balance would exceed the ledger's ceiling")]
    Overflow,
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// The journal's operation read back (`funding_journal.operation`): a name that is none of
/// the operations' is a read error (the column's CHECK guards what is written; this guards what
/// is read), so a caller's answer is unknown, never a guess.
fn operation_from_journal(name: &str) -> Result<Operation, sqlx::Error> {
    name.parse().map_err(|e| sqlx::Error::ColumnDecode {
        index: "operation".to_owned(),
        source: Box::new(e),
    })
}

/// The funding ledger over one PostgreSQL pool.
#[derive(Clone)]
pub struct FundingLedger {
    pool: PgPool,
    /// When set, withdraw and deposit re-check the asset and the amount's precision themselves
    /// (defence in depth: a caller that skips the API and the coordinator is still refused).
    assets: Option<Arc<RwLock<AssetRegistry>>>,
    /// Group-commits fresh movements. Its task is owned by this value's clones (see
    /// `group_commit`), started with it, and ends when the last clone is dropped.
    batcher: batch::Batcher,
    /// Accounts seen to exist. Nothing ever deletes a funding account, so once seen, always
    /// true; an account not seen yet is asked for every time (a deposit may have created it).
    known: Arc<RwLock<HashSet<(i64, String)>>>,
}

impl FundingLedger {
    /// The ledger over `pool`, with its group-commit task started on the current tokio runtime
    /// (so it must be called inside one).
    pub fn new(pool: PgPool) -> Self {
        Self {
            batcher: batch::Batcher::start(pool.clone()),
            pool,
            assets: None,
            known: Arc::new(RwLock::new(HashSet::new())),
        }
    }

    /// Checks every fresh withdraw and deposit against this registry: an unknown asset is
    /// refused INVALID_ASSET, too many decimals PRECISION_OVERFLOW. Status and transfer
    /// permission are not checked here on purpose: they gate new transfers (API, coordinator),
    /// and a transfer already under way must still be able to finish or be refunded.
    pub fn with_assets(mut self, assets: Arc<RwLock<AssetRegistry>>) -> Self {
        self.assets = Some(assets);
        self
    }

    /// The adapter's own parameter check for a fresh movement; `None` when it passes.
    fn invalid(&self, m: &Movement) -> Option<String> {
        let registry = self.assets.as_ref()?;
        // A poisoned lock means a writer panicked mid-update of a plain map that is still whole.
        let registry = registry.read().unwrap_or_else(|e| e.into_inner());
        let checked = registry
            .get(m.asset.as_str())
            .and_then(|asset| asset.check_precision(m.amount));
        checked.err().map(|code| code.as_str().to_owned())
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// What the journal holds for one `req_id`: the answer to "what happened to X?".
    pub async fn journal_for(&self, req_id: &str) -> Result<Vec<JournalEntry>, FundingError> {
        type Row = (
            String,
            i64,
            String,
            Decimal,
            String,
            Option<String>,
            chrono::DateTime<chrono::Utc>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT operation, user_id, asset, amount, outcome, code, created_at
             FROM funding_journal WHERE req_id = $1 ORDER BY id",
        )
        .bind(req_id)
        .fetch_all(&self.pool)
        .await?;
        let entry = |(operation, user_id, asset, amount, outcome, code, at): Row| -> Result<_, FundingError> {
            Ok(JournalEntry {
                operation: operation_from_journal(&operation)?,
                user_id,
                asset,
                amount,
                applied: outcome == "APPLIED",
                code,
                at,
            })
        };
        rows.into_iter().map(entry).collect()
    }

    /// One movement, atomically: claim (req_id, op) in the journal, decide and apply. A claim that
    /// already exists returns the first decision and changes nothing.
    async fn movement(&self, op: Operation, m: &Movement) -> Result<AdapterOutcome, sqlx::Error> {
        // The common case, a fresh movement of a valid asset, is decided and applied by one
        // statement; repeats and invalid assets take the general path below.
        // A refund is bound to an applied withdraw of the same details, the stronger check; it
        // must never be refused for an asset setting changed since, or the money would stay
        // in flight.
        let invalid = match op {
            Operation::Refund => None,
            Operation::Withdraw | Operation::Deposit => self.invalid(m),
        };
        if invalid.is_none() {
            if let Some(outcome) = self.fresh_movement(op, m).await? {
                return Ok(outcome);
            }
        }
        self.movement_general(op, m, invalid).await
    }

    /// Claims (req_id, operation), decides and applies, in one call of the database's
    /// `funding_fresh_movements` shared with the other movements waiting at the same moment (see
    /// `batch`): the account row is locked first (`FOR UPDATE`, which sees its newest committed
    /// version), the decision is made from it, the journal row records the decision, and the
    /// balance changes only if the claim was inserted as APPLIED. Answers once that commit is
    /// durable. `None` when the key was already claimed: nothing changed, and the general path
    /// answers with the first decision.
    async fn fresh_movement(
        &self,
        op: Operation,
        m: &Movement,
    ) -> Result<Option<AdapterOutcome>, sqlx::Error> {
        let decided = self.batcher.submit(op, m).await?;
        Ok(decided.map(|d| fresh_outcome(op, m, d)))
    }

    /// The other cases: a repeat of a claimed key, answered with its first decision, and an
    /// invalid movement (unknown asset, excess precision), refused and recorded without touching
    /// any balance. Checked only for a fresh claim, so a retry of something already decided gets
    /// that decision even if the asset configuration changed since.
    async fn movement_general(
        &self,
        op: Operation,
        m: &Movement,
        invalid: Option<String>,
    ) -> Result<AdapterOutcome, sqlx::Error> {
        if let Some(code) = invalid {
            let claimed = sqlx::query(
                "INSERT INTO funding_journal (req_id, operation, user_id, asset, amount, outcome, code)
                 VALUES ($1, $2, $3, $4, $5, 'REFUSED', $6)
                 ON CONFLICT (req_id, operation) DO NOTHING",
            )
            .bind(m.req_id.to_string())
            .bind(op.as_str())
            .bind(m.user_id.as_i64())
            .bind(m.asset.as_str())
            .bind(m.amount.value())
            .bind(&code)
            .execute(&self.pool)
            .await?
            .rows_affected();
            if claimed == 1 {
                return Ok(refusal(code));
            }
        }
        // The key is claimed and committed (an INSERT that met it waited for its transaction).
        let first: (i64, String, Decimal, String, Option<String>) = sqlx::query_as(
            "SELECT user_id, asset, amount, outcome, code FROM funding_journal
             WHERE req_id = $1 AND operation = $2",
        )
        .bind(m.req_id.to_string())
        .bind(op.as_str())
        .fetch_one(&self.pool)
        .await?;
        let (user_id, asset, amount, outcome, code) = first;
        if user_id != m.user_id.as_i64() || asset != m.asset.as_str() || amount != m.amount.value()
        {
            // Never decide a different movement under a used key: a bug or an attack, so the
            // caller must not treat it as a clean refusal either.
            return Ok(AdapterOutcome::Mismatch(format!(
                "req_id {} already used for a different {} movement",
                m.req_id,
                op.as_str()
            )));
        }
        Ok(match (outcome.as_str(), code) {
            ("APPLIED", _) => AdapterOutcome::Success,
            (_, code) => refusal(code.unwrap_or_else(|| "REFUSED".into())),
        })
    }
}

impl FundingLedger {
    /// Many movements of one kind (a bulk request's): every fresh movement of a valid asset is
    /// decided in the same call of the batch (one statement, one commit, with whatever else is
    /// waiting); repeats and invalid ones take the single path's general case, each alone.
    async fn movements_batched(&self, op: Operation, ms: &[Movement]) -> Vec<AdapterOutcome> {
        let invalid: Vec<Option<String>> = ms
            .iter()
            .map(|m| match op {
                Operation::Refund => None,
                Operation::Withdraw | Operation::Deposit => self.invalid(m),
            })
            .collect();
        let fresh: Vec<(Operation, &Movement)> = ms
            .iter()
            .zip(&invalid)
            .filter(|(_, invalid)| invalid.is_none())
            .map(|(m, _)| (op, m))
            .collect();
        let mut decided = self.batcher.submit_many(fresh).await.into_iter();
        let mut outcomes = Vec::with_capacity(ms.len());
        for (m, invalid) in ms.iter().zip(invalid) {
            let first = match invalid {
                Some(_) => Ok(None),
                None => match decided.next() {
                    Some(answer) => answer.map(|d| d.map(|d| fresh_outcome(op, m, d))),
                    None => Err(sqlx::Error::WorkerCrashed),
                },
            };
            let outcome = match first {
                Ok(Some(outcome)) => Ok(outcome),
                Ok(None) => self.movement_general(op, m, invalid).await,
                Err(e) => Err(e),
            };
            outcomes.push(outcome.unwrap_or_else(classify));
        }
        outcomes
    }

    /// Records a `CANCELLED` refusal for (req_id, op) if nothing is recorded under that key yet.
    /// A movement transaction still holding the key makes this wait for it, and then do nothing.
    async fn cancel_movement(&self, op: Operation, m: &Movement) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO funding_journal (req_id, operation, user_id, asset, amount, outcome, code)
             VALUES ($1, $2, $3, $4, $5, 'REFUSED', 'CANCELLED')
             ON CONFLICT (req_id, operation) DO NOTHING",
        )
        .bind(m.req_id.to_string())
        .bind(op.as_str())
        .bind(m.user_id.as_i64())
        .bind(m.asset.as_str())
        .bind(m.amount.value())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// What a fresh movement's decision (claimed by this call) comes to.
fn fresh_outcome(op: Operation, m: &Movement, decided: batch::Decided) -> AdapterOutcome {
    let batch::Decided {
        outcome,
        code,
        moved,
    } = decided;
    if outcome == "APPLIED" {
        // One call, one transaction: an applied claim without its balance change cannot
        // commit unless the account vanished, which nothing ever does.
        if moved != 1 {
            tracing::error!(req_id = %m.req_id, op = op.as_str(), moved, "CRITICAL applied funding movement touched no single account");
            return AdapterOutcome::Unknown("funding movement inconsistent".into());
        }
        return AdapterOutcome::Success;
    }
    refusal(code.unwrap_or_else(|| "REFUSED".into()))
}

fn refusal(code: String) -> AdapterOutcome {
    let message = match code.as_str() {
        "INSUFFICIENT_BALANCE" => "funding balance is below the amount",
        "SOURCE_ACCOUNT_NOT_FOUND" => "no funding account for this asset",
        "TARGET_ACCOUNT_NOT_FOUND" => "no funding account for this asset",
        "ACCOUNT_FROZEN" => "funding account is frozen",
        "ACCOUNT_DISABLED" => "funding account is disabled",
        "NO_MATCHING_WITHDRAW" => "no applied withdraw to refund",
        "INVALID_ASSET" => "unknown asset",
        "PRECISION_OVERFLOW" => "amount has more decimals than the asset allows",
        "CANCELLED" => "cancelled before it was applied; it never will be",
        _ => "refused by the funding ledger",
    };
    AdapterOutcome::ExplicitFail {
        code,
        message: message.into(),
    }
}

fn classify(e: sqlx::Error) -> AdapterOutcome {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_) => AdapterOutcome::NetworkError(e.to_string()),
        other => AdapterOutcome::Unknown(other.to_string()),
    }
}

#[async_trait]
impl AccountPort for FundingLedger {
    fn account_type(&self) -> AccountType {
        AccountType::Funding
    }

    async fn withdraw(&self, m: &Movement) -> AdapterOutcome {
        let span = traced::funding_call(Operation::Withdraw, std::slice::from_ref(m));
        self.movement(Operation::Withdraw, m)
            .instrument(span)
            .await
            .unwrap_or_else(classify)
    }

    async fn deposit(&self, m: &Movement) -> AdapterOutcome {
        let span = traced::funding_call(Operation::Deposit, std::slice::from_ref(m));
        self.movement(Operation::Deposit, m)
            .instrument(span)
            .await
            .unwrap_or_else(classify)
    }

    async fn refund(&self, m: &Movement) -> AdapterOutcome {
        let span = traced::funding_call(Operation::Refund, std::slice::from_ref(m));
        self.movement(Operation::Refund, m)
            .instrument(span)
            .await
            .unwrap_or_else(classify)
    }

    async fn movements(&self, operation: Operation, ms: &[Movement]) -> Vec<AdapterOutcome> {
        let span = traced::funding_call(operation, ms);
        self.movements_batched(operation, ms).instrument(span).await
    }

    /// The journal row is written in the same transaction as the balance change, so "no row"
    /// means nothing was applied when the query ran.
    async fn lookup(&self, m: &Movement, operation: Operation) -> Recorded {
        let op = operation;
        let entries = match self.journal_for(&m.req_id.to_string()).await {
            Ok(entries) => entries,
            Err(e) => return Recorded::Unavailable(e.to_string()),
        };
        let Some(entry) = entries.into_iter().find(|e| e.operation == op) else {
            return Recorded::NotSeen;
        };
        if entry.user_id != m.user_id.as_i64()
            || entry.asset != m.asset.as_str()
            || entry.amount != m.amount.value()
        {
            return Recorded::Mismatch(format!(
                "req_id {} recorded for a different {} movement",
                m.req_id,
                op.as_str()
            ));
        }
        if entry.applied {
            return Recorded::Applied;
        }
        match refusal(entry.code.unwrap_or_else(|| "REFUSED".into())) {
            AdapterOutcome::ExplicitFail { code, message } => Recorded::Refused { code, message },
            other => Recorded::Unavailable(format!("unexpected journal refusal {other:?}")),
        }
    }

    /// Claims (req_id, op) with a `CANCELLED` refusal unless something holds it already; the
    /// journal's unique key then answers every later copy of the call with that refusal.
    async fn cancel(&self, m: &Movement, operation: Operation) -> Recorded {
        let op = operation;
        if let Err(e) = self.cancel_movement(op, m).await {
            return Recorded::Unavailable(e.to_string());
        }
        self.lookup(m, operation).await
    }
}
