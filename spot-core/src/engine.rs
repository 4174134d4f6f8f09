//! The SPOT account state machine: pure, deterministic, no I/O.
//!
//! `Engine::apply` turns a request into a response plus, for anything that changes durable
//! state, the WAL record to persist. Every state change, whether live or during replay, goes
//! through `Engine::apply_record`, so replaying the WAL rebuilds exactly the state that
//! produced it.
//!
//! Memory follows what is live, not history: accounts, and one compact entry per remembered
//! `(req_id, op)` keyed by the req_id's ULID value. Entries whose ULID is older than the
//! idempotency horizon are forgotten with one split of the ordered map; such req_ids are refused
//! `REQ_ID_EXPIRED` from then on (final, since the horizon never moves backwards). The journal
//! itself is not kept here: it is served from the WAL segments on disk.

use std::collections::{BTreeMap, HashMap};

use rust_decimal::Decimal;

use crate::assets::{Assets, MAX_PRECISION};
use crate::protocol::{
    AccountStatus, BalanceEntry, CoreStatus, HorizonRecord, JournalRecord, LookupOp, MovementOp,
    MovementRecord, MovementRequest, Outcome, RefusalCode, Request, Response, RetainRecord,
    StatusRecord, TotalEntry,
};
use crate::ulid;

/// 10^20: no amount and no balance may exceed it.
pub fn max_amount() -> Decimal {
    Decimal::from_i128_with_scale(100_000_000_000_000_000_000, 0)
}

const MAX_AMOUNT_INT: &str = "100000000000000000000";

/// How far ahead of spot-core's clock a req_id's ULID time may be: a key further in the future
/// would stay above any horizon for that long, i.e. could not expire in time.
pub const MAX_REQ_ID_FUTURE_MS: u64 = 24 * 3600 * 1000;

/// What the engine decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    pub response: Response,
    /// The record to make durable before `response` may be sent; `None` for reads and for
    /// refusals that are not recorded.
    pub record: Option<JournalRecord>,
}

impl Effect {
    fn reply(response: Response) -> Effect {
        Effect {
            response,
            record: None,
        }
    }

    fn refuse(code: RefusalCode) -> Effect {
        Effect::reply(Response::refused(code, false, None))
    }
}

/// A WAL record that cannot have been produced by this engine from the preceding records.
#[derive(Debug, thiserror::Error)]
#[error("WAL record seq {seq} is inconsistent with the records before it: {reason}")]
pub struct ReplayError {
    pub seq: u64,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Account {
    pub(crate) available: Decimal,
    pub(crate) status: AccountStatus,
}

/// What is kept of one recorded `(req_id, op)`: enough to answer a duplicate verbatim, a
/// `lookup`, a `cancel` and a refund's matching check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Remembered {
    pub(crate) user_id: u64,
    pub(crate) seq: u64,
    pub(crate) amount: Decimal,
    /// Balance right after an applied movement; `None` for refusals.
    pub(crate) balance: Option<Decimal>,
    /// Index into `Engine::asset_names`.
    pub(crate) asset: u16,
    /// `encode_outcome` of the outcome and refusal code.
    pub(crate) outcome: u8,
}

/// Key of a remembered record: the req_id's ULID value, then the op. Ordered by creation time.
pub(crate) type Key = (u128, MovementOp);

#[derive(Debug, Clone, PartialEq)]
pub struct Engine {
    pub(crate) assets: Assets,
    /// Every asset symbol met in a record, interned; accounts and remembered records refer to
    /// them by index. Only grows by configured symbols (and any a replayed record names).
    pub(crate) asset_names: Vec<String>,
    pub(crate) asset_ids: HashMap<String, u16>,
    pub(crate) accounts: BTreeMap<(u64, u16), Account>,
    /// Sum of `available` per asset index, kept up to date so `totals` is cheap.
    pub(crate) totals: BTreeMap<u16, Decimal>,
    pub(crate) last_seq: u64,
    /// Idempotency horizon, Unix ms: req_ids created before it are forgotten and refused.
    pub(crate) horizon_ms: u64,
    /// The conservation check's consumed position (`retain`).
    pub(crate) retain_after: u64,
    pub(crate) remembered: BTreeMap<Key, Remembered>,
}

impl Engine {
    pub fn new(assets: Assets) -> Engine {
        Engine {
            assets,
            asset_names: Vec::new(),
            asset_ids: HashMap::new(),
            accounts: BTreeMap::new(),
            totals: BTreeMap::new(),
            last_seq: 0,
            horizon_ms: 0,
            retain_after: 0,
            remembered: BTreeMap::new(),
        }
    }

