//! An account system in memory, FUNDING-like (the rules of `funding_fresh_movements`, migration
//! 0014, and the journal answers of `adapters::funding`): each (req_id, operation) is decided
//! once and recorded in a journal, so a repeat answers the first decision; a refusal is
//! recorded for good; a refund needs an applied withdraw of the same movement; `lookup` reads
//! the journal and `cancel` records `CANCELLED` for an undecided key. Serves SPOT too, where a
//! deposit opens a missing account. Every call is logged, and faults armed at a `Call` refuse,
//! lose, or crash it. The decision and the journal's answers (`decide`, `record`, `cancel`) are
//! functions of the `Books`, so the simulation's funding ledger (`sim`) decides by them too,
//! behind its own network faults.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use domain::{
    AccountPort, AccountType, AdapterOutcome, AssetSymbol, Movement, Operation, Recorded, ReqId,
    UserId,
};
use rust_decimal::Decimal;

use crate::testkit::exec::YieldOnce;
use crate::testkit::faults::{crash, AccountFault, Call, Script};

/// An account's status, as the account system checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Status {
    #[default]
    Active,
    /// Refuses withdraws (`ACCOUNT_FROZEN`); deposits and refunds still land.
    Frozen,
    /// Refuses withdraws and deposits (`ACCOUNT_DISABLED`).
    Disabled,
}

/// One user's balance of one asset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Account {
    pub balance: Decimal,
    pub status: Status,
}

/// One decided (req_id, operation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub movement: Movement,
    /// The transaction (FUNDING) or journal seq (SPOT) that recorded it (`Books::take_tx`).
    pub tx: u64,
    /// Applied; otherwise refused with `code`.
    pub applied: bool,
    pub code: Option<String>,
}

/// What the account system holds: what survives a crash of the ledger's processes.
#[derive(Debug, Default)]
pub struct Books {
    pub accounts: BTreeMap<(UserId, AssetSymbol), Account>,
    pub journal: BTreeMap<(ReqId, Operation), Entry>,
    /// Every call that reached the port, in order.
    pub calls: Vec<(Call, ReqId)>,
    /// External deposits: (transaction, external id, user, asset, amount).
    pub deposits: Vec<(u64, String, UserId, AssetSymbol, Decimal)>,
    /// The last transaction number (FUNDING) or journal seq (SPOT) given.
    pub last_tx: u64,
    /// SPOT's idempotency horizon (Unix ms; 0: none): the records of older req_ids are
    /// forgotten, and `record_of` refuses them as spot-core does (REQ_ID_EXPIRED).
    pub horizon_ms: u64,
}

impl Books {
    /// A new record's transaction number (or seq).
    pub fn take_tx(&mut self) -> u64 {
        self.last_tx += 1;
        self.last_tx
    }
}

/// An account system in memory. Cheap to clone; clones share the books and the faults.
#[derive(Debug, Clone)]
pub struct MemAccount {
    account_type: AccountType,
    books: Arc<Mutex<Books>>,
    pub faults: Script<Call, AccountFault>,
}

impl MemAccount {
    /// An empty account system serving `account_type`.
    pub fn new(account_type: AccountType) -> Self {
        Self {
            account_type,
            books: Arc::default(),
            faults: Script::default(),
        }
    }

    /// The books, locked.
    pub fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens (or sets) `user`'s account of `asset` with `balance`.
    pub fn open(&self, user: UserId, asset: &AssetSymbol, balance: Decimal) {
        let mut books = self.books();
        let account = books.accounts.entry((user, asset.clone())).or_default();
        account.balance = balance;
    }

    /// Sets the status of `user`'s account of `asset` (opened empty if missing).
    pub fn set_status(&self, user: UserId, asset: &AssetSymbol, status: Status) {
        self.books()
            .accounts
            .entry((user, asset.clone()))
            .or_default()
            .status = status;
    }

