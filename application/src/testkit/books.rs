//! The account systems' books ports (`books.rs`) over the in-memory `Books`: `MemAccount`
//! answers as the funding ledger (`FundingBook`) or as spot-core (`SpotBook`), and the
//! conservation check's two reads are functions over `Books` so the simulation's funding ledger
//! answers the same ([`funding_read`], [`spot_read`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use domain::{AccountType, Amount, AssetSymbol, Operation, ReqId, UserId};
use rust_decimal::Decimal;
use spot_core::protocol::{CoreStatus, LookupOp, MovementOp, Outcome};

use crate::books::{
    AccountStatus, AppliedMovement, DepositReceipt, FundingBalance, FundingBook, FundingError,
    FundingItem, FundingRead, JournalEntry, SpotBalance, SpotBook, SpotError, SpotRead,
    SpotReadError, SpotRecord,
};
use crate::testkit::account::{Books, Entry, MemAccount, Status};

fn status_name(status: Status) -> &'static str {
    match status {
        Status::Active => "ACTIVE",
        Status::Frozen => "FROZEN",
        Status::Disabled => "DISABLED",
    }
}

fn status_of(status: AccountStatus) -> Status {
    match status {
        AccountStatus::Active => Status::Active,
        AccountStatus::Frozen => Status::Frozen,
        AccountStatus::Disabled => Status::Disabled,
    }
}

fn applied(system: AccountType, op: Operation, e: &Entry) -> AppliedMovement {
    AppliedMovement {
        req_id: e.movement.req_id.to_string(),
        system,
        operation: op,
        user_id: e.movement.user_id.as_i64(),
        asset: e.movement.asset.as_str().to_owned(),
        amount: e.movement.amount.value(),
    }
}

fn totals(books: &Books) -> BTreeMap<String, Decimal> {
    let mut totals: BTreeMap<String, Decimal> = BTreeMap::new();
    for ((_, asset), account) in &books.accounts {
        *totals.entry(asset.as_str().to_owned()).or_default() += account.balance;
    }
    totals
}

/// The funding ledger's read for the conservation check: live balances per asset, and every
/// applied journal row and external deposit recorded at or after `since`, all consumed (a
/// record here is visible the moment it is made, so the watermark is the next number).
pub fn funding_read(
    books: &Books,
    since: u64,
    sink: &mut (dyn FnMut(FundingItem) + Send),
) -> FundingRead {
    let mut read = FundingRead {
        balances: totals(books),
        watermark: books.last_tx + 1,
        ..FundingRead::default()
    };
    for ((_, op), e) in &books.journal {
        if e.tx >= since && e.applied {
            read.journal_rows += 1;
            sink(FundingItem::Applied {
                movement: applied(AccountType::Funding, *op, e),
                consumed: true,
            });
        }
    }
    let mut deposits: BTreeMap<String, (Decimal, u64)> = BTreeMap::new();
    for (tx, _, _, asset, amount) in &books.deposits {
        if *tx >= since {
            let d = deposits.entry(asset.as_str().to_owned()).or_default();
            d.0 += *amount;
            d.1 += 1;
            read.deposit_rows += 1;
        }
    }
    for (asset, (sum, rows)) in deposits {
        sink(FundingItem::Deposits {
            asset,
            sum,
            rows,
            consumed: true,
        });
    }
    read
}

/// spot-core's read for the conservation check: totals per asset and every applied record after
/// journal seq `after_seq`.
pub fn spot_read(
    books: &Books,
    after_seq: u64,
    sink: &mut (dyn FnMut(AppliedMovement) + Send),
) -> SpotRead {
    let mut records = 0;
    for ((_, op), e) in &books.journal {
        if e.tx > after_seq {
            records += 1;
            if e.applied {
                sink(applied(AccountType::Spot, *op, e));
            }
        }
    }
    SpotRead {
        totals: totals(books),
        last_seq: books.last_tx,
        records,
        moved: BTreeMap::new(),
    }
}

/// One user's FUNDING balances in `books`, as the funding ledger lists them.
pub fn funding_balances(books: &Books, user: UserId) -> Vec<FundingBalance> {
    books
        .accounts
        .iter()
        .filter(|((u, _), _)| *u == user)
        .map(|((_, asset), a)| FundingBalance {
            asset: asset.as_str().to_owned(),
            balance: a.balance,
            status: status_name(a.status).to_owned(),
        })
        .collect()
}

fn lookup(books: &Books, req_id: &ReqId) -> Vec<LookupOp> {
    Operation::ALL
        .into_iter()
        .filter_map(|op| {
            let e = books.journal.get(&(*req_id, op))?;
            Some(LookupOp {
                op: match op {
                    Operation::Withdraw => MovementOp::Withdraw,
                    Operation::Deposit => MovementOp::Deposit,
                    Operation::Refund => MovementOp::Refund,
                },
                user_id: e.movement.user_id.get(),
                asset: e.movement.asset.as_str().to_owned(),
                amount: e.movement.amount.value(),
                outcome: if e.applied {
                    Outcome::Applied
                } else {
                    Outcome::Refused
                },
                code: None,
                seq: e.tx,
            })
        })
        .collect()
}

#[async_trait]
impl FundingBook for MemAccount {
    async fn balances(&self, user: UserId) -> Result<Vec<FundingBalance>, FundingError> {
        Ok(funding_balances(&self.books(), user))
    }