    /// Seq of the newest record (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    pub fn horizon_ms(&self) -> u64 {
        self.horizon_ms
    }

    pub fn retain_after(&self) -> u64 {
        self.retain_after
    }

    /// `(req_id, op)` records remembered in RAM.
    pub fn remembered(&self) -> usize {
        self.remembered.len()
    }

    /// Available balance and status of one account, if it exists.
    pub fn account(&self, user_id: u64, asset: &str) -> Option<(Decimal, AccountStatus)> {
        let id = *self.asset_ids.get(asset)?;
        self.accounts
            .get(&(user_id, id))
            .map(|a| (a.available, a.status))
    }

    /// The counters this engine knows; the storage fields are left for the WAL layer to fill.
    pub fn core_status(&self) -> CoreStatus {
        CoreStatus {
            last_seq: self.last_seq,
            horizon_ms: self.horizon_ms,
            retain_after: self.retain_after,
            remembered: self.remembered.len() as u64,
            accounts: self.accounts.len() as u64,
            ..CoreStatus::default()
        }
    }

    fn core_response(&self) -> Response {
        Response::Ok {
            ops: None,
            balances: None,
            totals: None,
            records: None,
            core: Some(self.core_status()),
        }
    }

    /// Decide a request with spot-core's clock.
    pub fn apply(&mut self, req: &Request) -> Effect {
        self.apply_at(req, ulid::now_ms())
    }

    /// Decide a request as at `now_ms` (Unix ms; only `advance_horizon` and the req_id's
    /// future check read it). State changes only through the returned record, which is already
    /// applied to memory; the caller must make it durable before sending the response.
    /// `journal` is not answered here (the engine keeps no records): the WAL layer serves it.
    pub fn apply_at(&mut self, req: &Request, now_ms: u64) -> Effect {
        match req {
            Request::Withdraw(m) => self.movement(MovementOp::Withdraw, m, now_ms),
            Request::Deposit(m) => self.movement(MovementOp::Deposit, m, now_ms),
            Request::Refund(m) => self.movement(MovementOp::Refund, m, now_ms),
            Request::SetStatus {
                user_id,
                asset,
                status,
            } => self.set_status(*user_id, asset, *status),
            Request::Lookup { req_id } => self.lookup(req_id, now_ms),
            Request::Balances { user_id } => Effect::reply(Response::Ok {
                ops: None,
                balances: Some(self.balances(*user_id)),
                totals: None,
                records: None,
                core: None,
            }),
            Request::Totals {} => Effect::reply(Response::Ok {
                ops: None,
                balances: None,
                totals: Some(self.totals()),
                records: None,
                core: None,
            }),
            Request::Journal { .. } => Effect::reply(Response::bad_request(
                "journal is served from the WAL, not by the engine",
            )),
            Request::Cancel {
                req_id,
                movement,
                user_id,
                asset,
                amount,
            } => self.cancel(
                *movement,
                &MovementRequest {
                    req_id: req_id.clone(),
                    user_id: *user_id,
                    asset: asset.clone(),
                    amount: amount.clone(),
                },
                now_ms,
            ),
            // The server answers `hello` itself; a token check has no meaning here.
            Request::Ping {} | Request::Hello { .. } => Effect::reply(Response::ok()),
            Request::AdvanceHorizon { before_ms } => self.advance_horizon(*before_ms, now_ms),
            Request::Retain { after_seq } => self.retain(*after_seq),
            Request::Status {} => Effect::reply(self.core_response()),
        }
    }

    /// The req_id's ULID value, or the refusal: not canonical or too far in the future
    /// (`INVALID_REQ_ID`), older than the horizon (`REQ_ID_EXPIRED`).
    fn key_of(&self, req_id: &str, now_ms: u64) -> Result<u128, RefusalCode> {
        let id = ulid::parse(req_id).ok_or(RefusalCode::InvalidReqId)?;
        let created = ulid::time_ms(id);
        if created > now_ms.saturating_add(MAX_REQ_ID_FUTURE_MS) {
            return Err(RefusalCode::InvalidReqId);
        }
        if created < self.horizon_ms {
            return Err(RefusalCode::ReqIdExpired);
        }
        Ok(id)
    }

    fn advance_horizon(&mut self, before_ms: u64, now_ms: u64) -> Effect {
        if before_ms > now_ms {
            return Effect::reply(Response::bad_request(format!(
                "before_ms {before_ms} is later than spot-core's clock ({now_ms})"
            )));
        }
        if before_ms <= self.horizon_ms {
            return Effect::reply(self.core_response());
        }
        let record = JournalRecord::Horizon(HorizonRecord {
            seq: self.last_seq + 1,
            before_ms,
        });
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response: self.core_response(),
            record: Some(record),
        }
    }

    fn retain(&mut self, after_seq: u64) -> Effect {
        if after_seq > self.last_seq {
            return Effect::reply(Response::bad_request(format!(
                "after_seq {after_seq} is beyond the last seq {}",
                self.last_seq
            )));
        }
        if after_seq <= self.retain_after {
            return Effect::reply(self.core_response());
        }
        let record = JournalRecord::Retain(RetainRecord {
            seq: self.last_seq + 1,
            after_seq,
        });
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response: self.core_response(),
            record: Some(record),
        }
    }

    /// Settle `(req_id, op)`: when nothing is recorded under that key, record a `CANCELLED`
    /// refusal so every later copy of the movement is refused as a duplicate. Either way the
    /// answer is the one record now standing for the key, shaped like a `lookup` entry, and
    /// left for the caller to compare with the movement it meant (like `lookup`, a record with
    /// other details is reported, not refused).
    fn cancel(&mut self, op: MovementOp, m: &MovementRequest, now_ms: u64) -> Effect {
        let id = match self.key_of(&m.req_id, now_ms) {
            Ok(id) => id,
            Err(code) => return Effect::refuse(code),
        };
        if let Some(first) = self.remembered.get(&(id, op)) {
            return Effect::reply(ops_response(vec![self.lookup_op(op, first)]));
        }
        // The same validations as the movement itself: the record must be one the movement
        // could have produced, and replay checks the amount.
        if !valid_user_id(m.user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        let Some(precision) = self.assets.precision(&m.asset) else {
            return Effect::refuse(RefusalCode::InvalidAsset);
        };
        let amount = match parse_amount(&m.amount, precision) {
            Ok(a) => a,
            Err(code) => return Effect::refuse(code),
        };
        let rec = MovementRecord {
            seq: self.last_seq + 1,
            req_id: m.req_id.clone(),
            user_id: m.user_id,
            asset: m.asset.clone(),
            amount,
            outcome: Outcome::Refused,
            code: Some(RefusalCode::Cancelled),
            balance: None,
        };
        let response = ops_response(vec![LookupOp {
            op,
            user_id: rec.user_id,
            asset: rec.asset.clone(),
            amount: rec.amount,
            outcome: rec.outcome,
            code: rec.code,
            seq: rec.seq,
        }]);
        let record = JournalRecord::from_movement(op, rec);
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response,
            record: Some(record),
        }
    }

    fn movement(&mut self, op: MovementOp, m: &MovementRequest, now_ms: u64) -> Effect {
        let id = match self.key_of(&m.req_id, now_ms) {
            Ok(id) => id,
            Err(code) => return Effect::refuse(code),
        };
        // The idempotency check comes before the other validations on purpose: a retry of
        // something already recorded must get the recorded answer even if the asset config
        // changed since, otherwise a caller could mistake an applied movement for a refusal.
        if let Some(first) = self.remembered.get(&(id, op)) {
            let same = first.user_id == m.user_id
                && self.asset_names[usize::from(first.asset)] == m.asset
                && parse_amount(&m.amount, MAX_PRECISION).is_ok_and(|a| a == first.amount);
            return Effect::reply(if same {
                remembered_response(first, true)
            } else {
                Response::refused(RefusalCode::ReqIdConflict, false, None)
            });
        }
        if !valid_user_id(m.user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        let Some(precision) = self.assets.precision(&m.asset) else {
            return Effect::refuse(RefusalCode::InvalidAsset);
        };
        let amount = match parse_amount(&m.amount, precision) {
            Ok(a) => a,
            Err(code) => return Effect::refuse(code),
        };

        let decision = self.decide(op, id, m, amount);
        let (outcome, code, balance) = match decision {
            Ok(new_balance) => (Outcome::Applied, None, Some(new_balance)),
            Err(code) => (Outcome::Refused, Some(code), None),
        };
        let rec = MovementRecord {
            seq: self.last_seq + 1,
            req_id: m.req_id.clone(),
            user_id: m.user_id,
            asset: m.asset.clone(),
            amount,
            outcome,
            code,
            balance,
        };
        let response = movement_response(&rec, false);
        let record = JournalRecord::from_movement(op, rec);
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response,
            record: Some(record),
        }
    }

    fn account_of(&self, user_id: u64, asset: &str) -> Option<&Account> {
        let id = *self.asset_ids.get(asset)?;
        self.accounts.get(&(user_id, id))
    }

    /// Business rules: the new available balance, or the refusal to record.
    fn decide(
        &self,
        op: MovementOp,
        id: u128,
        m: &MovementRequest,
        amount: Decimal,
    ) -> Result<Decimal, RefusalCode> {
        let account = self.account_of(m.user_id, &m.asset);
        match op {
            MovementOp::Withdraw => {
                let a = account.ok_or(RefusalCode::SourceAccountNotFound)?;
                match a.status {
                    AccountStatus::Frozen => return Err(RefusalCode::AccountFrozen),
                    AccountStatus::Disabled => return Err(RefusalCode::AccountDisabled),
                    AccountStatus::Active => {}
                }
                if a.available < amount {
                    return Err(RefusalCode::InsufficientBalance);
                }
                Ok((a.available - amount).normalize())
            }
            MovementOp::Deposit => {
                if account.is_some_and(|a| a.status == AccountStatus::Disabled) {
                    return Err(RefusalCode::AccountDisabled);
                }
                credit(account.map_or(Decimal::ZERO, |a| a.available), amount)
            }
            MovementOp::Refund => {
                // Status is ignored: a refund puts money back where it was taken from.
                let matching = self
                    .remembered
                    .get(&(id, MovementOp::Withdraw))
                    .is_some_and(|w| {
                        w.outcome == APPLIED
                            && w.user_id == m.user_id
                            && self.asset_names[usize::from(w.asset)] == m.asset
                            && w.amount == amount
                    });
                if !matching {
                    return Err(RefusalCode::NoMatchingWithdraw);
                }
                credit(account.map_or(Decimal::ZERO, |a| a.available), amount)
            }
        }
    }

    fn set_status(&mut self, user_id: u64, asset: &str, status: AccountStatus) -> Effect {
        if !valid_user_id(user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        if self.assets.precision(asset).is_none() {
            return Effect::refuse(RefusalCode::InvalidAsset);
        }
        let record = JournalRecord::SetStatus(StatusRecord {
            seq: self.last_seq + 1,
            user_id,
            asset: asset.to_string(),
            status,
        });
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response: Response::ok(),
            record: Some(record),
        }
    }

    /// Every op recorded under `req_id`; `REQ_ID_EXPIRED` (never an empty list) when the
    /// req_id is older than the horizon, since its records may have been forgotten.
    fn lookup(&self, req_id: &str, now_ms: u64) -> Effect {
        let id = match self.key_of(req_id, now_ms) {
            Ok(id) => id,
            Err(code) => return Effect::refuse(code),
        };
        let ops = self
            .remembered
            .range((id, MovementOp::Withdraw)..=(id, MovementOp::Refund))
            .map(|((_, op), r)| self.lookup_op(*op, r))
            .collect();
        Effect::reply(ops_response(ops))
    }

    fn lookup_op(&self, op: MovementOp, r: &Remembered) -> LookupOp {
        let (outcome, code) = decode_outcome(r.outcome);
        LookupOp {
            op,
            user_id: r.user_id,
            asset: self.asset_names[usize::from(r.asset)].clone(),
            amount: r.amount,
            outcome,
            code,
            seq: r.seq,
        }
    }

    pub fn balances(&self, user_id: u64) -> Vec<BalanceEntry> {
        let mut out: Vec<BalanceEntry> = self
            .accounts
            .range((user_id, 0)..=(user_id, u16::MAX))
            .map(|((_, asset), a)| BalanceEntry {
                asset: self.asset_names[usize::from(*asset)].clone(),
                available: a.available,
                status: a.status,
            })
            .collect();
        out.sort_by(|a, b| a.asset.cmp(&b.asset));
        out
    }

    /// Per-asset sum of balances, listing every configured asset even at zero.
    pub fn totals(&self) -> Vec<TotalEntry> {
        let mut all: BTreeMap<&str, Decimal> =
            self.assets.symbols().map(|s| (s, Decimal::ZERO)).collect();
        for (asset, sum) in &self.totals {
            all.insert(&self.asset_names[usize::from(*asset)], *sum);
        }
        all.into_iter()
            .map(|(asset, sum)| TotalEntry {
                asset: asset.to_string(),
                sum: sum.normalize(),
            })
            .collect()
    }

    /// The index of an asset symbol, interning it on first use.
    fn intern(&mut self, asset: &str) -> Result<u16, String> {
        if let Some(id) = self.asset_ids.get(asset) {
            return Ok(*id);
        }
        let id = u16::try_from(self.asset_names.len())
            .map_err(|_| "more than 65536 distinct assets".to_string())?;
        self.asset_names.push(asset.to_string());
        self.asset_ids.insert(asset.to_string(), id);
        Ok(id)
    }

    /// The only way state changes. Checks that `record` follows from the current state
    /// (contiguous seq, arithmetic matches the recorded balance, req_id not below the horizon,
    /// horizon and retain only forward) before touching anything.
    pub fn apply_record(&mut self, record: JournalRecord) -> Result<(), ReplayError> {
        let seq = record.seq();
        let replayed = if seq != self.last_seq + 1 {
            Err(format!("expected seq {}", self.last_seq + 1))
        } else {
            match &record {
                JournalRecord::Horizon(h) => self.replay_horizon(h.before_ms),
                JournalRecord::Retain(r) => self.replay_retain(r.after_seq, seq),
                JournalRecord::SetStatus(s) => self
                    .intern(&s.asset)
                    .map(|asset| self.account_mut(s.user_id, asset).status = s.status),
                JournalRecord::Withdraw(_)
                | JournalRecord::Deposit(_)
                | JournalRecord::Refund(_) => match record.as_movement() {
                    Some((op, m)) => self.replay_movement(seq, op, m),
                    None => Err("not a movement".into()),
                },
            }
        };
        replayed.map_err(|reason| ReplayError { seq, reason })?;
        self.last_seq = seq;
        Ok(())
    }

    /// The account, created active and empty when missing.
    fn account_mut(&mut self, user_id: u64, asset: u16) -> &mut Account {
        self.accounts.entry((user_id, asset)).or_insert(Account {
            available: Decimal::ZERO,
            status: AccountStatus::Active,
        })
    }

    fn replay_horizon(&mut self, before_ms: u64) -> Result<(), String> {
        if before_ms <= self.horizon_ms {
            return Err(format!(
                "horizon {} does not move forward from {}",
                before_ms, self.horizon_ms
            ));
        }
        self.horizon_ms = before_ms;
        // Everything created before the horizon goes in one split.
        let keep = self
            .remembered
            .split_off(&(ulid::lower_bound(before_ms), MovementOp::Withdraw));
        self.remembered = keep;
        Ok(())
    }

    fn replay_retain(&mut self, after_seq: u64, seq: u64) -> Result<(), String> {
        if after_seq <= self.retain_after || after_seq >= seq {
            return Err(format!(
                "retain {} does not move forward from {} or is not before its own seq",
                after_seq, self.retain_after
            ));
        }
        self.retain_after = after_seq;
        Ok(())
    }

    /// A recorded movement, checked whole (key, horizon, amount, outcome, balance arithmetic)
    /// before anything changes.
    fn replay_movement(
        &mut self,
        seq: u64,
        op: MovementOp,
        m: &MovementRecord,
    ) -> Result<(), String> {
        let Some(id) = ulid::parse(&m.req_id) else {
            return Err(format!("req_id {} is not a ULID", m.req_id));
        };
        if ulid::time_ms(id) < self.horizon_ms {
            return Err(format!(
                "req_id {} is older than the horizon {}",
                m.req_id, self.horizon_ms
            ));
        }
        if self.remembered.contains_key(&(id, op)) {
            return Err(format!("second {} for req_id {}", op.as_str(), m.req_id));
        }
        if m.amount <= Decimal::ZERO || m.amount > max_amount() {
            return Err("invalid amount".into());
        }
        let outcome = match (m.outcome, m.code, m.balance) {
            (Outcome::Refused, Some(code), None) => encode_outcome(Some(code)),
            (Outcome::Applied, None, Some(_)) => APPLIED,
            _ => return Err("outcome, code and balance disagree".into()),
        };
        // Check everything before changing anything (interning included).
        let new_balance = self.replayed_balance(op, m)?;
        let asset = self.intern(&m.asset)?;
        if let Some(new) = new_balance {
            let total = self.totals.entry(asset).or_insert(Decimal::ZERO);
            *total = if op == MovementOp::Withdraw {
                *total - m.amount
            } else {
                *total + m.amount
            };
            self.account_mut(m.user_id, asset).available = new.normalize();
        }
        let remembered = Remembered {
            user_id: m.user_id,
            seq,
            amount: m.amount,
            balance: m.balance,
            asset,
            outcome,
        };
        self.remembered.insert((id, op), remembered);
        Ok(())
    }

    /// The balance an applied movement leaves, checked against the one it recorded (none for a
    /// refusal).
    fn replayed_balance(
        &self,
        op: MovementOp,
        m: &MovementRecord,
    ) -> Result<Option<Decimal>, String> {
        let Some(recorded) = m.balance else {
            return Ok(None);
        };
        let current = self
            .asset_ids
            .get(&m.asset)
            .and_then(|a| self.accounts.get(&(m.user_id, *a)))
            .map(|a| a.available);
        let new = match (op, current) {
            (MovementOp::Withdraw, Some(cur)) if cur >= m.amount => cur - m.amount,
            (MovementOp::Withdraw, _) => return Err("withdraw exceeds the balance".into()),
            (MovementOp::Refund, None) => return Err("refund into a missing account".into()),
            (_, cur) => match credit(cur.unwrap_or(Decimal::ZERO), m.amount) {
                Ok(v) => v,
                Err(_) => return Err("credit exceeds 10^20".into()),
            },
        };
        if new != recorded {
            return Err(format!("computed balance {new} but recorded {recorded}"));
        }
        Ok(Some(new))
    }
}