    /// `user`'s balance of `asset`, if the account exists.
    pub fn balance(&self, user: UserId, asset: &AssetSymbol) -> Option<Decimal> {
        self.books()
            .accounts
            .get(&(user, asset.clone()))
            .map(|a| a.balance)
    }

    /// The calls that reached the port so far.
    pub fn calls(&self) -> Vec<(Call, ReqId)> {
        self.books().calls.clone()
    }

    /// How many times `operation` of `req_id` was applied: 0 or 1 (the journal's key).
    pub fn applied(&self, req_id: ReqId, operation: Operation) -> bool {
        self.books()
            .journal
            .get(&(req_id, operation))
            .is_some_and(|e| e.applied)
    }

    /// Decides `operation` of `movement` as it arrives, unless a refusal is forced.
    pub fn decide(&self, operation: Operation, movement: &Movement, refuse: Option<String>) {
        decide(
            &mut self.books(),
            self.account_type,
            operation,
            movement,
            refuse,
        );
    }

    async fn movement(&self, operation: Operation, movement: &Movement) -> AdapterOutcome {
        let call = Call::of(operation);
        self.books().calls.push((call, movement.req_id));
        let fault = self.faults.take(call);
        let refuse = match fault {
            Some(AccountFault::CrashBefore) => return crash().await,
            Some(AccountFault::Pause) => {
                YieldOnce::new().await;
                None
            }
            Some(AccountFault::Unavailable) => {
                return AdapterOutcome::NetworkError("testkit: connection refused".to_owned())
            }
            Some(AccountFault::Refuse(ref code)) => Some(code.clone()),
            _ => None,
        };
        let outcome = decide(
            &mut self.books(),
            self.account_type,
            operation,
            movement,
            refuse,
        );
        match fault {
            Some(AccountFault::AnswerLost) => AdapterOutcome::Timeout,
            Some(AccountFault::CrashAfter) => crash().await,
            _ => outcome,
        }
    }

    async fn read(&self, call: Call, operation: Operation, movement: &Movement) -> Recorded {
        self.books().calls.push((call, movement.req_id));
        let fault = self.faults.take(call);
        match fault {
            Some(AccountFault::CrashBefore) => return crash().await,
            Some(AccountFault::Unavailable) => {
                return Recorded::Unavailable("testkit: no answer".to_owned())
            }
            Some(AccountFault::Pause) => YieldOnce::new().await,
            _ => {}
        }
        let recorded = {
            let mut books = self.books();
            if matches!(call, Call::Cancel(_)) {
                cancel(&mut books, operation, movement);
            }
            record(&books, operation, movement)
        };
        match fault {
            Some(AccountFault::AnswerLost) => Recorded::Unavailable("testkit: lost".to_owned()),
            Some(AccountFault::CrashAfter) => crash().await,
            _ => recorded,
        }
    }
}

/// `cancel`'s effect: an undecided (req_id, operation) is recorded refused with `CANCELLED`; a
/// decided one keeps its decision.
pub fn cancel(books: &mut Books, operation: Operation, movement: &Movement) {
    let key = (movement.req_id, operation);
    if books.journal.contains_key(&key) {
        return;
    }
    let tx = books.take_tx();
    books.journal.entry(key).or_insert_with(|| Entry {
        movement: movement.clone(),
        tx,
        applied: false,
        code: Some("CANCELLED".to_owned()),
    });
}

/// What the journal holds for (req_id, operation), read as `adapters::funding` reads it.
pub fn record(books: &Books, operation: Operation, movement: &Movement) -> Recorded {
    let Some(entry) = books.journal.get(&(movement.req_id, operation)) else {
        return Recorded::NotSeen;
    };
    if entry.movement != *movement {
        return Recorded::Mismatch(format!("{} holds another movement", movement.req_id));
    }
    match &entry.code {
        None => Recorded::Applied,
        Some(code) => Recorded::Refused {
            code: code.clone(),
            message: format!("refused: {code}"),
        },
    }
}