    async fn balance(
        &self,
        user: UserId,
        asset: &AssetSymbol,
    ) -> Result<Option<Decimal>, FundingError> {
        Ok(MemAccount::balance(self, user, asset))
    }

    async fn account_exists(
        &self,
        user: UserId,
        asset: &AssetSymbol,
    ) -> Result<bool, FundingError> {
        Ok(MemAccount::balance(self, user, asset).is_some())
    }

    async fn journal_for(&self, req_id: &ReqId) -> Result<Vec<JournalEntry>, FundingError> {
        Ok(Operation::ALL
            .into_iter()
            .filter_map(|op| {
                let books = self.books();
                let e = books.journal.get(&(*req_id, op))?;
                Some(JournalEntry {
                    operation: op,
                    user_id: e.movement.user_id.as_i64(),
                    asset: e.movement.asset.as_str().to_owned(),
                    amount: e.movement.amount.value(),
                    applied: e.applied,
                    code: e.code.clone(),
                    at: chrono::Utc::now(),
                })
            })
            .collect())
    }

    async fn external_deposit(
        &self,
        external_id: &str,
        user: UserId,
        asset: &AssetSymbol,
        amount: Amount,
    ) -> Result<DepositReceipt, FundingError> {
        let mut books = self.books();
        if let Some((_, _, u, a, m)) = books.deposits.iter().find(|d| d.1 == external_id) {
            if (*u, a, *m) != (user, asset, amount.value()) {
                return Err(FundingError::ExternalIdReused);
            }
            let balance = books
                .accounts
                .get(&(user, asset.clone()))
                .map(|a| a.balance);
            return Ok(DepositReceipt {
                applied_now: false,
                balance: balance.unwrap_or_default(),
            });
        }
        if !books.accounts.contains_key(&(user, asset.clone())) {
            return Err(FundingError::AccountNotFound);
        }
        let tx = books.take_tx();
        books.deposits.push((
            tx,
            external_id.to_owned(),
            user,
            asset.clone(),
            amount.value(),
        ));
        let account = books.accounts.entry((user, asset.clone())).or_default();
        account.balance += amount.value();
        Ok(DepositReceipt {
            applied_now: true,
            balance: account.balance,
        })
    }

    async fn set_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), FundingError> {
        let mut books = self.books();
        let Some(account) = books.accounts.get_mut(&(user, asset.clone())) else {
            return Err(FundingError::AccountNotFound);
        };
        account.status = status_of(status);
        Ok(())
    }

    async fn audit_read(
        &self,
        since: u64,
        sink: &mut (dyn FnMut(FundingItem) + Send),
    ) -> Result<FundingRead, FundingError> {
        Ok(funding_read(&self.books(), since, sink))
    }
}

#[async_trait]
impl SpotBook for MemAccount {
    async fn balances(&self, user: UserId) -> Result<Vec<SpotBalance>, SpotError> {
        Ok(self
            .books()
            .accounts
            .iter()
            .filter(|((u, _), _)| *u == user)
            .map(|((_, asset), a)| SpotBalance {
                asset: asset.as_str().to_owned(),
                available: a.balance,
                status: status_name(a.status).to_owned(),
            })
            .collect())
    }

    async fn lookup_records(&self, req_id: &ReqId) -> Result<Vec<LookupOp>, SpotError> {
        Ok(lookup(&self.books(), req_id))
    }

    async fn record_of(&self, req_id: &str) -> Result<SpotRecord, SpotError> {
        let id = ReqId::parse(req_id)
            .map_err(|_| SpotError::Unexpected(format!("not a req_id: {req_id}")))?;
        let books = self.books();
        if crate::horizon::ulid_time_ms(req_id).is_some_and(|ms| ms < books.horizon_ms) {
            return Err(SpotError::Unexpected(
                "REQ_ID_EXPIRED: req_id is older than the idempotency horizon".into(),
            ));
        }
        let applied = Operation::ALL
            .into_iter()
            .filter_map(|op| {
                let e = books.journal.get(&(id, op))?;
                e.applied.then(|| applied(AccountType::Spot, op, e))
            })
            .collect();
        let raw = serde_json::to_value(lookup(&books, &id)).unwrap_or(serde_json::Value::Null);
        Ok(SpotRecord { applied, raw })
    }

    async fn core_status(&self) -> Result<CoreStatus, SpotError> {
        let books = self.books();
        Ok(CoreStatus {
            last_seq: books.last_tx,
            accounts: books.accounts.len() as u64,
            horizon_ms: books.horizon_ms,
            ..CoreStatus::default()
        })
    }

    async fn set_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), SpotError> {
        MemAccount::set_status(self, user, asset, status_of(status));
        Ok(())
    }

    async fn advance_horizon(&self, before_ms: u64) -> Result<CoreStatus, SpotError> {
        {
            let mut books = self.books();
            books.horizon_ms = books.horizon_ms.max(before_ms);
        }
        SpotBook::core_status(self).await
    }

    async fn audit_read(
        &self,
        after_seq: u64,
        sink: &mut (dyn FnMut(AppliedMovement) + Send),
    ) -> Result<SpotRead, SpotReadError> {
        Ok(spot_read(&self.books(), after_seq, sink))
    }

    async fn retain(&self, _after_seq: u64) -> Result<Option<CoreStatus>, SpotError> {
        Ok(None)
    }
}