/// `Remembered::outcome` of an applied movement.
pub(crate) const APPLIED: u8 = 0;

/// Every refusal code that can be recorded, by its stored number (`index + 1`). Append only:
/// snapshots store these numbers.
const RECORDED_CODES: [RefusalCode; 14] = [
    RefusalCode::InvalidReqId,
    RefusalCode::InvalidUserId,
    RefusalCode::InvalidAsset,
    RefusalCode::InvalidAmount,
    RefusalCode::PrecisionOverflow,
    RefusalCode::Overflow,
    RefusalCode::ReqIdConflict,
    RefusalCode::SourceAccountNotFound,
    RefusalCode::AccountFrozen,
    RefusalCode::AccountDisabled,
    RefusalCode::InsufficientBalance,
    RefusalCode::NoMatchingWithdraw,
    RefusalCode::Cancelled,
    RefusalCode::ReqIdExpired,
];

pub(crate) fn encode_outcome(code: Option<RefusalCode>) -> u8 {
    match code {
        None => APPLIED,
        Some(code) => {
            let i = RECORDED_CODES
                .iter()
                .position(|c| *c == code)
                .expect("every refusal code is listed");
            u8::try_from(i + 1).expect("fewer than 255 codes")
        }
    }
}

/// The outcome and code of a stored number; `None` for a number no version wrote.
pub(crate) fn try_decode_outcome(n: u8) -> Option<(Outcome, Option<RefusalCode>)> {
    if n == APPLIED {
        return Some((Outcome::Applied, None));
    }
    let code = *RECORDED_CODES.get(usize::from(n) - 1)?;
    Some((Outcome::Refused, Some(code)))
}