/// Decides one arriving movement: a repeat answers the journal; a fresh one is checked, recorded
/// and applied (or refused with `refuse`'s code).
pub fn decide(
    books: &mut Books,
    account_type: AccountType,
    operation: Operation,
    movement: &Movement,
    refuse: Option<String>,
) -> AdapterOutcome {
    match record(books, operation, movement) {
        Recorded::Applied => return AdapterOutcome::Success,
        Recorded::Refused { code, message } => {
            return AdapterOutcome::ExplicitFail { code, message }
        }
        Recorded::Mismatch(why) => return AdapterOutcome::Mismatch(why),
        Recorded::NotSeen | Recorded::Unavailable(_) => {}
    }
    let key = (movement.user_id, movement.asset.clone());
    let refusal = refuse.or_else(|| refusal(books, account_type, operation, movement));
    let tx = books.take_tx();
    books.journal.insert(
        (movement.req_id, operation),
        Entry {
            movement: movement.clone(),
            tx,
            applied: refusal.is_none(),
            code: refusal.clone(),
        },
    );
    if let Some(code) = refusal {
        return AdapterOutcome::ExplicitFail {
            message: format!("refused: {code}"),
            code,
        };
    }
    let account = books.accounts.entry(key).or_default();
    match operation {
        Operation::Withdraw => account.balance -= movement.amount.value(),
        Operation::Deposit | Operation::Refund => account.balance += movement.amount.value(),
    }
    AdapterOutcome::Success
}

/// The account system's own refusal of a fresh movement, if any.
fn refusal(
    books: &Books,
    account_type: AccountType,
    operation: Operation,
    movement: &Movement,
) -> Option<String> {
    let account = books
        .accounts
        .get(&(movement.user_id, movement.asset.clone()));
    let code = match (operation, account) {
        (Operation::Withdraw, None) => "SOURCE_ACCOUNT_NOT_FOUND",
        (Operation::Withdraw, Some(a)) if a.status == Status::Frozen => "ACCOUNT_FROZEN",
        (Operation::Withdraw | Operation::Deposit, Some(a)) if a.status == Status::Disabled => {
            "ACCOUNT_DISABLED"
        }
        (Operation::Withdraw, Some(a)) if a.balance < movement.amount.value() => {
            "INSUFFICIENT_BALANCE"
        }
        // SPOT opens a missing account on a deposit; FUNDING's accounts exist beforehand.
        (Operation::Deposit, None) if account_type == AccountType::Funding => {
            "TARGET_ACCOUNT_NOT_FOUND"
        }
        (Operation::Refund, _) => {
            let withdrawn = books
                .journal
                .get(&(movement.req_id, Operation::Withdraw))
                .is_some_and(|e| e.applied && e.movement == *movement);
            if account.is_some() && withdrawn {
                return None;
            }
            "NO_MATCHING_WITHDRAW"
        }
        _ => return None,
    };
    Some(code.to_owned())
}

#[async_trait]
impl AccountPort for MemAccount {
    fn account_type(&self) -> AccountType {
        self.account_type
    }

    async fn withdraw(&self, movement: &Movement) -> AdapterOutcome {
        self.movement(Operation::Withdraw, movement).await
    }

    async fn deposit(&self, movement: &Movement) -> AdapterOutcome {
        self.movement(Operation::Deposit, movement).await
    }

    async fn refund(&self, movement: &Movement) -> AdapterOutcome {
        self.movement(Operation::Refund, movement).await
    }

    async fn lookup(&self, movement: &Movement, operation: Operation) -> Recorded {
        self.read(Call::Lookup(operation), operation, movement)
            .await
    }

    async fn cancel(&self, movement: &Movement, operation: Operation) -> Recorded {
        self.read(Call::Cancel(operation), operation, movement)
            .await
    }
}