fn decode_outcome(n: u8) -> (Outcome, Option<RefusalCode>) {
    try_decode_outcome(n).expect("outcome numbers are validated when stored")
}

fn ops_response(ops: Vec<LookupOp>) -> Response {
    Response::Ok {
        ops: Some(ops),
        balances: None,
        totals: None,
        records: None,
        core: None,
    }
}

fn remembered_response(r: &Remembered, duplicate: bool) -> Response {
    match decode_outcome(r.outcome) {
        (Outcome::Applied, _) => Response::Applied {
            balance: r.balance.expect("applied records carry a balance"),
            duplicate,
            seq: r.seq,
        },
        (Outcome::Refused, code) => Response::refused(
            code.expect("refused records carry a code"),
            duplicate,
            Some(r.seq),
        ),
    }
}

fn movement_response(rec: &MovementRecord, duplicate: bool) -> Response {
    match (rec.outcome, rec.code) {
        (Outcome::Applied, _) => Response::Applied {
            balance: rec.balance.expect("applied records carry a balance"),
            duplicate,
            seq: rec.seq,
        },
        (Outcome::Refused, code) => Response::refused(
            code.expect("refused records carry a code"),
            duplicate,
            Some(rec.seq),
        ),
    }
}

fn credit(balance: Decimal, amount: Decimal) -> Result<Decimal, RefusalCode> {
    match balance.checked_add(amount) {
        Some(v) if v <= max_amount() => Ok(v.normalize()),
        _ => Err(RefusalCode::Overflow),
    }
}

/// A req_id is a canonical ULID (see `ulid::parse`).
pub fn valid_req_id(req_id: &str) -> bool {
    ulid::parse(req_id).is_some()
}

pub fn valid_user_id(user_id: u64) -> bool {
    user_id != 0 && user_id <= i64::MAX as u64
}

/// Parse a canonical plain decimal string: digits, optionally `.` and digits; no sign,
/// exponent, whitespace or redundant leading zeros. Trailing fractional zeros are allowed
/// and do not count against `precision`.
pub fn parse_amount(s: &str, precision: u32) -> Result<Decimal, RefusalCode> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || (int.len() > 1 && int.starts_with('0')) {
        return Err(RefusalCode::InvalidAmount);
    }
    let frac = match frac {
        Some(f) if all_digits(f) => f.trim_end_matches('0'),
        Some(_) => return Err(RefusalCode::InvalidAmount),
        None => "",
    };
    if int == "0" && frac.is_empty() {
        return Err(RefusalCode::InvalidAmount);
    }
    if frac.len() > precision.min(MAX_PRECISION) as usize {
        return Err(RefusalCode::PrecisionOverflow);
    }
    if int.len() > MAX_AMOUNT_INT.len()
        || (int.len() == MAX_AMOUNT_INT.len() && (int != MAX_AMOUNT_INT || !frac.is_empty()))
    {
        return Err(RefusalCode::Overflow);
    }
    // At most 21 + 8 digits here, which fits an i128 and Decimal's 96-bit mantissa.
    let mantissa = int
        .bytes()
        .chain(frac.bytes())
        .fold(0i128, |acc, b| acc * 10 + i128::from(b - b'0'));
    Decimal::try_from_i128_with_scale(mantissa, frac.len() as u32)
        .map_err(|_| RefusalCode::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    fn engine() -> Engine {
        Engine::new(Assets::builtin())
    }

    /// Creation time of the test req_ids.
    const T0: u64 = 1_700_000_000_000;

    /// A canonical ULID standing for `label` (created at `T0`); a label that cannot be one
    /// (empty, with a space, longer than a ULID) is passed through, for the validation tests.
    fn id(label: &str) -> String {
        if label.is_empty()
            || label.contains(' ')
            || label.len() > ulid::ULID_LEN
            || !label.is_ascii()
        {
            return label.to_string();
        }
        let h = label.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        ulid::format(ulid::from_parts(T0, u128::from(h)))
    }

    fn mv(op: MovementOp, req_id: &str, user_id: u64, asset: &str, amount: &str) -> Request {
        let body = MovementRequest {
            req_id: id(req_id),
            user_id,
            asset: asset.into(),
            amount: amount.into(),
        };
        match op {
            MovementOp::Withdraw => Request::Withdraw(body),
            MovementOp::Deposit => Request::Deposit(body),
            MovementOp::Refund => Request::Refund(body),
        }
    }

    fn deposit(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
        e.apply(&mv(MovementOp::Deposit, req_id, user, asset, amount))
    }

    fn withdraw(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
        e.apply(&mv(MovementOp::Withdraw, req_id, user, asset, amount))
    }

    fn refund(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
        e.apply(&mv(MovementOp::Refund, req_id, user, asset, amount))
    }

    fn set_status(e: &mut Engine, user: u64, asset: &str, status: AccountStatus) -> Effect {
        e.apply(&Request::SetStatus {
            user_id: user,
            asset: asset.into(),
            status,
        })
    }

    fn code(effect: &Effect) -> Option<RefusalCode> {
        match &effect.response {
            Response::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn applied_balance(effect: &Effect) -> Decimal {
        match &effect.response {
            Response::Applied { balance, .. } => *balance,
            other => panic!("expected applied, got {other:?}"),
        }
    }

    fn balance(e: &Engine, user: u64, asset: &str) -> Option<Decimal> {
        e.account(user, asset).map(|(b, _)| b)
    }

    /// A validation refusal: the right code, nothing recorded, nothing changed.
    fn assert_unrecorded(e: &mut Engine, req: Request, expected: RefusalCode) {
        let before = e.clone();
        let effect = e.apply(&req);
        assert_eq!(code(&effect), Some(expected), "{req:?} → {effect:?}");
        assert!(effect.record.is_none(), "{req:?} must not be recorded");
        assert_eq!(*e, before, "{req:?} must not change state");
    }

    /// A business refusal: the right code, recorded with a seq, balances unchanged.
    fn assert_recorded_refusal(e: &mut Engine, req: Request, expected: RefusalCode) {
        let balances_before = e.accounts.clone();
        let effect = e.apply(&req);
        assert_eq!(code(&effect), Some(expected), "{req:?} → {effect:?}");
        let rec = effect.record.expect("business refusals are recorded");
        let (_, m) = rec.as_movement().unwrap();
        assert_eq!((m.outcome, m.code), (Outcome::Refused, Some(expected)));
        assert!(
            matches!(effect.response, Response::Refused { seq: Some(s), duplicate: false, .. } if s == m.seq)
        );
        assert_eq!(e.accounts, balances_before);
    }

    #[test]
    fn amount_parsing_accepts_only_canonical_plain_decimals() {
        assert_eq!(parse_amount("10.5", 8), Ok(d("10.5")));
        assert_eq!(parse_amount("10.50", 8), Ok(d("10.5")));
        assert_eq!(parse_amount("0.00000001", 8), Ok(d("0.00000001")));
        assert_eq!(parse_amount("1.000000000000", 2), Ok(d("1")));
        assert_eq!(parse_amount("100000000000000000000", 8), Ok(max_amount()));
        assert_eq!(
            parse_amount("99999999999999999999.99999999", 8),
            Ok(d("99999999999999999999.99999999"))
        );
        for bad in [
            "", "0", "0.0", "00.5", "01", "-1", "+1", "1e5", "1E5", " 1", "1 ", "1.", ".5",
            "1.2.3", "abc", "1,5", "٣", "0x10", "-0.5", "NaN", "inf",
        ] {
            assert_eq!(
                parse_amount(bad, 8),
                Err(RefusalCode::InvalidAmount),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_amount("0.000000001", 8),
            Err(RefusalCode::PrecisionOverflow)
        );
        assert_eq!(parse_amount("1.5", 0), Err(RefusalCode::PrecisionOverflow));
        assert_eq!(
            parse_amount("100000000000000000000.00000001", 8),
            Err(RefusalCode::Overflow)
        );
        assert_eq!(
            parse_amount("100000000000000000001", 8),
            Err(RefusalCode::Overflow)
        );
        assert_eq!(
            parse_amount("999999999999999999999999999999999999", 8),
            Err(RefusalCode::Overflow)
        );
    }

    #[test]
    fn validation_refusals_are_not_recorded() {
        let mut e = engine();
        deposit(&mut e, "seed", 1, "USDT", "100");
        let w = MovementOp::Withdraw;
        assert_unrecorded(&mut e, mv(w, "", 1, "USDT", "1"), RefusalCode::InvalidReqId);
        assert_unrecorded(
            &mut e,
            mv(w, &"a".repeat(65), 1, "USDT", "1"),
            RefusalCode::InvalidReqId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "bad id", 1, "USDT", "1"),
            RefusalCode::InvalidReqId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "é", 1, "USDT", "1"),
            RefusalCode::InvalidReqId,
        );
        // Not canonical: lowercase, or not a ULID at all (the old free-form ids).
        let mut lower = mv(w, "x", 1, "USDT", "1");
        if let Request::Withdraw(m) = &mut lower {
            m.req_id = m.req_id.to_lowercase();
        }
        assert_unrecorded(&mut e, lower, RefusalCode::InvalidReqId);
        let mut short = mv(w, "x", 1, "USDT", "1");
        if let Request::Withdraw(m) = &mut short {
            m.req_id = "t-1".into();
        }
        assert_unrecorded(&mut e, short, RefusalCode::InvalidReqId);
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 0, "USDT", "1"),
            RefusalCode::InvalidUserId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", i64::MAX as u64 + 1, "USDT", "1"),
            RefusalCode::InvalidUserId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "DOGE", "1"),
            RefusalCode::InvalidAsset,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "usdt", "1"),
            RefusalCode::InvalidAsset,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "-1"),
            RefusalCode::InvalidAmount,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "0"),
            RefusalCode::InvalidAmount,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "1e2"),
            RefusalCode::InvalidAmount,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "0.123456789"),
            RefusalCode::PrecisionOverflow,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "100000000000000000001"),
            RefusalCode::Overflow,
        );
        assert_unrecorded(
            &mut e,
            mv(
                MovementOp::Deposit,
                "r1",
                1,
                "USDT",
                "100000000000000000001",
            ),
            RefusalCode::Overflow,
        );
        assert_unrecorded(
            &mut e,
            Request::SetStatus {
                user_id: 0,
                asset: "USDT".into(),
                status: AccountStatus::Frozen,
            },
            RefusalCode::InvalidUserId,
        );
        assert_unrecorded(
            &mut e,
            Request::SetStatus {
                user_id: 1,
                asset: "DOGE".into(),
                status: AccountStatus::Frozen,
            },
            RefusalCode::InvalidAsset,
        );
        assert_unrecorded(
            &mut e,
            Request::Lookup {
                req_id: "no good".into(),
            },
            RefusalCode::InvalidReqId,
        );
        assert_unrecorded(
            &mut e,
            Request::Lookup {
                req_id: id("r1").to_lowercase(),
            },
            RefusalCode::InvalidReqId,
        );
        // The req_id stays free after a validation refusal.
        assert_eq!(
            applied_balance(&withdraw(&mut e, "r1", 1, "USDT", "1")),
            d("99")
        );
    }

    #[test]
    fn deposit_creates_the_account_lazily() {
        let mut e = engine();
        assert_eq!(e.balances(5), vec![]);
        let eff = deposit(&mut e, "d1", 5, "BTC", "1.25");
        assert_eq!(
            eff.response,
            Response::Applied {
                balance: d("1.25"),
                duplicate: false,
                seq: 1
            }
        );
        assert!(matches!(eff.record, Some(JournalRecord::Deposit(_))));
        assert_eq!(
            e.balances(5),
            vec![BalanceEntry {
                asset: "BTC".into(),
                available: d("1.25"),
                status: AccountStatus::Active
            }]
        );
    }

    #[test]
    fn withdraw_refusals_in_order() {
        let mut e = engine();
        let w = |id: &str, amount: &str| mv(MovementOp::Withdraw, id, 1, "USDT", amount);
        assert_recorded_refusal(&mut e, w("w1", "1"), RefusalCode::SourceAccountNotFound);
        // A refused withdraw does not create the account.
        assert_eq!(e.account(1, "USDT"), None);
        deposit(&mut e, "d1", 1, "USDT", "10");
        set_status(&mut e, 1, "USDT", AccountStatus::Frozen);
        assert_recorded_refusal(&mut e, w("w2", "100"), RefusalCode::AccountFrozen);
        set_status(&mut e, 1, "USDT", AccountStatus::Disabled);
        assert_recorded_refusal(&mut e, w("w3", "100"), RefusalCode::AccountDisabled);
        set_status(&mut e, 1, "USDT", AccountStatus::Active);
        assert_recorded_refusal(
            &mut e,
            w("w4", "10.00000001"),
            RefusalCode::InsufficientBalance,
        );
        assert_eq!(applied_balance(&e.apply(&w("w5", "10"))), Decimal::ZERO);
        assert_eq!(balance(&e, 1, "USDT"), Some(Decimal::ZERO));
    }

    #[test]
    fn deposit_status_rules() {
        let mut e = engine();
        set_status(&mut e, 2, "ETH", AccountStatus::Frozen);
        assert_eq!(
            e.account(2, "ETH"),
            Some((Decimal::ZERO, AccountStatus::Frozen))
        );
        // A frozen account may still receive.
        assert_eq!(
            applied_balance(&deposit(&mut e, "d1", 2, "ETH", "3")),
            d("3")
        );
        set_status(&mut e, 2, "ETH", AccountStatus::Disabled);
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Deposit, "d2", 2, "ETH", "1"),
            RefusalCode::AccountDisabled,
        );
        assert_eq!(balance(&e, 2, "ETH"), Some(d("3")));
    }

    #[test]
    fn resulting_balance_overflow_is_a_recorded_refusal() {
        let mut e = engine();
        assert_eq!(
            applied_balance(&deposit(&mut e, "d1", 3, "BTC", "100000000000000000000")),
            max_amount()
        );
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Deposit, "d2", 3, "BTC", "0.00000001"),
            RefusalCode::Overflow,
        );
        withdraw(&mut e, "w1", 3, "BTC", "1");
        // The recorded refusal sticks even though the deposit would fit now.
        let again = deposit(&mut e, "d2", 3, "BTC", "0.00000001");
        assert!(matches!(
            again.response,
            Response::Refused {
                code: RefusalCode::Overflow,
                duplicate: true,
                ..
            }
        ));
    }

    #[test]
    fn duplicate_withdraw_returns_first_result_and_debits_once() {
        let mut e = engine();
        deposit(&mut e, "d1", 1, "USDT", "100");
        let first = withdraw(&mut e, "t1", 1, "USDT", "30");
        assert_eq!(
            first.response,
            Response::Applied {
                balance: d("70"),
                duplicate: false,
                seq: 2
            }
        );
        withdraw(&mut e, "t2", 1, "USDT", "5");
        let before = e.clone();
        // Same request, and an equal amount spelled differently.
        for amount in ["30", "30.000"] {
            let dup = withdraw(&mut e, "t1", 1, "USDT", amount);
            assert_eq!(
                dup.response,
                Response::Applied {
                    balance: d("70"),
                    duplicate: true,
                    seq: 2
                }
            );
            assert!(dup.record.is_none());
        }
        assert_eq!(e, before);
        assert_eq!(balance(&e, 1, "USDT"), Some(d("65")));
    }

    #[test]
    fn duplicate_deposit_credits_once() {
        let mut e = engine();
        let first = deposit(&mut e, "d1", 1, "ETH", "2.5");
        let dup = deposit(&mut e, "d1", 1, "ETH", "2.5");
        assert_eq!(
            dup.response,
            Response::Applied {
                balance: d("2.5"),
                duplicate: true,
                seq: 1
            }
        );
        assert!(matches!(
            first.response,
            Response::Applied {
                duplicate: false,
                ..
            }
        ));
        assert_eq!(balance(&e, 1, "ETH"), Some(d("2.5")));
        assert_eq!(e.last_seq(), 1);
    }

    #[test]
    fn duplicate_refusal_is_returned_even_when_it_would_now_succeed() {
        let mut e = engine();
        deposit(&mut e, "d1", 1, "USDT", "5");
        let first = withdraw(&mut e, "w1", 1, "USDT", "10");
        assert_eq!(code(&first), Some(RefusalCode::InsufficientBalance));
        deposit(&mut e, "d2", 1, "USDT", "100");
        let dup = withdraw(&mut e, "w1", 1, "USDT", "10");
        assert_eq!(
            dup.response,
            Response::refused(RefusalCode::InsufficientBalance, true, Some(2))
        );
        assert!(dup.record.is_none());
        assert_eq!(balance(&e, 1, "USDT"), Some(d("105")));
    }

    #[test]
    fn req_id_conflict_changes_nothing() {
        let mut e = engine();
        deposit(&mut e, "d0", 1, "USDT", "100");
        withdraw(&mut e, "t1", 1, "USDT", "10");
        let w = MovementOp::Withdraw;
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 1, "USDT", "11"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 2, "USDT", "10"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 1, "BTC", "10"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 1, "USDT", "1e1"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(MovementOp::Deposit, "d0", 2, "USDT", "100"),
            RefusalCode::ReqIdConflict,
        );
        assert_eq!(e.account(2, "USDT"), None);
        // Another op with the same req_id is a different key.
        assert!(matches!(
            refund(&mut e, "t1", 1, "USDT", "10").response,
            Response::Applied { .. }
        ));
    }

    #[test]
    fn refund_rules() {
        let mut e = engine();
        deposit(&mut e, "d1", 1, "USDT", "100");
        // No withdraw at all.
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Refund, "x1", 1, "USDT", "1"),
            RefusalCode::NoMatchingWithdraw,
        );
        // A refused withdraw cannot be refunded.
        withdraw(&mut e, "big", 1, "USDT", "1000");
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Refund, "big", 1, "USDT", "1000"),
            RefusalCode::NoMatchingWithdraw,
        );
        // Mismatched user, asset or amount.
        withdraw(&mut e, "t1", 1, "USDT", "40");
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Refund, "t2", 1, "USDT", "40"),
            RefusalCode::NoMatchingWithdraw,
        );
        let mut probe = e.clone();
        assert_recorded_refusal(
            &mut probe,
            mv(MovementOp::Refund, "t1", 1, "USDT", "39"),
            RefusalCode::NoMatchingWithdraw,
        );
        let mut probe = e.clone();
        assert_recorded_refusal(
            &mut probe,
            mv(MovementOp::Refund, "t1", 2, "USDT", "40"),
            RefusalCode::NoMatchingWithdraw,
        );
        let mut probe = e.clone();
        assert_recorded_refusal(
            &mut probe,
            mv(MovementOp::Refund, "t1", 1, "BTC", "40"),
            RefusalCode::NoMatchingWithdraw,
        );
        // A refund ignores account status.
        set_status(&mut e, 1, "USDT", AccountStatus::Disabled);
        let r = refund(&mut e, "t1", 1, "USDT", "40");
        assert!(matches!(
            r.response,
            Response::Applied {
                duplicate: false,
                ..
            }
        ));
        assert_eq!(applied_balance(&r), d("100"));
        // And it is idempotent: the second refund gives nothing more back.
        let dup = refund(&mut e, "t1", 1, "USDT", "40");
        assert!(matches!(
            dup.response,
            Response::Applied {
                duplicate: true,
                ..
            }
        ));
        assert_eq!(applied_balance(&dup), d("100"));
        assert_eq!(balance(&e, 1, "USDT"), Some(d("100")));
    }

    #[test]
    fn lookup_reports_every_op_of_a_req_id() {
        let mut e = engine();
        deposit(&mut e, "d1", 7, "USDT", "20");
        withdraw(&mut e, "t1", 7, "USDT", "10.5");
        refund(&mut e, "t1", 7, "USDT", "10.5");
        withdraw(&mut e, "t2", 7, "USDT", "999");
        let Response::Ok { ops: Some(ops), .. } =
            e.apply(&Request::Lookup { req_id: id("t1") }).response
        else {
            panic!("lookup failed")
        };
        assert_eq!(ops.len(), 2);
        assert_eq!(
            (ops[0].op, ops[0].outcome, ops[0].seq, ops[0].amount),
            (MovementOp::Withdraw, Outcome::Applied, 2, d("10.5"))
        );
        assert_eq!(
            (ops[1].op, ops[1].outcome, ops[1].seq),
            (MovementOp::Refund, Outcome::Applied, 3)
        );
        let Response::Ok { ops: Some(ops), .. } =
            e.apply(&Request::Lookup { req_id: id("t2") }).response
        else {
            panic!("lookup failed")
        };
        assert_eq!(
            (ops[0].outcome, ops[0].code),
            (Outcome::Refused, Some(RefusalCode::InsufficientBalance))
        );
        let Response::Ok { ops: Some(ops), .. } = e
            .apply(&Request::Lookup {
                req_id: id("never"),
            })
            .response
        else {
            panic!("lookup failed")
        };
        assert!(ops.is_empty());
    }

    #[test]
    fn balances_totals_and_journal() {
        let mut e = engine();
        deposit(&mut e, "a", 1, "USDT", "1.5");
        deposit(&mut e, "b", 1, "BTC", "2");
        deposit(&mut e, "c", 2, "USDT", "3.5");
        withdraw(&mut e, "d", 2, "USDT", "1");
        set_status(&mut e, 3, "ETH", AccountStatus::Frozen);
        let assets: Vec<_> = e.balances(1).into_iter().map(|b| b.asset).collect();
        assert_eq!(assets, vec!["BTC", "USDT"]);
        assert_eq!(e.balances(4), vec![]);
        assert_eq!(
            e.totals(),
            vec![
                TotalEntry {
                    asset: "BTC".into(),
                    sum: d("2")
                },
                TotalEntry {
                    asset: "ETH".into(),
                    sum: Decimal::ZERO
                },
                TotalEntry {
                    asset: "USDT".into(),
                    sum: d("4")
                },
            ]
        );
    }

    #[test]
    fn replaying_the_records_rebuilds_the_same_engine() {
        let mut e = engine();
        let records: Vec<JournalRecord> = [
            deposit(&mut e, "a", 1, "USDT", "10"),
            withdraw(&mut e, "b", 1, "USDT", "4"),
            withdraw(&mut e, "c", 1, "USDT", "40"),
            refund(&mut e, "b", 1, "USDT", "4"),
            set_status(&mut e, 1, "USDT", AccountStatus::Frozen),
        ]
        .into_iter()
        .filter_map(|effect| effect.record)
        .collect();
        assert_eq!(records.len(), 5);
        let mut r = engine();
        for rec in records {
            r.apply_record(rec).unwrap();
        }
        assert_eq!(r, e);
    }

    #[test]
    fn inconsistent_records_are_rejected() {
        let mut e = engine();
        let rec = deposit(&mut e, "a", 1, "USDT", "10").record.unwrap();
        let mut fresh = engine();
        // Gap in seq.
        let JournalRecord::Deposit(mut m) = rec.clone() else {
            unreachable!()
        };
        m.seq = 2;
        assert!(fresh
            .apply_record(JournalRecord::Deposit(m.clone()))
            .is_err());
        // Wrong balance.
        m.seq = 1;
        m.balance = Some(d("11"));
        assert!(fresh.apply_record(JournalRecord::Deposit(m)).is_err());
        // Withdraw more than there is.
        let JournalRecord::Deposit(m) = rec.clone() else {
            unreachable!()
        };
        assert!(fresh
            .apply_record(JournalRecord::Withdraw(MovementRecord {
                balance: Some(d("-10")),
                ..m
            }))
            .is_err());
        assert_eq!(fresh, engine());
        fresh.apply_record(rec.clone()).unwrap();
        // The same (req_id, op) twice.
        let JournalRecord::Deposit(mut m) = rec else {
            unreachable!()
        };
        m.seq = 2;
        m.balance = Some(d("20"));
        assert!(fresh.apply_record(JournalRecord::Deposit(m)).is_err());
    }

    fn cancel(
        e: &mut Engine,
        op: MovementOp,
        req_id: &str,
        user: u64,
        asset: &str,
        amount: &str,
    ) -> Effect {
        e.apply(&Request::Cancel {
            req_id: id(req_id),
            movement: op,
            user_id: user,
            asset: asset.into(),
            amount: amount.into(),
        })
    }

    fn single_op(effect: &Effect) -> LookupOp {
        match &effect.response {
            Response::Ok { ops: Some(ops), .. } if ops.len() == 1 => ops[0].clone(),
            other => panic!("expected one lookup entry, got {other:?}"),
        }
    }

    #[test]
    fn cancel_records_a_refusal_that_every_later_copy_gets() {
        let mut e = engine();
        let mut records = vec![deposit(&mut e, "seed", 1, "USDT", "100").record.unwrap()];
        for op in [
            MovementOp::Withdraw,
            MovementOp::Deposit,
            MovementOp::Refund,
        ] {
            let req_id = format!("c-{}", op.as_str());
            let before = e.accounts.clone();
            let effect = cancel(&mut e, op, &req_id, 1, "USDT", "10.50");
            let rec = effect
                .record
                .clone()
                .expect("a cancel of nothing is recorded");
            records.push(rec.clone());
            let (rec_op, m) = rec.as_movement().unwrap();
            assert_eq!(rec_op, op);
            assert_eq!(
                (m.outcome, m.code, m.balance, m.amount),
                (
                    Outcome::Refused,
                    Some(RefusalCode::Cancelled),
                    None,
                    d("10.5")
                )
            );
            let entry = single_op(&effect);
            assert_eq!(
                entry,
                LookupOp {
                    op,
                    user_id: 1,
                    asset: "USDT".into(),
                    amount: d("10.5"),
                    outcome: Outcome::Refused,
                    code: Some(RefusalCode::Cancelled),
                    seq: m.seq,
                }
            );
            assert_eq!(e.accounts, before);
            // A late copy of the movement gets the recorded refusal, not a fresh decision.
            let late = e.apply(&mv(op, &req_id, 1, "USDT", "10.5"));
            assert!(late.record.is_none());
            assert_eq!(
                late.response,
                Response::refused(RefusalCode::Cancelled, true, Some(m.seq))
            );
            assert_eq!(e.accounts, before);
            // Cancelling again reports the same record and records nothing.
            let again = cancel(&mut e, op, &req_id, 1, "USDT", "10.5");
            assert!(again.record.is_none());
            assert_eq!(single_op(&again), entry);
            // And lookup shows it.
            assert_eq!(
                single_op(&e.apply(&Request::Lookup {
                    req_id: id(&req_id)
                })),
                entry
            );
        }
        // A cancelled withdraw was never applied, so there is nothing to refund.
        let refused = refund(&mut e, "c-withdraw", 1, "USDT", "10.5");
        assert_eq!(code(&refused), Some(RefusalCode::NoMatchingWithdraw));
        records.push(refused.record.unwrap());
        assert_eq!(balance(&e, 1, "USDT"), Some(d("100")));
        let mut r = engine();
        for rec in records {
            r.apply_record(rec).unwrap();
        }
        assert_eq!(r, e);
    }

    #[test]
    fn cancel_of_a_recorded_movement_reports_it_unchanged() {
        let mut e = engine();
        deposit(&mut e, "d", 1, "USDT", "100");
        withdraw(&mut e, "w", 1, "USDT", "30");
        withdraw(&mut e, "poor", 1, "USDT", "1000");
        let state = e.clone();
        let applied = single_op(&cancel(&mut e, MovementOp::Withdraw, "w", 1, "USDT", "30"));
        assert_eq!(
            (applied.outcome, applied.code, applied.seq),
            (Outcome::Applied, None, 2)
        );
        let refused = single_op(&cancel(
            &mut e,
            MovementOp::Withdraw,
            "poor",
            1,
            "USDT",
            "1000",
        ));
        assert_eq!(
            (refused.outcome, refused.code, refused.seq),
            (Outcome::Refused, Some(RefusalCode::InsufficientBalance), 3)
        );
        // Other details: the record is reported as it is, for the caller to compare.
        let other = cancel(&mut e, MovementOp::Withdraw, "w", 2, "BTC", "1");
        assert!(other.record.is_none());
        let other = single_op(&other);
        assert_eq!(
            (other.user_id, other.asset.as_str(), other.amount),
            (1, "USDT", d("30"))
        );
        assert_eq!(e, state);
        // The withdraw stays refundable: cancel settled only (w, withdraw).
        assert_eq!(
            applied_balance(&refund(&mut e, "w", 1, "USDT", "30")),
            d("100")
        );
    }

    #[test]
    fn invalid_cancels_are_refused_and_not_recorded() {
        let mut e = engine();
        let w = MovementOp::Withdraw;
        for (req_id, user, asset, amount, expected) in [
            ("", 1, "USDT", "1", RefusalCode::InvalidReqId),
            ("a b", 1, "USDT", "1", RefusalCode::InvalidReqId),
            ("ok", 0, "USDT", "1", RefusalCode::InvalidUserId),
            ("ok", 1, "DOGE", "1", RefusalCode::InvalidAsset),
            ("ok", 1, "USDT", "0", RefusalCode::InvalidAmount),
            ("ok", 1, "USDT", "1e3", RefusalCode::InvalidAmount),
            (
                "ok",
                1,
                "USDT",
                "0.000000001",
                RefusalCode::PrecisionOverflow,
            ),
            (
                "ok",
                1,
                "USDT",
                "100000000000000000001",
                RefusalCode::Overflow,
            ),
        ] {
            let req = Request::Cancel {
                req_id: id(req_id),
                movement: w,
                user_id: user,
                asset: asset.into(),
                amount: amount.into(),
            };
            assert_unrecorded(&mut e, req, expected);
        }
    }

    fn key_at(ms: u64, n: u128) -> String {
        ulid::format(ulid::from_parts(ms, n))
    }

    fn dep(e: &mut Engine, req_id: &str, amount: &str, now: u64) -> Effect {
        e.apply_at(
            &Request::Deposit(MovementRequest {
                req_id: req_id.into(),
                user_id: 1,
                asset: "USDT".into(),
                amount: amount.into(),
            }),
            now,
        )
    }

    fn horizon(e: &mut Engine, before_ms: u64, now: u64) -> Effect {
        e.apply_at(&Request::AdvanceHorizon { before_ms }, now)
    }

    fn core(effect: &Effect) -> CoreStatus {
        match &effect.response {
            Response::Ok { core: Some(c), .. } => c.clone(),
            other => panic!("expected ok with core, got {other:?}"),
        }
    }

    #[test]
    fn a_req_id_too_far_in_the_future_is_invalid() {
        let mut e = engine();
        let now = T0;
        let ok = key_at(now + MAX_REQ_ID_FUTURE_MS, 1);
        let late = key_at(now + MAX_REQ_ID_FUTURE_MS + 1, 2);
        assert!(matches!(
            dep(&mut e, &ok, "1", now).response,
            Response::Applied { .. }
        ));
        let before = e.clone();
        let r = dep(&mut e, &late, "1", now);
        assert_eq!(code(&r), Some(RefusalCode::InvalidReqId));
        assert!(r.record.is_none());
        assert_eq!(e, before);
        let r = e.apply_at(&Request::Lookup { req_id: late }, now);
        assert_eq!(code(&r), Some(RefusalCode::InvalidReqId));
    }

    #[test]
    fn the_horizon_forgets_older_keys_and_refuses_them_for_good() {
        let mut e = engine();
        let now = T0 + 10_000;
        let old = key_at(T0 + 999, 7);
        let edge = key_at(T0 + 1000, 0);
        let young = key_at(T0 + 5000, 3);
        for k in [&old, &edge, &young] {
            assert!(matches!(
                dep(&mut e, k, "1", now).response,
                Response::Applied { .. }
            ));
        }
        assert_eq!(e.remembered(), 3);
        let h = horizon(&mut e, T0 + 1000, now);
        let rec = h.record.clone().expect("a forward horizon is recorded");
        assert_eq!(
            rec,
            JournalRecord::Horizon(HorizonRecord {
                seq: 4,
                before_ms: T0 + 1000
            })
        );
        let c = core(&h);
        assert_eq!((c.horizon_ms, c.remembered, c.last_seq), (T0 + 1000, 2, 4));
        // The forgotten key: a retry is refused, not applied again; memory does not grow.
        let before = e.clone();
        let retry = dep(&mut e, &old, "1", now);
        assert_eq!(
            retry.response,
            Response::refused(RefusalCode::ReqIdExpired, false, None)
        );
        assert!(retry.record.is_none());
        let cancel = e.apply_at(
            &Request::Cancel {
                req_id: old.clone(),
                movement: MovementOp::Deposit,
                user_id: 1,
                asset: "USDT".into(),
                amount: "1".into(),
            },
            now,
        );
        assert_eq!(code(&cancel), Some(RefusalCode::ReqIdExpired));
        assert!(cancel.record.is_none());
        // lookup never answers "not seen" for it.
        let lookup = e.apply_at(
            &Request::Lookup {
                req_id: old.clone(),
            },
            now,
        );
        assert_eq!(code(&lookup), Some(RefusalCode::ReqIdExpired));
        assert_eq!(e, before);
        assert_eq!(balance(&e, 1, "USDT"), Some(d("3")));
        // The key exactly at the horizon is kept: a duplicate is still answered verbatim.
        let dup = dep(&mut e, &edge, "1", now);
        assert!(matches!(
            dup.response,
            Response::Applied {
                duplicate: true,
                seq: 2,
                ..
            }
        ));
        // A repeated or older horizon changes nothing and records nothing.
        for before_ms in [T0 + 1000, T0 + 10, 0] {
            let same = horizon(&mut e, before_ms, now);
            assert!(same.record.is_none());
            assert_eq!(core(&same).horizon_ms, T0 + 1000);
        }
        assert_eq!(e, before);
        // A horizon in the future of spot-core's clock is a bad request.
        let future = horizon(&mut e, now + 1, now);
        assert!(matches!(future.response, Response::Error { .. }));
        assert!(future.record.is_none());
        assert_eq!(e, before);
    }

    #[test]
    fn retain_moves_forward_only() {
        let mut e = engine();
        deposit(&mut e, "a", 1, "USDT", "1");
        deposit(&mut e, "b", 1, "USDT", "1");
        let r = e.apply(&Request::Retain { after_seq: 3 });
        assert!(matches!(r.response, Response::Error { .. }));
        let r = e.apply(&Request::Retain { after_seq: 2 });
        assert_eq!(
            r.record,
            Some(JournalRecord::Retain(RetainRecord {
                seq: 3,
                after_seq: 2
            }))
        );
        assert_eq!(core(&r).retain_after, 2);
        for after_seq in [2, 1, 0] {
            let again = e.apply(&Request::Retain { after_seq });
            assert!(again.record.is_none());
            assert_eq!(core(&again).retain_after, 2);
        }
        let s = core(&e.apply(&Request::Status {}));
        assert_eq!((s.last_seq, s.remembered, s.accounts), (3, 2, 1));
    }

    #[test]
    fn replay_refuses_a_horizon_or_retain_moving_backwards_and_keys_below_the_horizon() {
        let now = T0 + 10_000;
        let mut e = engine();
        let k = key_at(T0 + 100, 1);
        let mut records = vec![dep(&mut e, &k, "1", now).record.unwrap()];
        records.push(horizon(&mut e, T0 + 500, now).record.unwrap());
        let mut r = engine();
        for rec in records.clone() {
            r.apply_record(rec).unwrap();
        }
        assert_eq!(r, e);
        assert_eq!(r.remembered(), 0);
        let bad = [
            JournalRecord::Horizon(HorizonRecord {
                seq: 3,
                before_ms: T0 + 500,
            }),
            JournalRecord::Horizon(HorizonRecord {
                seq: 3,
                before_ms: T0 + 1,
            }),
            JournalRecord::Retain(RetainRecord {
                seq: 3,
                after_seq: 3,
            }),
            // The key created before the horizon, recorded after it: impossible live.
            {
                let JournalRecord::Deposit(mut m) = records[0].clone() else {
                    unreachable!()
                };
                m.seq = 3;
                m.balance = Some(d("2"));
                JournalRecord::Deposit(m)
            },
        ];
        for rec in bad {
            let mut probe = r.clone();
            assert!(probe.apply_record(rec.clone()).is_err(), "{rec:?}");
            assert_eq!(probe, r, "{rec:?} must change nothing");
        }
    }
}
